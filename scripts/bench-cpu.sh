#!/usr/bin/env bash
# Side-by-side CPU benchmark of cachet and llama.cpp's llama-bench on the same
# GGUF with the same thread count, alternating the two for REPS rounds and
# reporting medians (these machines are shared: only ratios from one run count).
#
#   scripts/bench-cpu.sh [THREADS=2] [REPS=5] [BATCH=1,4,16] [LEVEL=native|avx2] [MODEL=file.gguf]
#                        [DEPTH=0,4096,16384] [BASE=path/to/another/cachet]
#   (environment; MODEL defaults to the default model)
#
# Needs llama-bench: $LLAMA_BIN, else ~/.cache/cachet-peer/llama.cpp/build/bin,
# else it is built from the llama.cpp checkout at $LLAMA_SRC (scripts/llama-peer.sh).
# Where llama-batched-bench is there too, each round also runs it at the batches above 1
# (one prompt token per sequence, then GEN decode steps of all of them: what `cachet bench
# --batch` measures). LEVEL=avx2 runs cachet with CACHET_SIMD=avx2 against a llama.cpp built
# without AVX-512 (LLAMA_LEVEL=avx2 scripts/llama-peer.sh).
# BASE=path/to/another/cachet runs that build too, in the same rounds (alternating which of the two
# cachet builds goes first), and adds its numbers and this build / BASE to the table: a before /
# after check of a change, beside llama.cpp.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
REPS=${REPS:-5}
BATCH=${BATCH:-1,4,16}
PROMPT=${PROMPT:-512}
GEN=${GEN:-128}
OUT=${OUT:-target/bench-cpu}
LEVEL=${LEVEL:-native}
BASE=${BASE:-}
# Context already in the cache before each test (llama-bench -d, cachet bench --depth): the prompt
# and decode tests at each depth; the batched decode runs at depth 0 only.
DEPTH=${DEPTH:-0}
mkdir -p "$OUT"

BIN=$(LLAMA_LEVEL=$LEVEL scripts/llama-peer.sh)
if [ "$LEVEL" = avx2 ]; then export CACHET_SIMD=avx2; fi
MULTI=$(echo "$BATCH" | tr ',' '\n' | awk '$1 > 1' | paste -sd, -)
MAXB=$(echo "$BATCH" | tr ',' '\n' | sort -n | tail -n 1)
cargo build -q --release -p cachet-api
CACHET=target/release/cachet
MODEL=${MODEL:-$($CACHET models pull 2>/dev/null | tail -n 1)}

: > "$OUT/llama.jsonl"
: > "$OUT/cachet.jsonl"
: > "$OUT/batched.jsonl"
: > "$OUT/base.jsonl"
run_cachet() { # binary, output file
  for d in $(echo "$DEPTH" | tr ',' ' '); do
    batch=$BATCH
    if [ "$d" != 0 ]; then batch=1; fi
    RUST_LOG=warn "$1" bench --model "$MODEL" --threads "$THREADS" --prompt "$PROMPT" --gen "$GEN" \
      --batch "$batch" --depth "$d" --reps 1 --json >> "$2"
  done
}
for rep in $(seq "$REPS"); do
  echo "round $rep/$REPS" >&2
  "$BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p "$PROMPT" -n "$GEN" -d "$DEPTH" -r 1 -o jsonl >> "$OUT/llama.jsonl" 2>/dev/null
  if [ -n "$BASE" ] && [ $((rep % 2)) = 1 ]; then run_cachet "$BASE" "$OUT/base.jsonl"; fi
  run_cachet "$CACHET" "$OUT/cachet.jsonl"
  if [ -n "$BASE" ] && [ $((rep % 2)) = 0 ]; then run_cachet "$BASE" "$OUT/base.jsonl"; fi
  if [ -n "$MULTI" ] && [ -x "$BIN/llama-batched-bench" ]; then
    "$BIN/llama-batched-bench" -m "$MODEL" -t "$THREADS" -c $((MAXB * (GEN + 1) + 16)) -npp 1 -ntg "$GEN" \
      -npl "$MULTI" --output-format jsonl 2>/dev/null | grep '^{' >> "$OUT/batched.jsonl"
  fi
