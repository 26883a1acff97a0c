#!/usr/bin/env bash
# Side-by-side CPU benchmark of cachet and llama.cpp's llama-bench on the same
# GGUF with the same thread count, alternating the two for REPS rounds and
# reporting medians (these machines are shared: only ratios from one run count).
#
#   scripts/bench-cpu.sh [THREADS=2] [REPS=5] [BATCH=1,4,16]   (environment variables)
#
# Needs llama-bench: $LLAMA_BIN, else ~/.cache/cachet-peer/llama.cpp/build/bin,
# else it is built with ../shared/peer/build-llama-server.sh when that exists.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
REPS=${REPS:-5}
BATCH=${BATCH:-1,4,16}
PROMPT=${PROMPT:-512}
GEN=${GEN:-128}
OUT=${OUT:-target/bench-cpu}
mkdir -p "$OUT"

BIN=${LLAMA_BIN:-$HOME/.cache/cachet-peer/llama.cpp/build/bin}
if [ ! -x "$BIN/llama-bench" ]; then
  [ -x ../shared/peer/build-llama-server.sh ] || { echo "llama-bench not found; set LLAMA_BIN" >&2; exit 1; }
  BIN=$(../shared/peer/build-llama-server.sh | tail -n 1)
fi
cargo build -q --release -p cachet-api
CACHET=target/release/cachet
MODEL=$($CACHET models pull 2>/dev/null | tail -n 1)

: > "$OUT/llama.jsonl"
: > "$OUT/cachet.jsonl"
for rep in $(seq "$REPS"); do
  echo "round $rep/$REPS" >&2
  "$BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p "$PROMPT" -n "$GEN" -r 1 -o jsonl >> "$OUT/llama.jsonl" 2>/dev/null
  RUST_LOG=warn "$CACHET" bench --model "$MODEL" --threads "$THREADS" --prompt "$PROMPT" --gen "$GEN" \
    --batch "$BATCH" --reps 1 --json >> "$OUT/cachet.jsonl"
done

python3 - "$OUT" "$THREADS" "$REPS" "$PROMPT" "$GEN" <<'PY'
import json, statistics, sys
out, threads, reps, prompt, gen = sys.argv[1:]
llama = {}
for line in open(f"{out}/llama.jsonl"):
    r = json.loads(line)
    test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    llama.setdefault((test, 1), []).append(r["avg_ts"])
ours = {}
for line in open(f"{out}/cachet.jsonl"):
    for t in json.loads(line)["tests"]:
        ours.setdefault((t["test"], t["batch"]), []).append(t["tokens_per_second"])
print(f"{threads} threads, {reps} alternating rounds, medians (tokens/s)\n")
print("| test | sequences | cachet | llama.cpp | cachet / llama.cpp |")
print("|---|---:|---:|---:|---:|")
for key in sorted(ours, key=lambda k: (k[0][:2] != "pp", k[1])):
    c = statistics.median(ours[key])
    l = statistics.median(llama[key]) if key in llama else None
    ratio = f"{c / l:.2f}×" if l else "–"
    print(f"| {key[0]} | {key[1]} | {c:.1f} | {l:.1f} | {ratio} |" if l else f"| {key[0]} | {key[1]} | {c:.1f} | – | – |")
PY
