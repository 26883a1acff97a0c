#!/usr/bin/env bash
# Remakes engine/tests/fixtures/yarn/reference.json (issue 54): cachet's test writes its tiny
# YaRN model as a Hugging Face directory, transformers records its logits and rotary table
# (scripts/fixtures/make_yarn_fixture.py), then the test compares cachet with them. Only needed
# when the tiny model or the prompt changes; the fixture is committed and CI runs the test.
# torch and transformers come from the environment scripts/moe-check.sh uses (target/moe-venv,
# or MOE_VENV).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
VENV=$(moe_venv)
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
FIXTURE=engine/tests/fixtures/yarn/reference.json
mkdir -p "$(dirname "$FIXTURE")"

echo "== the tiny YaRN model, as the test writes it"
# The test fails here when the fixture is missing or stale; it has written the model by then.
CACHET_YARN_MODEL_OUT=$DIR/model cargo test -q -p cachet-engine --test engine \
  yarn_reference::a_yarn_model_matches_transformers >/dev/null 2>&1 || true
[ -f "$DIR/model/model.safetensors" ] || { echo "the test did not write the model" >&2; exit 1; }

echo "== transformers' logits"
"$VENV/bin/python" scripts/fixtures/make_yarn_fixture.py "$DIR/model" "$FIXTURE"

echo "== cachet against them"
cargo test -p cachet-engine --test engine yarn_reference -- --nocapture
