#!/usr/bin/env bash
# Issue "Hardening, second round", acceptance: while one tenant sends failing grammars, the
# longest stop strings allowed, or `required` calls that repeat, another tenant's short request
# takes at most twice its time alone. Starts `cachet serve` (release build, real default model,
# private Postgres in a temporary folder), runs scripts/fairness_check.py, prints a table
# (docs/security.md has a run).
#
#   scripts/fairness-check.sh        (environment: ROUNDS=7 CACHET_BIN=target/release/cachet)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
BIN=${CACHET_BIN:-target/release/cachet}
[ -x "$BIN" ] || cargo build -q --release -p cachet-api
DATA=$(mktemp -d /tmp/cachet-fairness.XXXXXX)
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
token() {
  local tenant
  tenant=$("$BIN" tenants create "$1" --data-dir "$DATA" 2>/dev/null)
  "$BIN" token issue --tenant "$tenant" --ttl 1h --data-dir "$DATA" 2>/dev/null
}
ATTACKER=$(token attacker)
VICTIM=$(token victim)
MODEL=$(curl -fs -H "Authorization: Bearer $VICTIM" "$BASE/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
python3 scripts/fairness_check.py "$BASE" "$ATTACKER" "$VICTIM" "$MODEL" "${ROUNDS:-7}"