done

python3 - "$OUT" "$THREADS" "$REPS" <<'PY'
import json, statistics, sys
out, threads, reps = sys.argv[1:]
llama, ours, base, read, copy, step, peak, share = {}, {}, {}, [], [], None, [], {}
for line in open(f"{out}/llama.jsonl"):
    r = json.loads(line)
    test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    if r.get("n_depth"):
        test += f" @ d{r['n_depth']}"
    llama.setdefault((test, 1), []).append(r["avg_ts"])
for line in open(f"{out}/batched.jsonl"):
    r = json.loads(line)
    llama.setdefault((f"tg{r['tg']}", r["pl"]), []).append(r["speed_tg"])
for line in open(f"{out}/cachet.jsonl"):
    r = json.loads(line)
    read.append(r["read_gbs"]); copy.append(r["copy_gbs"]); step = r["step_bytes"]
    if r.get("int8_peak_macs_per_second"):
        peak.append(r["int8_peak_macs_per_second"])
    for t in r["tests"]:
        ours.setdefault((t["test"], t["batch"]), []).append(t["tokens_per_second"])
        if t.get("of_int8_peak") is not None and t["test"].startswith("pp"):
            share.setdefault((t["test"], t["batch"]), []).append(t["of_int8_peak"])
for line in open(f"{out}/base.jsonl"):
    for t in json.loads(line)["tests"]:
        base.setdefault((t["test"], t["batch"]), []).append(t["tokens_per_second"])
bw = statistics.median(read)
print(f"{threads} threads, {reps} alternating rounds, medians. Memory bandwidth measured in the same run: "
      f"read {bw:.1f} GB/s, copy {statistics.median(copy):.1f} GB/s; a decode step reads {step / 1e6:.1f} MB of weights, "
      f"so the bandwidth limit is {bw * 1e9 / step:.0f} steps/s." +
      (f" Int8 multiply-add peak (cachet bench, same threads): {min(peak) / 1e9:.0f}–{max(peak) / 1e9:.0f} G/s." if peak else "") + "\n")
extra = " BASE tokens/s | cachet / BASE |" if base else ""
print("| test | sequences | cachet tokens/s | llama.cpp tokens/s | cachet / llama.cpp | cachet decode, % of bandwidth limit; prompt, of int8 peak |" + extra)
print("|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if base else ""))
for key in sorted(ours, key=lambda k: (k[0][:2] != "pp", k[1])):
    c = statistics.median(ours[key])
    l = statistics.median(llama[key]) if key in llama else None
    frac = f"{100 * c / key[1] * step / 1e9 / bw:.0f}%" if key[0].startswith("tg") else ""
    if key in share:
        frac = f"{100 * statistics.median(share[key]):.0f}% of int8 peak"
    lc = f"{l:.1f}" if l else "–"
    ratio = f"{c / l:.2f}×" if l else "–"
    row = f"| {key[0]} | {key[1]} | {c:.1f} | {lc} | {ratio} | {frac} |"
    if base:
        b = statistics.median(base[key]) if key in base else None
        row += f" {b:.1f} | {c / b:.3f}× |" if b else " – | – |"
    print(row)
if any(k[1] > 1 for k in llama):
    print("\nllama.cpp at more than one sequence: llama-batched-bench, one prompt token per sequence, "
          "then the decode steps of all of them (its S_TG, aggregate tokens/s).")
if ("tg128", 1) in llama:
    l = statistics.median(llama[("tg128", 1)])
    print(f"\nllama.cpp decode at the same bandwidth: {100 * l * step / 1e9 / bw:.0f}% of the limit.")
PY
