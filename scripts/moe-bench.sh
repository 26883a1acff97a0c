#!/usr/bin/env bash
# Mixture-of-experts speed on realistic shapes (issue 21): random-weight Qwen3-MoE models with
# Qwen3-Coder-30B-A3B's exact layer shapes (scripts/fixtures/make_moe_shapes.py: transformers
# makes them, llama.cpp's converter and llama-quantize write them as Q4_K_M) but only a few
# layers, then scripts/bench-cpu.sh (cachet bench against llama-bench, alternating rounds,
# medians) on each, and a straight-line extrapolation of the time per token to the real
# model's 48 layers from two layer counts.
#
#   LLAMA_SRC=path/to/llama.cpp scripts/moe-bench.sh      LAYERS="2 4" REPS=5 THREADS=2 LEVEL=native
#
# Needs what scripts/moe-check.sh needs (LLAMA_SRC, a Python environment with torch in
# target/moe-venv or MOE_VENV); the models (1.2 and 1.9 GB) stay in target/moe-shapes/.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
: "${LLAMA_SRC:?set LLAMA_SRC to a llama.cpp checkout (see scripts/moe-check.sh)}"
LAYERS=${LAYERS:-2 4}
export REPS=${REPS:-5}
VENV=$(moe_venv)
BIN=$(LLAMA_SRC=$LLAMA_SRC scripts/llama-peer.sh)
cargo build -q --release -p cachet-api
TOKENIZER=$(target/release/cachet models pull 2>/dev/null | tail -n 1)
mkdir -p target/moe-shapes
OUTS=()
for L in $LAYERS; do
  MODEL=target/moe-shapes/qwen3-coder-30b-a3b-shapes-${L}l-q4_k_m.gguf
  if [ ! -f "$MODEL" ]; then
    echo "== writing $MODEL" >&2
    "$VENV/bin/python" scripts/fixtures/make_moe_shapes.py --llama-src "$LLAMA_SRC" --llama-bin "$BIN" \
      --tokenizer-gguf "$TOKENIZER" --layers "$L" --out "$MODEL" >&2
  fi
  echo "== $L layers" >&2
  MODEL=$MODEL BATCH=1 OUT=target/moe-bench-${L}l scripts/bench-cpu.sh
  OUTS+=("$L:target/moe-bench-${L}l")
done

python3 - "${OUTS[@]}" <<'PY'
import json, statistics, sys
runs = {}
for arg in sys.argv[1:]:
    layers, out = arg.split(":", 1)
    ms = {}
    for side, path in (("cachet", f"{out}/cachet.jsonl"), ("llama.cpp", f"{out}/llama.jsonl")):
        for line in open(path):
            r = json.loads(line)
            rows = r["tests"] if side == "cachet" else [
                {"test": f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}", "batch": 1, "tokens_per_second": r["avg_ts"]}]
            for t in rows:
                if t["batch"] == 1:
                    ms.setdefault((side, t["test"][:2]), []).append(1000.0 / t["tokens_per_second"])
    runs[int(layers)] = {k: statistics.median(v) for k, v in ms.items()}
if len(runs) < 2:
    sys.exit(0)
(l1, a), (l2, b) = sorted(runs.items())[:2]
print(f"\nExtrapolation to 48 layers (a straight line through the {l1}- and {l2}-layer medians of the time per token;"
      " an extrapolation, not a measurement):\n")
print("| test | side | ms per token per layer | ms per token, rest | 48 layers: tokens/s |")
print("|---|---|---:|---:|---:|")
for test in ("pp", "tg"):
    speeds = {}
    for side in ("cachet", "llama.cpp"):
        per_layer = (b[(side, test)] - a[(side, test)]) / (l2 - l1)
        rest = a[(side, test)] - l1 * per_layer
        speeds[side] = 1000.0 / (rest + 48 * per_layer)
        print(f"| {test} | {side} | {per_layer:.3f} | {rest:.3f} | {speeds[side]:.1f} |")
    print(f"| {test} | cachet / llama.cpp | | | {speeds['cachet'] / speeds['llama.cpp']:.2f}× |")
PY
