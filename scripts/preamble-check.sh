#!/usr/bin/env bash
# Agent preambles computed once for every tenant (docs/agents.md, "Agent preambles shared by
# every tenant"): the agent-trace scenario (real agent clients' recorded requests) replayed by
# several tenants against one cachet, twice on the same server — first with nothing public, then,
# for fresh tenants, with the trace's clients' preambles registered as public prefixes (the chat
# clients' system prompts and tools as recorded, plus every candidate discovery found in the
# first run: the Responses client's among them) and pre-warmed. Reports, per run, the TTFT of
# first turns and the prompt tokens the server computed.
#
#   scripts/preamble-check.sh   (environment: TENANTS=3 SCALE=3 TURNS=2 RETRIES=3 THREADS=2 CTX=32768
#                                OUT=target/preamble-check PORT=18090)
#
# Writes $OUT/without/ and $OUT/with/ (cachet-bench results) and $OUT/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
TENANTS=${TENANTS:-3}
SCALE=${SCALE:-3}
TURNS=${TURNS:-2}
RETRIES=${RETRIES:-3}
THREADS=${THREADS:-2}
CTX=${CTX:-32768}
OUT=${OUT:-target/preamble-check}
PORT=${PORT:-18090}
TRACE=bench/traces/agents-2026-12-01.jsonl
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

cargo build -q --release -p cachet-api -p cachet-bench
CACHET=$PWD/target/release/cachet
BENCH=$PWD/target/release/cachet-bench
MODEL=$($CACHET models pull 2>/dev/null | tail -n 1)
MODEL_ID=$(basename "$MODEL" .gguf)
DATA="$OUT/cachet-data"
rm -rf "$DATA" "$OUT/without" "$OUT/with"
mkdir -p "$DATA"
URL="http://127.0.0.1:$PORT"

CACHET_SERVER__BIND="127.0.0.1:$PORT" CACHET_MODEL__PATH="$MODEL" CACHET_MODEL__THREADS="$THREADS" \
  CACHET_ENGINE__POOL_TOKENS="$CTX" RUST_LOG=warn "$CACHET" serve --data-dir "$DATA" > "$OUT/cachet.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; wait 2>/dev/null || true' EXIT
wait_http "$URL/readyz" cachet "$PID" "$OUT/cachet.log"
OPERATOR=$("$CACHET" token issue --operator --ttl 12h --data-dir "$DATA" 2>/dev/null | tail -n 1)

# Fresh tenants for a run; prints the bench's key arguments.
tenant_keys() { # label
  for i in $(seq "$TENANTS"); do
    local t
    t=$("$CACHET" tenants create "$1-$i" --data-dir "$DATA" 2>/dev/null | tail -n 1)
    printf -- '--target-api-key cachet=%s ' "$("$CACHET" token issue --tenant "$t" --ttl 12h --data-dir "$DATA" 2>/dev/null | tail -n 1)"
  done
}
idle() {
  for _ in $(seq 1200); do
    m=$(curl -fsS -H "Authorization: Bearer $OPERATOR" "$URL/metrics")
    if echo "$m" | grep -q '^cachet:num_requests_running 0' && echo "$m" | grep -q '^cachet:num_requests_waiting 0'; then
      return 0
    fi
    sleep 0.5
  done
  echo "the engine never went idle" >&2
  exit 1
}
run() { # label
  # shellcheck disable=SC2046
  "$BENCH" run --target "cachet=$URL@$MODEL_ID" $(tenant_keys "$1") --scenario agent-trace --trace "$TRACE" \
    --scale "$SCALE" --turns "$TURNS" --retries "$RETRIES" --no-calibrate --no-warmup --label "$1" --out "$OUT/$1" \
    > "$OUT/$1.log" 2>&1
}

run without
idle
# The chat clients' preambles as recorded (the messages before the first user message, and the
# tools), then every discovery candidate that no registered prefix covers.
python3 - "$TRACE" "$URL" "$OPERATOR" <<'PY'
import json, sys, urllib.request
trace, url, op = sys.argv[1:]
def call(method, path, body=None):
    req = urllib.request.Request(url + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + op, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
seen = []
for line in open(trace):
    r = json.loads(line)
    if r["path"] != "/v1/chat/completions":
        continue
    head = []
    for m in r["body"].get("messages", []):
        if m["role"] == "user":
            break
        head.append(m)
    source = {"messages": head}
    if r["body"].get("tools"):
        source["tools"] = r["body"]["tools"]
    # Each distinct preamble of each client (a client may send side requests with another one).
    if (not head and "tools" not in source) or source in seen:
        continue
    seen.append(source)
    name = f"{r['client']}-{len(seen)}"
    status, body = call("POST", "/admin/public-prefixes", {"name": name, "source": source})
    print(f"registered {name}: {status} {body.get('tokens', body)} tokens", file=sys.stderr)
_, cands = call("GET", "/admin/public-prefixes/candidates")
for c in cands["data"]:
    if not c["registered"]:
        status, body = call("POST", "/admin/public-prefixes", {"name": "candidate-" + c["id"], "candidate": c["id"]})
        print(f"registered candidate {c['id']} ({c['tenants']} tenants): {status} {body.get('tokens', body)} tokens", file=sys.stderr)
PY
idle
run with

python3 - "$OUT" "$TENANTS" <<'PY' | tee "$OUT/summary.md"
import json, statistics, sys
out, tenants = sys.argv[1], sys.argv[2]
print(f"# Agent preambles: agent-trace replayed by {tenants} tenants, without and with public prefixes\n")
print("| run | requests done | first turns: TTFT p50 ms | later turns: TTFT p50 ms | prompt tokens | cached | computed | first turns computed |")
print("|---|---|---|---|---|---|---|---|")
for label in ["without", "with"]:
    res = json.load(open(f"{out}/{label}/results.json"))["results"][0]["records"]
    done = [r for r in res if r["ttft_ms"] is not None]
    first = [r for r in done if r["turn"] == 0]
    later = [r["ttft_ms"] for r in done if r["turn"] > 0]
    prompt = sum(r["prompt_tokens"] or 0 for r in done)
    cached = sum(r["cached_tokens"] or 0 for r in done)
    first_computed = sum((r["prompt_tokens"] or 0) - (r["cached_tokens"] or 0) for r in first)
    p50 = lambda v: f"{statistics.median(v):.0f}" if v else "–"
    print(f"| {label} | {len(done)} / {len(res)} | {p50([r['ttft_ms'] for r in first])} | {p50(later)} | "
          f"{prompt} | {cached} | {prompt - cached} | {first_computed} |")
PY
