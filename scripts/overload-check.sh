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
start_cachet "$BIN" overload
TOKEN=$(tenant_token overload)
MODEL=$(curl -fs -H "Authorization: Bearer $TOKEN" "$BASE/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
python3 scripts/overload_check.py "$BASE" "$TOKEN" "$MODEL" "$N" "${WORDS:-60}"
