#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh needs on a GPU machine that has no Rust toolchain and no
# network (the lent H200 machines), into .gpu/ (ignored; under 64 MiB): the stripped release
# `cachet`, the CUDA parity test binaries, and the default model's layout without its weights
# (`gguf_skeleton strip`; the check fills it with random weights there, so the speed is that of
# the real shapes and types — the 491 MB model itself cannot travel).
#
#   scripts/gpu-pack.sh && (on the GPU machine) PREBUILT=.gpu scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.gpu
mkdir -p "$DEST"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
export LD_LIBRARY_PATH="$(scripts/nvrtc.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# (two commands: naming an example makes cargo build only that target of the packages named)
cargo build -q --release -p cachet-api
cargo build -q --release -p cachet-engine --example gguf_skeleton
test_binary() { # package, test target -> path of its executable
  cargo test -q --release --no-run -p "$1" --test "$2" --message-format=json 2>/dev/null |
    python3 -c 'import sys,json
for l in sys.stdin:
    e=json.loads(l).get("executable")
    if e: print(e)' | tail -n 1
}
cp "$(test_binary cachet-kernels kernels)" "$DEST/test-kernels"
cp "$(test_binary cachet-engine engine)" "$DEST/test-engine"
cp target/release/cachet target/release/examples/gguf_skeleton "$DEST/"
strip "$DEST"/cachet "$DEST"/gguf_skeleton "$DEST"/test-kernels "$DEST"/test-engine
MODEL=$(target/release/cachet models pull 2>/dev/null | tail -n 1)
target/release/examples/gguf_skeleton strip "$MODEL" "$DEST/skeleton.gguf"
du -sh "$DEST"
