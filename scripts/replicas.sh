#!/usr/bin/env bash
# Two cachet replicas behind nginx on this machine, wired as deploy/k8s describes: one shared
# Postgres (replica A's private cluster), the same JWT key and operator token, and the proxy
# configuration of deploy/k8s/proxy.yaml (replica addresses replaced by local ports). Sends two
# requests per affinity key and checks that both reach the same replica (X-Cachet-Replica) and
# that the second reuses the first one's prefix there.
#
#   scripts/replicas.sh        (environment: PROXY_PORT=18088 A_PORT=18086 B_PORT=18087 OUT=target/replicas)
#
# Needs nginx (installed with apt-get when missing and running as root) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
PROXY_PORT=${PROXY_PORT:-18088}
A_PORT=${A_PORT:-18086}
B_PORT=${B_PORT:-18087}
OUT=${OUT:-target/replicas}
if ! command -v nginx >/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "nginx is missing (apt-get install nginx-light)" >&2; exit 1; }
  apt-get install -y -q nginx-light >/dev/null
fi
NGINX=$(command -v nginx)
cargo build -q --release -p cachet-api
CACHET=$PWD/target/release/cachet
MODEL=$("$CACHET" models pull 2>/dev/null | tail -n 1)
MODEL_ID=$(basename "$MODEL" .gguf)
rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

PIDS=()
cleanup() {
  [ -f "$OUT/nginx.pid" ] && "$NGINX" -c "$OUT/nginx.conf" -s stop 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# shellcheck source=scripts/lib.sh
. scripts/lib.sh

# Replica A starts the private Postgres; B uses it through DATABASE_URL, with A's secrets.
CACHET_SERVER__BIND=127.0.0.1:$A_PORT CACHET_MODEL__PATH="$MODEL" CACHET_MODEL__THREADS=1 RUST_LOG=info \
  "$CACHET" serve --data-dir "$OUT/a" > "$OUT/a.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$A_PORT/readyz" "replica a" "${PIDS[0]}" "$OUT/a.log"
PG_DIR="$OUT/a/postgres"   # the cluster's folder; elsewhere when the data folder says so
[ -f "$OUT/a/postgres.location" ] && PG_DIR=$(cat "$OUT/a/postgres.location")
PG_PORT=$(cat "$PG_DIR/port")
DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/cachet" \
  CACHET_AUTH__JWT__HS256_SECRET="$(cat "$OUT/a/secrets/jwt-hs256")" \
  CACHET_AUTH__OPERATOR_TOKEN="$(cat "$OUT/a/secrets/operator-token")" \
  CACHET_SERVER__BIND=127.0.0.1:$B_PORT CACHET_MODEL__PATH="$MODEL" CACHET_MODEL__THREADS=1 RUST_LOG=info \
  "$CACHET" serve --data-dir "$OUT/b" > "$OUT/b.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$B_PORT/readyz" "replica b" "${PIDS[1]}" "$OUT/b.log"

# The proxy: deploy/k8s/proxy.yaml's default.conf, pointed at the two local replicas.
python3 - "$OUT" "$PROXY_PORT" "$A_PORT" "$B_PORT" <<'EOF'
import sys
out, proxy, a, b = sys.argv[1:]
text = open("deploy/k8s/proxy.yaml").read()
conf = text.split("default.conf: |\n", 1)[1].split("\n---", 1)[0]
conf = "\n".join(line[4:] for line in conf.splitlines())
conf = (conf.replace("cachet-0.cachet:8080", f"127.0.0.1:{a}").replace("cachet-1.cachet:8080", f"127.0.0.1:{b}")
        .replace("listen 8080;", f"listen 127.0.0.1:{proxy};"))
open(f"{out}/proxy.conf", "w").write(conf)
open(f"{out}/nginx.conf", "w").write(
    f"pid {out}/nginx.pid;\nerror_log {out}/nginx.err;\nevents {{}}\n"
    f"http {{\n  access_log off;\n  include {out}/proxy.conf;\n}}\n")
EOF
"$NGINX" -t -q -c "$OUT/nginx.conf"
"$NGINX" -c "$OUT/nginx.conf"

TENANT=$("$CACHET" tenants create replicas-demo --data-dir "$OUT/a" 2>/dev/null | tail -n 1)
TOKEN=$("$CACHET" token issue --tenant "$TENANT" --ttl 1h --data-dir "$OUT/a" 2>/dev/null | tail -n 1)
python3 - "$PROXY_PORT" "$TOKEN" "$MODEL_ID" <<'EOF'
import json, sys, urllib.request
port, token, model = sys.argv[1:]
context = "".join(f"fn f{i}() {{}}\n" for i in range(60))
def ask(key, question):
    body = {"model": model, "max_tokens": 4, "messages": [
        {"role": "system", "content": f"Repository {key}:\n{context}"}, {"role": "user", "content": question}]}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "X-Cachet-Affinity": key})
    with urllib.request.urlopen(req, timeout=300) as r:
        usage = json.load(r)["usage"]
        return r.headers["X-Cachet-Replica"], usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]
print("| affinity key | replica (1st, 2nd) | cached tokens (1st, 2nd) of prompt |")
print("|---|---|---|")
replicas, failures = set(), []
for key in ["acme/shop", "globex/api", "initech/web", "umbrella/x", "hooli/search", "stark/arc"]:
    (r1, c1, p1), (r2, c2, p2) = ask(key, "What is f1?"), ask(key, "And f2?")
    replicas |= {r1, r2}
    print(f"| {key} | {r1[:8]}, {r2[:8]} | {c1}, {c2} of {p2} |")
    if r1 != r2:
        failures.append(f"{key} moved between replicas")
    if c2 < p2 // 2:
        failures.append(f"{key}: the second request reused only {c2} of {p2} tokens")
print(f"\n{len(replicas)} replica(s) answered")
if len(replicas) < 2:
    failures.append("every key went to one replica")
if failures:
    sys.exit("FAILED: " + "; ".join(failures))
print("ok: every key stays on one replica and reuses its prefix there")
EOF
