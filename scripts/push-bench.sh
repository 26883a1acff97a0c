#!/usr/bin/env bash
# A push during a session, on cachet with the default model: `after_push = "overlay"` and
# `"rebuild"` side by side in one server (two copies of a repository, each registered with one
# mode), rounds alternating which goes first (bench/src/push.rs, docs/context.md).
#
#   scripts/push-bench.sh     (environment: SOURCE=. ROUNDS=5 THREADS=2 CTX=32768 SETTLE=5
#                              OUT=target/push-bench PORT=18090)
#
# SOURCE is the git repository copied and pushed to (its HEAD branch); each round adds a
# function to a file of its context. Writes $OUT/push.md and $OUT/push.json.
set -euo pipefail
cd "$(dirname "$0")/.."
SOURCE=${SOURCE:-.}
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-2}
CTX=${CTX:-32768}
SETTLE=${SETTLE:-5}
OUT=${OUT:-target/push-bench}
PORT=${PORT:-18090}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SOURCE=$(cd "$SOURCE" && pwd)

cargo build -q --release -p cachet-api -p cachet-bench
CACHET=$PWD/target/release/cachet
BENCH=$PWD/target/release/cachet-bench
MODEL=$($CACHET models pull 2>/dev/null | tail -n 1)
MODEL_ID=$(basename "$MODEL" .gguf)

DATA="$OUT/cachet-data"
WORK="$OUT/repos"
rm -rf "$DATA" "$WORK"
mkdir -p "$DATA" "$WORK"
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT

# shellcheck source=scripts/lib.sh
. scripts/lib.sh

CACHET_SERVER__BIND="127.0.0.1:$PORT" CACHET_MODEL__PATH="$MODEL" CACHET_MODEL__THREADS="$THREADS" \
  CACHET_ENGINE__POOL_TOKENS="$CTX" CACHET_CONTEXT__ALLOWED_ROOT="$WORK" RUST_LOG="${CACHET_RUST_LOG:-warn}" \
  "$CACHET" serve --data-dir "$DATA" > "$OUT/cachet.log" 2>&1 &
PID=$!
wait_http "http://127.0.0.1:$PORT/readyz" cachet "$PID" "$OUT/cachet.log"
TENANT=$("$CACHET" tenants create push-bench --data-dir "$DATA" 2>/dev/null | tail -n 1)
TOKEN=$("$CACHET" token issue --tenant "$TENANT" --ttl 12h --data-dir "$DATA" 2>/dev/null | tail -n 1)

machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "push during a session: $MODEL_ID, $THREADS threads, $machine, source $(git -C "$SOURCE" rev-parse --short HEAD)" >&2
CACHET_BENCH_API_KEY="$TOKEN" "$BENCH" push --url "http://127.0.0.1:$PORT" --model "$MODEL_ID" \
  --source-repo "$SOURCE" --work "$WORK" --rounds "$ROUNDS" --settle-s "$SETTLE" --out "$OUT"
