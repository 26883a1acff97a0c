#!/usr/bin/env bash
# The agent task benchmark (docs/benchmarks.md, "Agent tasks"): real agent CLIs, installed from
# their registries at the versions below, solve Exercism Python exercises (a-m; n-z are a held-out
# set, checked separately) through cachet and through llama-server with the same GGUF, threads and
# sampling defaults; success is the exercise's own tests passing afterwards (scripts/agent_bench.py).
#
#   scripts/agent-bench.sh                                  aider (whole) on cachet and llama-server
#   CLIENTS="aider-whole codex" TARGETS=cachet LIMIT=10 MODEL=qwen2.5-coder-1.5b scripts/agent-bench.sh
#   REPO_TASKS=bench/repo-tasks/more-itertools.json CLIENTS="codex qwen" TARGETS=cachet scripts/agent-bench.sh
#       multi-file tasks from a repository's history (scripts/repo_tasks.py), each client without and
#       with the repository context (BIND="off on"); REPO_GIT is a clone of the repository (cloned
#       from the task list's URL when unset); bound runs start on a pre-warmed repository (an earlier
#       one-turn session of the same client first; PREWARM=0: cold)
#
# Settings (environment): CLIENTS (aider-whole aider-diff codex qwen), TARGETS (cachet llama),
# MODEL (a `cachet models list` name, default qwen2.5-coder-1.5b), LIMIT (exercises, 0: all a-m),
# NAMES (comma-separated exercises or task ids), TIMEOUT and RETRIES (per client run, repository
# tasks: 900 s, 1), THREADS (default: the cores), EXERCISM_DIR (a checkout of
# exercism/python; cloned when unset), CACHET_BIN (default target/release/cachet), LLAMA_BIN or
# LLAMA_SRC (scripts/llama-peer.sh). Results: one JSON line per task in target/agent-bench/,
# the summary rows on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
. scripts/lib.sh

QWEN_CODE=@qwen-code/qwen-code@0.15.10
CODEX=@openai/codex@0.171.0
AIDER=aider-chat==0.86.2
CLIENTS=${CLIENTS:-aider-whole}
TARGETS=${TARGETS:-cachet llama}
MODEL=${MODEL:-qwen2.5-coder-1.5b}
LIMIT=${LIMIT:-0}
NAMES=${NAMES:-}
THREADS=${THREADS:-$(nproc)}
BIN=${CACHET_BIN:-target/release/cachet}
[ -x "$BIN" ] || cargo build -q --release -p cachet-api
TOOLS=$ROOT/target/agents
OUT=$ROOT/target/agent-bench
mkdir -p "$TOOLS" "$OUT"
REPO_TASKS=${REPO_TASKS:-}
BIND=${BIND:-off on}
PREWARM=${PREWARM:-1}
STATE=$OUT/state
mkdir -p "$STATE"
# Repository tasks register their working trees with cachet (watched): they live under its root.
export CACHET_CONTEXT__ALLOWED_ROOT=$STATE
# A run of every task takes hours on a 2-core machine.
export TOKEN_TTL=${TOKEN_TTL:-24h}

need() { # clients' installs, once
  case "$1" in
    codex | qwen)
      command -v npm >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null; }
      local pkg=$CODEX
      [ "$1" = qwen ] && pkg=$QWEN_CODE
      local name=${pkg%@*}
      if ! grep -qs "\"version\": \"${pkg##*@}\"" "$TOOLS/node_modules/$name/package.json"; then
        echo "installing $pkg" >&2
        npm install -q --no-audit --no-fund --prefix "$TOOLS" "$pkg" >/dev/null
      fi
      ;;
    aider-*)
      if [ ! -x "$TOOLS/aider-venv/bin/aider" ]; then
        echo "installing $AIDER" >&2
        python3 -m venv "$TOOLS/aider-venv"
        "$TOOLS/aider-venv/bin/pip" install -q "$AIDER" >&2
      fi
      ;;
    *) echo "unknown client $1 (aider-whole, aider-diff, codex, qwen)" >&2; exit 1 ;;
  esac
}
for c in $CLIENTS; do need "$c"; done

