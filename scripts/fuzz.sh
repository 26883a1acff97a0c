#!/usr/bin/env bash
# Runs every fuzz target (fuzz/, cargo-fuzz with libFuzzer and AddressSanitizer) for a while:
#
#   scripts/fuzz.sh                  (environment: MINUTES=10 TARGETS="gguf tokenizer chat_template
#                                     openai_request webhook_payload tool_calls" JOBS=1 BUILT=0)
#
# BUILT=1 runs the targets `cargo +nightly fuzz build --fuzz-dir fuzz` built last, without
# building again (so that editing the sources meanwhile changes nothing in the run).
# Each target starts from the committed corpus (fuzz/corpus/<target>/, copied to
# target/fuzz/corpus/<target>/ so a run never rewrites it) under limits of 2 GiB of memory and
# 10 s per input. A crash, hang or out-of-memory leaves its input in target/fuzz/artifacts/<target>/
# and fails the script; fix it, then add the input to fuzz/corpus/<target>/ (the test suite
# replays that corpus: tests/tests/fuzz_corpus.rs). The tokenizer and chat template targets use
# the default model's tokenizer and template when it is pulled (CACHET_FUZZ_MODEL overrides).
set -euo pipefail
cd "$(dirname "$0")/.."

MINUTES=${MINUTES:-10}
TARGETS=${TARGETS:-"gguf tokenizer chat_template openai_request webhook_payload tool_calls"}
JOBS=${JOBS:-1}
BUILT=${BUILT:-0}
BIN_DIR=fuzz/target/x86_64-unknown-linux-gnu/release

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked

failed=()
for t in $TARGETS; do
  work=target/fuzz/corpus/$t
  artifacts=target/fuzz/artifacts/$t
  mkdir -p "$work" "$artifacts"
  cp -n fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
  echo "== $t: $MINUTES min"
  if [ "$BUILT" = 1 ]; then run=("$BIN_DIR/$t" "$work"); else run=(cargo +nightly fuzz run --fuzz-dir fuzz "$t" "$work" --); fi
  # More than one job: libFuzzer's children write fuzz-<n>.log in the working directory.
  if [ "$JOBS" -gt 1 ]; then run+=(-jobs="$JOBS" -workers="$JOBS"); fi
  if "${run[@]}" \
      -max_total_time=$((MINUTES * 60)) -rss_limit_mb=2048 -timeout=10 \
      -artifact_prefix="$artifacts/" -print_final_stats=1 2>&1 | tee "target/fuzz/$t.log" | grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY)'; then
    :
  fi
  if [ -n "$(ls -A "$artifacts")" ] || grep -q -E '==[0-9]+==ERROR|^SUMMARY: libFuzzer' "target/fuzz/$t.log"; then
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing found problems in: ${failed[*]} (inputs in target/fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzzing: no crash, hang or out-of-memory in $MINUTES min per target"
