#!/usr/bin/env bash
# Speculative decoding where it may not help: cachet-bench scenarios against cachet with drafting
# (its default) and without (`[engine] draft_tokens = 0`), one server at a time on the same model,
# ROUNDS rounds alternating which goes first; one merged report with both as configurations
# (docs/benchmarks.md has a run). The issue's bar: no scenario worse than 0.97x without drafting.
#
#   scripts/spec-regress.sh   (environment: SCENARIOS=repeated-context,unrelated,long-input,long-output,peak,agent,code-edit,code-edit-tools
#                              ROUNDS=1 THREADS=2 SEED=1 OUT=target/spec-regress)
set -euo pipefail
cd "$(dirname "$0")/.."
SCENARIOS=${SCENARIOS:-repeated-context,unrelated,long-input,long-output,peak,agent,code-edit,code-edit-tools}
ROUNDS=${ROUNDS:-1}
THREADS=${THREADS:-2}
SEED=${SEED:-1}
OUT=${OUT:-target/spec-regress}
rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cargo build -q --release -p cachet-api -p cachet-bench
CACHET=$PWD/target/release/cachet
BENCH=$PWD/target/release/cachet-bench
MODEL=$($CACHET models pull 2>/dev/null | tail -n 1)
MODEL_ID=$(basename "$MODEL" .gguf)
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

run() { # name, draft_tokens, round
  # Never refusing (as compare.sh's side-by-side run): what is compared is speed, not admission.
  CACHET_ENGINE__DRAFT_TOKENS=$2 CACHET_ENGINE__OVERLOAD_FACTOR=0 CACHET_MODEL__PATH="$MODEL" \
    CACHET_MODEL__THREADS="$THREADS" start_cachet "$CACHET" "spec-$1"
  local token
  token=$(tenant_token bench)
  "$BENCH" run --target "$1=$BASE@$MODEL_ID" --api-key "$token" --no-calibrate --scenario "$SCENARIOS" \
    --seed "$SEED" --out "$OUT/$1-$3" > "$OUT/$1-$3.log" 2>&1
  stop_cachet
  echo "round $3: $1 done" >&2
}
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then run drafting 16 "$r"; run plain 0 "$r"; else run plain 0 "$r"; run drafting 16 "$r"; fi
done
inputs=()
for f in "$OUT"/*-*/results.json; do inputs+=(--in "$f"); done
"$BENCH" report "${inputs[@]}" --out "$OUT/merged"
echo "wrote $OUT/merged/results.md" >&2
