# Shell helpers shared by the scripts that start servers (source it; not run on its own).

# wait_http URL NAME PID LOG: waits up to 5 minutes for URL to answer 2xx; fails (exit 1) when
# process PID exits first or the time is up, naming NAME and where its LOG is.
wait_http() {
  for _ in $(seq 600); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { echo "$2 exited; see $4" >&2; exit 1; }
    sleep 0.5
  done
  echo "$2 did not become ready; see $4" >&2
  exit 1
}

# start_cachet BIN NAME [SERVE ARGS…]: starts `BIN serve` on a free loopback port, with a private
# Postgres in a fresh data folder (/tmp/cachet-NAME.XXXXXX), waits until it is ready, and stops it
# (removing the folder) when the script exits. Sets DATA, BASE and PID.
start_cachet() {
  CACHET_BIN_STARTED=$1
  local name=$2
  shift 2
  DATA=$(mktemp -d "/tmp/cachet-$name.XXXXXX")
  chmod 755 "$DATA"   # the postgres user must reach the private cluster inside
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  BASE="http://127.0.0.1:$port"
  trap stop_cachet EXIT
  RUST_LOG=warn "$CACHET_BIN_STARTED" serve --bind "127.0.0.1:$port" --data-dir "$DATA" "$@" > "$DATA/serve.log" 2>&1 &
  PID=$!
  wait_http "$BASE/readyz" "cachet serve" "$PID" "$DATA/serve.log"
}

stop_cachet() {
  if [ -n "${PID:-}" ] && kill -0 "$PID" 2>/dev/null; then kill -INT "$PID"; wait "$PID" || true; fi
  rm -rf "$DATA"
}

# tenant_token NAME: creates tenant NAME on the server start_cachet started and prints a token of
# it (valid an hour, or $TOKEN_TTL).
tenant_token() {
  local tenant
  tenant=$("$CACHET_BIN_STARTED" tenants create "$1" --data-dir "$DATA" 2>/dev/null)
  "$CACHET_BIN_STARTED" token issue --tenant "$tenant" --ttl "${TOKEN_TTL:-1h}" --data-dir "$DATA" 2>/dev/null
}

# moe_venv: prints the Python environment with torch, transformers and gguf that the
# mixture-of-experts scripts use ($MOE_VENV, else target/moe-venv), making it the first time
# (about 3 GB).
moe_venv() {
  local venv=${MOE_VENV:-target/moe-venv}
  if ! "$venv/bin/python" -c "import torch, transformers, gguf, tokenizers" 2>/dev/null; then
    echo "== a Python environment with torch and transformers in $venv" >&2
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q --upgrade pip >&2
    "$venv/bin/pip" install -q torch transformers safetensors gguf tokenizers numpy sentencepiece >&2
  fi
  echo "$venv"
}
