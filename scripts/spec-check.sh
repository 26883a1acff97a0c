#!/usr/bin/env bash
# Speculative decoding side by side: the code edit of `cachet bench --spec` through cachet with and
# without drafting and through llama.cpp's llama-server without speculation and with each of its
# draftless n-gram modes, alternating, medians (scripts/spec_check.py; docs/performance.md has a run).
#
#   scripts/spec-check.sh     (environment: ROUNDS=3 GEN=256 THREADS=2 MODEL=file.gguf;
#                              llama.cpp's binaries as for scripts/bench-cpu.sh: LLAMA_BIN or LLAMA_SRC)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(scripts/llama-peer.sh)
cargo build -q --release -p cachet-api
CACHET=target/release/cachet
MODEL=${MODEL:-$($CACHET models pull 2>/dev/null | tail -n 1)}
LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  python3 scripts/spec_check.py "$CACHET" "$BIN/llama-server" "$MODEL" "${ROUNDS:-3}" "${GEN:-256}" "${THREADS:-2}"
