#!/usr/bin/env bash
# Starts `cachet serve` (real default model, private Postgres in a temporary
# data folder), creates a tenant and a token with the CLI, runs the official
# openai Python package against it (scripts/openai_check.py: chat, completions,
# streaming, errors; scripts/agents_check.py: tool calls and structured output,
# answers validated with the jsonschema package), then stops the server with
# SIGINT and checks that it shut down cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CACHET_BIN:-target/debug/cachet}
[ -x "$BIN" ] || cargo build -q -p cachet-api
VENV=target/pyenv
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import openai, jsonschema" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check openai jsonschema
fi
DATA=$(mktemp -d /tmp/cachet-openai-check.XXXXXX)
chmod 755 "$DATA"   # the postgres user must reach the private cluster inside
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BASE="http://127.0.0.1:$PORT"
cleanup() {
  if [ -n "${PID:-}" ] && kill -0 "$PID" 2>/dev/null; then kill -INT "$PID"; wait "$PID" || true; fi
  rm -rf "$DATA"
}
trap cleanup EXIT
RUST_LOG=warn "$BIN" serve --bind "127.0.0.1:$PORT" --data-dir "$DATA" > "$DATA/serve.log" 2>&1 &
PID=$!
for _ in $(seq 600); do
  curl -fs "$BASE/readyz" > /dev/null 2>&1 && break
  kill -0 "$PID" 2>/dev/null || { cat "$DATA/serve.log"; echo "cachet serve died" >&2; exit 1; }
  sleep 0.2
done
curl -fs "$BASE/readyz" > /dev/null || { cat "$DATA/serve.log"; echo "cachet serve never became ready" >&2; exit 1; }
TENANT=$("$BIN" tenants create openai-check --data-dir "$DATA" 2>/dev/null)
TOKEN=$("$BIN" token issue --tenant "$TENANT" --ttl 1h --data-dir "$DATA" 2>/dev/null)
MODEL=$(curl -fs -H "Authorization: Bearer $TOKEN" "$BASE/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
"$VENV/bin/python" scripts/openai_check.py "$BASE" "$TOKEN" "$MODEL"
"$VENV/bin/python" scripts/agents_check.py "$BASE" "$TOKEN" "$MODEL"
kill -INT "$PID"
wait "$PID"
PID=
if pgrep -f "postgres.*$DATA" > /dev/null; then echo "Postgres still runs after shutdown" >&2; exit 1; fi
echo "cachet serve shut down cleanly"
