#!/usr/bin/env bash
# Prefill/decode disaggregation against unified serving on one machine, with the default model:
# a unified server, and a prefill server and two decode servers (one per reserve policy) on loopback; TTFT split, bytes moved, and the
# inter-token latency of a running generation while a long prompt arrives, alternating rounds.
# Fails when the greedy outputs differ (scripts/disagg_bench.py; docs/deployment.md).
#
#   scripts/disagg-bench.sh   (environment: ROUNDS=3 THREADS=2 PREFILL_THREADS=1 DECODE_THREADS=1
#                              PROMPT_CHARS=14000 GEN=160 OUT=target/disagg-bench PORT=18110
#                              CACHET_BIN: a cachet binary to use instead of a release build)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/disagg-bench}
rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [ -n "${CACHET_BIN:-}" ]; then
  CACHET=$(cd "$(dirname "$CACHET_BIN")" && pwd)/$(basename "$CACHET_BIN")
else
  cargo build -q --release -p cachet-api
  CACHET=$PWD/target/release/cachet
fi
MODEL=$($CACHET models pull 2>/dev/null | tail -n 1)
machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "disaggregation bench: $machine, $(git rev-parse --short HEAD)" >&2
python3 scripts/disagg_bench.py --cachet "$CACHET" --model "$MODEL" --out "$OUT" --source "$PWD" \
  --rounds "${ROUNDS:-3}" --port "${PORT:-18110}" --threads "${THREADS:-2}" \
  --prefill-threads "${PREFILL_THREADS:-1}" --decode-threads "${DECODE_THREADS:-1}" \
  --prompt-chars "${PROMPT_CHARS:-14000}" --gen "${GEN:-160}"