if [ -n "$REPO_TASKS" ]; then
  REPO_GIT=${REPO_GIT:-$TOOLS/$(basename "$REPO_TASKS" .json)}
  if [ ! -d "$REPO_GIT" ]; then
    git clone -q "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["repository"])' "$REPO_TASKS")" "$REPO_GIT"
  fi
else
  EXERCISM=${EXERCISM_DIR:-$TOOLS/exercism-python}
  if [ ! -d "$EXERCISM/exercises/practice" ]; then
    git clone -q --depth 1 https://github.com/exercism/python "$EXERCISM"
  fi
fi

GGUF=$("$BIN" models pull "$MODEL" 2>/dev/null | tail -n 1)
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
echo "# $STAMP, $CPU, $THREADS threads, model $MODEL ($GGUF)" | tee "$OUT/summary-$STAMP.txt"

run_target() { # target: starts it, runs every client, stops it
  local target=$1 base key extra=()
  case "$target" in
    cachet)
      start_cachet "$BIN" agent-bench --model "$GGUF"
      base=$BASE/v1 key=$(tenant_token bench) extra=(--cachet)
      ;;
    llama)
      local bin port
      bin=$(scripts/llama-peer.sh)
      port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
      # cachet's defaults for what a request leaves out: Qwen's recommended sampling, 4096 tokens.
      "$bin/llama-server" -m "$GGUF" -t "$THREADS" -c 32768 --port "$port" --jinja -n 4096 \
        --temp 0.7 --top-p 0.8 --top-k 20 --min-p 0 --repeat-penalty 1.05 > "$OUT/llama-$STAMP.log" 2>&1 &
      LLAMA_PID=$!
      trap 'kill $LLAMA_PID 2>/dev/null || true' EXIT
      wait_http "http://127.0.0.1:$port/health" llama-server "$LLAMA_PID" "$OUT/llama-$STAMP.log"
      base=http://127.0.0.1:$port/v1 key=none
      ;;
    *) echo "unknown target $target (cachet, llama)" >&2; exit 1 ;;
  esac
  for client in $CLIENTS; do
    if [ -n "$REPO_TASKS" ]; then
      for bind in $BIND; do
        local how=()
        [ "$bind" = on ] && [ "$target" = cachet ] && how=(--bind)
        [ "$bind" = on ] && [ "$target" = cachet ] && [ "$PREWARM" = 1 ] && how+=(--prewarm)
        [ "$bind" = on ] && [ "$target" != cachet ] && continue
        python3 scripts/agent_bench.py --client "$client" --base "$base" --key "$key" --model default \
          --timeout "${TIMEOUT:-900}" --retries "${RETRIES:-1}" \
          --target "$target" "${extra[@]}" "${how[@]}" --repo-tasks "$REPO_TASKS" --repo-git "$REPO_GIT" \
          --limit "$LIMIT" --names "$NAMES" --tools "$TOOLS" --state "$STATE" --out "$OUT/tasks-$STAMP.jsonl" |
          tail -n 1 | tee -a "$OUT/summary-$STAMP.txt"
      done
      continue
    fi
    python3 scripts/agent_bench.py --client "$client" --base "$base" --key "$key" --model default \
      --target "$target" "${extra[@]}" --exercism "$EXERCISM" --limit "$LIMIT" --names "$NAMES" \
      --tools "$TOOLS" --out "$OUT/tasks-$STAMP.jsonl" | tail -n 1 | tee -a "$OUT/summary-$STAMP.txt"
  done
  if [ "$target" = cachet ]; then
    "$BIN" report --group-by task --data-dir "$DATA" > "$OUT/report-$STAMP.txt" 2>&1 || true
    stop_cachet
    trap - EXIT
  else
    kill "$LLAMA_PID" 2>/dev/null || true
    wait "$LLAMA_PID" 2>/dev/null || true
    trap - EXIT
  fi
}
for t in $TARGETS; do run_target "$t"; done
echo "tasks: $OUT/tasks-$STAMP.jsonl; summary: $OUT/summary-$STAMP.txt"
