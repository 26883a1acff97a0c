#!/usr/bin/env bash
# The GPU check, one prepared script for a machine with an NVIDIA GPU: build, CUDA parity
# tests (REQUIRE_GPU=1: no GPU is a failure), fidelity of the default model on CUDA, the
# decode/prefill benchmark at batch 1/8/64 and the radix-reuse TTFT benchmark. Everything it
# measures goes to $OUT (default target/gpu-check): gpu.txt, parity.log, fidelity.log,
# bench.jsonl, reuse.json, summary.md.
#
#   scripts/gpu-check.sh            (environment: OUT=target/gpu-check REPS=3)
#
# On a GPU machine without a Rust toolchain or network (the lent H200 machines), build here
# with scripts/gpu-pack.sh, carry .gpu/ and run `PREBUILT=.gpu scripts/gpu-check.sh` there:
# the binaries come from .gpu/, NVRTC and cuBLAS from the machine's CUDA installation, and the
# model is the default model's layout filled with random weights (speed only: no fidelity).
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

PREBUILT=${PREBUILT:-}
if [ -n "$PREBUILT" ]; then
  step "prebuilt binaries from $PREBUILT; NVRTC and cuBLAS from the machine"
  # cudarc opens libnvrtc.so / libcublas.so (unversioned) before the CUDA 12 names: link the
  # machine's (any major version) under those names.
  LIBS=/tmp/cachet-culibs; mkdir -p $LIBS
  for lib in nvrtc cublas cublasLt; do
    found=$( (find -L /usr/local/cuda/ -name "lib$lib.so.1[2-9]*" 2>/dev/null; find /usr/local /usr/lib /opt -name "lib$lib.so.1[2-9]*" 2>/dev/null) | head -n 1 || true)
    echo "lib$lib: ${found:-not found}" | tee -a "$OUT/gpu.txt"
    [ -n "$found" ] && ln -sf "$found" "$LIBS/lib$lib.so" && export LD_LIBRARY_PATH="$(dirname "$found"):${LD_LIBRARY_PATH:-}"
  done
  export LD_LIBRARY_PATH="$LIBS:${LD_LIBRARY_PATH:-}"
  CACHET=$PREBUILT/cachet
  MODEL=/tmp/cachet-random-like.gguf
  "$PREBUILT/gguf_skeleton" fill "$PREBUILT/skeleton.gguf" "$MODEL" | tee -a "$OUT/summary.md"
  run_tests() { # test binary (kernels|engine), filter
    timeout 300 "$PREBUILT/test-$1" "$2" --nocapture
  }
else
  step "NVRTC (from target/nvrtc.tar.xz when the machine has no network)"
  export LD_LIBRARY_PATH="$(scripts/nvrtc.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  step "build (release)"
  cargo build -q --release -p cachet-api
  CACHET=target/release/cachet
  MODEL=$($CACHET models pull 2>/dev/null | tail -n 1)
  run_tests() {
    timeout 900 cargo test --release -p "cachet-$1" --test "$1" "$2" -- --nocapture
  }
fi

step "parity tests: every op and a tiny-model forward, CPU vs CUDA"
if REQUIRE_GPU=1 run_tests kernels cuda_parity > "$OUT/parity.log" 2>&1 &&
   REQUIRE_GPU=1 run_tests engine cuda_parity >> "$OUT/parity.log" 2>&1; then
  echo "parity: passed" | tee -a "$OUT/summary.md"
else
  echo "parity: FAILED (see parity.log)" | tee -a "$OUT/summary.md"; status=1
fi
grep -E "^test |test result" "$OUT/parity.log" >> "$OUT/summary.md" || true

if [ -z "$PREBUILT" ]; then
  step "fidelity of the default model on CUDA (vs the transformers fixtures)"
  if REQUIRE_MODEL=1 REQUIRE_GPU=1 run_tests engine fidelity_qwen::cuda_ > "$OUT/fidelity.log" 2>&1; then
    echo "fidelity: passed" | tee -a "$OUT/summary.md"
  else
    echo "fidelity: FAILED (see fidelity.log)" | tee -a "$OUT/summary.md"; status=1
  fi
fi

# REPS rounds of decode and prefill at batch 1/8/64 into $OUT/$1, with CACHET_CUDA_GRAPHS=$2.
bench_rounds() {
  : > "$OUT/$1"
  for _ in $(seq "$REPS"); do
    CACHET_CUDA_GRAPHS=$2 RUST_LOG=warn timeout 300 $CACHET bench --device cuda --model "$MODEL" --prompt 512 \
      --gen 128 --batch 1,8,64 --reps 1 --json >> "$OUT/$1" || status=1
  done
  cat "$OUT/$1" >> "$OUT/summary.md"
}

step "decode and prefill, batch 1/8/64"
bench_rounds bench.jsonl 0

step "the same with CUDA graphs (CACHET_CUDA_GRAPHS=1), for comparison"
bench_rounds bench-graphs.jsonl 1

step "where the time goes (per op: host time, GPU time, GPU idle): decode at batch 1, then prefill 512"
RUST_LOG=warn timeout 120 $CACHET bench --device cuda --model "$MODEL" --prompt 0 --gen 128 --batch 1 --reps 1 --profile \
  > "$OUT/profile.txt" 2>&1 || status=1
echo "-- the same, host time only (no events: the step at its usual speed)" >> "$OUT/profile.txt"
CACHET_CUDA_PROFILE=host RUST_LOG=warn timeout 120 $CACHET bench --device cuda --model "$MODEL" --prompt 0 --gen 128 \
  --batch 1 --reps 1 --profile >> "$OUT/profile.txt" 2>&1 || status=1
RUST_LOG=warn timeout 120 $CACHET bench --device cuda --model "$MODEL" --prompt 512 --gen 0 --reps 1 --profile \
  >> "$OUT/profile.txt" 2>&1 || status=1
cat "$OUT/profile.txt" >> "$OUT/summary.md"

step "the machine's own floor: small kernels launched eagerly vs replayed from a CUDA graph (PyTorch)"
timeout 120 python3 scripts/gpu-launch-overhead.py 390 2>&1 | tail -n 1 | tee -a "$OUT/summary.md" || true

step "prefill through cuBLAS on bf16 weight copies (--cublas-prefill), for comparison"
RUST_LOG=warn timeout 120 $CACHET bench --device cuda --cublas-prefill --model "$MODEL" --prompt 512 --gen 0 --reps "$REPS" --json \
  > "$OUT/bench-cublas.json" || status=1
cat "$OUT/bench-cublas.json" >> "$OUT/summary.md"

step "radix reuse: TTFT with a cached 2,000-token prefix vs cold"
RUST_LOG=warn timeout 120 $CACHET bench --device cuda --model "$MODEL" --reuse 2000 --reps "$REPS" --json > "$OUT/reuse.json" || status=1
cat "$OUT/reuse.json" >> "$OUT/summary.md"

step "done (status $status)"
exit "$status"
