#!/usr/bin/env bash
# Prints the folder holding llama.cpp's binaries (llama-server, llama-bench) for the
# side-by-side scripts: $LLAMA_BIN, else ~/.cache/cachet-peer/llama.cpp/build/bin, else
# it builds them there (CPU only, no AMX) from the llama.cpp checkout at $LLAMA_SRC.
set -euo pipefail
BIN=${LLAMA_BIN:-$HOME/.cache/cachet-peer/llama.cpp/build/bin}
if [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-bench" ]; then
  echo "$BIN"
  exit 0
fi
if [ -z "${LLAMA_SRC:-}" ] || [ ! -f "$LLAMA_SRC/CMakeLists.txt" ]; then
  echo "llama.cpp binaries not found: set LLAMA_BIN to their folder, or LLAMA_SRC to a" >&2
  echo "llama.cpp checkout to build them (needs cmake and a C++ compiler)" >&2
  exit 1
fi
BUILD=$HOME/.cache/cachet-peer/llama.cpp/build
cmake -S "$LLAMA_SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF >&2
cmake --build "$BUILD" -j "$(nproc)" --target llama-server llama-bench >&2
echo "$BUILD/bin"
