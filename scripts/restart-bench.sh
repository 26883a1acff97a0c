#!/usr/bin/env bash
# A restart with the KV disk tier, on cachet with the default model: a tenant's first turn on a
# repository (cold), SIGTERM, a new server on the same data directory, the same turn again (served
# from the disk tier). Fails when the outputs differ or the restarted turn was not served from the
# tier (scripts/restart_bench.py; docs/deployment.md "KV disk tier").
#
#   scripts/restart-bench.sh     (environment: SOURCE=. ROUNDS=3 THREADS=2 OUT=target/restart-bench
#                                 PORT=18095 CACHET_BIN: a cachet binary to use instead of a release build)
set -euo pipefail
cd "$(dirname "$0")/.."
SOURCE=${SOURCE:-.}
OUT=${OUT:-target/restart-bench}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SOURCE=$(cd "$SOURCE" && pwd)
if [ -n "${CACHET_BIN:-}" ]; then
  CACHET=$(cd "$(dirname "$CACHET_BIN")" && pwd)/$(basename "$CACHET_BIN")
else
  cargo build -q --release -p cachet-api
  CACHET=$PWD/target/release/cachet
fi
MODEL=$($CACHET models pull 2>/dev/null | tail -n 1)
rm -rf "$OUT/cachet-data" "$OUT/repos" "$OUT/cachet.log"
mkdir -p "$OUT/cachet-data" "$OUT/repos"
machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "restart bench: $machine, source $(git -C "$SOURCE" rev-parse --short HEAD)" >&2
python3 scripts/restart_bench.py --cachet "$CACHET" --model "$MODEL" --data "$OUT/cachet-data" \
  --work "$OUT/repos" --source "$SOURCE" --out "$OUT" --rounds "${ROUNDS:-3}" --port "${PORT:-18095}" \
  --threads "${THREADS:-2}"
