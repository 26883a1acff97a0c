#!/usr/bin/env bash
# Installs NVIDIA's NVRTC runtime compiler (the pip wheel nvidia-cuda-nvrtc-cu12,
# no CUDA toolkit needed) under target/nvrtc, once, and prints the directory
# that holds libnvrtc.so.12, for LD_LIBRARY_PATH. cachet's CUDA kernels are
# compiled with it at run time; kernels/tests/nvrtc_compile.rs checks them with it.
#
#   export LD_LIBRARY_PATH="$(scripts/nvrtc.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
#
# For a machine without network access: `scripts/nvrtc.sh --pack` writes
# target/nvrtc.tar.xz (about 30 MB: the library and its builtins); copied
# there, it is unpacked instead of installing.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=target/nvrtc
LIB="$DEST/nvidia/cuda_nvrtc/lib"
PACK=target/nvrtc.tar.xz
if ! ls "$LIB"/libnvrtc.so.* >/dev/null 2>&1; then
  if [ -f "$PACK" ]; then
    echo "unpacking $PACK" >&2
    mkdir -p "$LIB" && tar -C "$LIB" -xJf "$PACK"
  else
    echo "installing nvidia-cuda-nvrtc-cu12 into $DEST" >&2
    python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --target "$DEST" \
      "nvidia-cuda-nvrtc-cu12>=12.4,<13" >&2
  fi
fi
if [ "${1:-}" = --pack ]; then
  (cd "$LIB" && tar -cJf - libnvrtc.so.12 libnvrtc-builtins.so.12.*) > "$PACK"
  echo "$PACK"
  exit 0
fi
# cudarc's loader finds libnvrtc.so.12 by that name (no link needed).
cd "$LIB" && pwd
