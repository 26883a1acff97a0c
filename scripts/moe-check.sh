#!/usr/bin/env bash
# Mixture-of-experts models against independent references (issue 21): Hugging Face
# transformers builds tiny random-weight Qwen3-MoE and Qwen2-MoE models (its own config classes,
# fixed seeds) and saves them as safetensors; llama.cpp's own convert_hf_to_gguf.py converts
# them to GGUF (F32, F16, Q8_0); transformers records the logits and greedy continuations of
# the weights each file holds; llama.cpp's llama-server the greedy continuations of the GGUF
# files. Then engine/tests/moe_reference.rs loads every file with cachet and compares.
#
#   LLAMA_SRC=path/to/llama.cpp scripts/moe-check.sh
#
# LLAMA_SRC is a llama.cpp checkout (convert_hf_to_gguf.py, gguf-py, the sources the peer
# binaries are built from): for instance the one the `llama-cpp-python` source package vendors
# (`vendor/llama.cpp`). The binaries come from scripts/llama-peer.sh (LLAMA_BIN, or built there
# from LLAMA_SRC). torch, transformers and gguf go into a virtual environment in
# target/moe-venv (about 3 GB the first time; MOE_VENV to use another). Not part of
# scripts/test.sh: the torch install alone is minutes and gigabytes; CI runs the same model code
# against the tests' own f64 reference (engine/tests/tiny_models.rs) and the engine and API
# suites once with a tiny MoE model.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_SRC:?set LLAMA_SRC to a llama.cpp checkout (see the header of this script)}"
[ -f "$LLAMA_SRC/convert_hf_to_gguf.py" ] || { echo "no convert_hf_to_gguf.py in $LLAMA_SRC" >&2; exit 1; }
. scripts/lib.sh
OUT=${OUT:-target/moe-fixtures}
VENV=$(moe_venv)

echo "== tiny MoE models and transformers' reference outputs in $OUT"
rm -rf "$OUT"
"$VENV/bin/python" scripts/fixtures/make_moe_fixture.py --llama-src "$LLAMA_SRC" --out "$OUT"

echo "== llama.cpp's greedy continuations on the same GGUF files"
BIN=$(LLAMA_SRC=$LLAMA_SRC scripts/llama-peer.sh)
python3 scripts/fixtures/llama_greedy.py "$BIN" "$OUT"

echo "== cachet against both"
export LD_LIBRARY_PATH="$(scripts/nvrtc.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
CACHET_MOE_FIXTURES=$PWD/$OUT REQUIRE_MOE_FIXTURES=1 REQUIRE_LLAMA=1 \
  cargo test -p cachet-engine --test engine moe_reference -- --nocapture --test-threads 1
echo "moe-check passed"
