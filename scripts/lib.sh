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
