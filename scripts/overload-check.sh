#!/usr/bin/env bash
# Issue "hardening", item 9: with forty requests at once beyond capacity, the excess hears its 429
# (with Retry-After) at once, not after the forward pass in progress. Starts `cachet serve`
# (release build, real default model, private Postgres in a temporary folder), runs
# scripts/overload_check.py, prints the 429 latencies (docs/security.md has a run).
#
#   scripts/overload-check.sh        (environment: N=40 WORDS=60 CACHET_BIN=target/release/cachet)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
BIN=${CACHET_BIN:-target/release/cachet}
[ -x "$BIN" ] || cargo build -q --release -p cachet-api
N=${N:-40}
DATA=$(mktemp -d /tmp/cachet-overload.XXXXXX)
chmod 755 "$DATA"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BASE="http://127.0.0.1:$PORT"
cleanup() {
  if [ -n "${PID:-}" ] && kill -0 "$PID" 2>/dev/null; then kill -INT "$PID"; wait "$PID" || true; fi
  rm -rf "$DATA"
}
trap cleanup EXIT
RUST_LOG=warn "$BIN" serve --bind "127.0.0.1:$PORT" --data-dir "$DATA" > "$DATA/serve.log" 2>&1 &
PID=$!
wait_http "$BASE/readyz" "cachet serve" "$PID" "$DATA/serve.log"
TENANT=$("$BIN" tenants create overload --data-dir "$DATA" 2>/dev/null)
TOKEN=$("$BIN" token issue --tenant "$TENANT" --ttl 1h --data-dir "$DATA" 2>/dev/null)
MODEL=$(curl -fs -H "Authorization: Bearer $TOKEN" "$BASE/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
python3 scripts/overload_check.py "$BASE" "$TOKEN" "$MODEL" "$N" "${WORDS:-60}"
