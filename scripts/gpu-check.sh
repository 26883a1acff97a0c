#!/usr/bin/env bash
# The GPU check, one prepared script for a machine with an NVIDIA GPU: build, CUDA parity
# tests (REQUIRE_GPU=1: no GPU is a failure), fidelity of the default model on CUDA, the
# decode/prefill benchmark at batch 1/8/64 and the radix-reuse TTFT benchmark. Everything it
# measures goes to $OUT (default target/gpu-check): gpu.txt, parity.log, fidelity.log,
# bench.jsonl, reuse.json, summary.md.
#
#   scripts/gpu-check.sh            (environment: OUT=target/gpu-check REPS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/gpu-check}
REPS=${REPS:-3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
status=0
step() { echo "== $*" | tee -a "$OUT/summary.md"; }

: > "$OUT/summary.md"
step "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv || true; } | tee "$OUT/gpu.txt"
{ date -u; uname -a; nproc; } >> "$OUT/gpu.txt"

step "NVRTC (from target/nvrtc.tar.xz when the machine has no network)"
export LD_LIBRARY_PATH="$(scripts/nvrtc.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

step "build (release)"
cargo build -q --release -p cachet-api
CACHET=target/release/cachet
MODEL=$($CACHET models pull 2>/dev/null | tail -n 1)

step "parity tests: every op and a tiny-model forward, CPU vs CUDA"
if REQUIRE_GPU=1 cargo test --release -p cachet-kernels --test kernels cuda_parity -- --nocapture > "$OUT/parity.log" 2>&1 &&
   REQUIRE_GPU=1 cargo test --release -p cachet-engine --test engine cuda_parity -- --nocapture >> "$OUT/parity.log" 2>&1; then
  echo "parity: passed" | tee -a "$OUT/summary.md"
else
  echo "parity: FAILED (see parity.log)" | tee -a "$OUT/summary.md"; status=1
fi

step "fidelity of the default model on CUDA (vs the transformers fixtures)"
if REQUIRE_MODEL=1 REQUIRE_GPU=1 cargo test --release -p cachet-engine --test engine fidelity_qwen::cuda_ -- --nocapture \
    > "$OUT/fidelity.log" 2>&1; then
  echo "fidelity: passed" | tee -a "$OUT/summary.md"
else
  echo "fidelity: FAILED (see fidelity.log)" | tee -a "$OUT/summary.md"; status=1
fi

step "decode and prefill, batch 1/8/64"
: > "$OUT/bench.jsonl"
for _ in $(seq "$REPS"); do
  RUST_LOG=warn $CACHET bench --device cuda --model "$MODEL" --prompt 512 --gen 128 --batch 1,8,64 --reps 1 --json \
    >> "$OUT/bench.jsonl" || status=1
done
cat "$OUT/bench.jsonl" >> "$OUT/summary.md"

step "prefill through cuBLAS on bf16 weight copies (--cublas-prefill), for comparison"
RUST_LOG=warn $CACHET bench --device cuda --cublas-prefill --model "$MODEL" --prompt 512 --gen 0 --reps "$REPS" --json \
  > "$OUT/bench-cublas.json" || status=1
cat "$OUT/bench-cublas.json" >> "$OUT/summary.md"

step "radix reuse: TTFT with a cached 2,000-token prefix vs cold"
RUST_LOG=warn $CACHET bench --device cuda --model "$MODEL" --reuse 2000 --reps "$REPS" --json > "$OUT/reuse.json" || status=1
cat "$OUT/reuse.json" >> "$OUT/summary.md"

step "done (status $status)"
exit "$status"
