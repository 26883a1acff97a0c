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
# First the same three attacks on the tests' tiny model, through the test server (a timing ratio,
# so it is not part of the test suite).
cargo test -q -p cachet-tests --test fairness -- --ignored
BIN=${CACHET_BIN:-target/release/cachet}
[ -x "$BIN" ] || cargo build -q --release -p cachet-api
start_cachet "$BIN" fairness
ATTACKER=$(tenant_token attacker)
VICTIM=$(tenant_token victim)
MODEL=$(curl -fs -H "Authorization: Bearer $VICTIM" "$BASE/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
python3 scripts/fairness_check.py "$BASE" "$ATTACKER" "$VICTIM" "$MODEL" "${ROUNDS:-7}"
