#!/usr/bin/env bash
# Prints the folder holding llama.cpp's binaries (llama-server, llama-bench, llama-quantize, and
# llama-batched-bench when built) for the side-by-side scripts: $LLAMA_BIN, else
# ~/.cache/cachet-peer/llama.cpp/build/bin, else it builds them there (CPU only, no AMX) from
# the llama.cpp checkout at $LLAMA_SRC.
#
# LLAMA_LEVEL=avx2 does the same in ~/.cache/cachet-peer/llama.cpp/build-avx2 with AVX-512
# and AVX-VNNI off: the peer of `CACHET_SIMD=avx2`.
set -euo pipefail
LEVEL=${LLAMA_LEVEL:-native}
case "$LEVEL" in
  native) BUILD=$HOME/.cache/cachet-peer/llama.cpp/build ;;
  avx2) BUILD=$HOME/.cache/cachet-peer/llama.cpp/build-avx2 ;;
  *) echo "LLAMA_LEVEL must be native or avx2, not $LEVEL" >&2; exit 1 ;;
esac
if [ "$LEVEL" = native ] && [ -n "${LLAMA_BIN:-}" ]; then
  BIN=$LLAMA_BIN
else
  BIN=$BUILD/bin
fi
if [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-quantize" ]; then
  echo "$BIN"
  exit 0
fi
if [ -z "${LLAMA_SRC:-}" ] || [ ! -f "$LLAMA_SRC/CMakeLists.txt" ]; then
  echo "llama.cpp binaries not found: set LLAMA_BIN to their folder, or LLAMA_SRC to a" >&2
  echo "llama.cpp checkout to build them (needs cmake and a C++ compiler)" >&2
  exit 1
fi
# Not -march=native: where the CPU lists AMX (which faults on these virtual machines) native
# builds use it whatever GGML_AMX_* say. Every SIMD level this CPU has, AMX excepted (and
# AVX-512 and AVX-VNNI too at LLAMA_LEVEL=avx2).
has() { grep -m1 '^flags' /proc/cpuinfo | grep -qw "$1" && echo ON || echo OFF; }
wide() { if [ "$LEVEL" = avx2 ]; then echo OFF; else has "$1"; fi; }
cmake -S "$LLAMA_SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
  -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)" \
  -DGGML_AVX_VNNI="$(wide avx_vnni)" -DGGML_AVX512="$(wide avx512f)" -DGGML_AVX512_VBMI="$(wide avx512vbmi)" \
  -DGGML_AVX512_VNNI="$(wide avx512_vnni)" -DGGML_AVX512_BF16="$(wide avx512_bf16)" >&2
cmake --build "$BUILD" -j "$(nproc)" --target llama-server llama-bench llama-batched-bench llama-quantize llama-perplexity >&2
echo "$BUILD/bin"
