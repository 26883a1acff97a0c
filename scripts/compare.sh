#!/usr/bin/env bash
# cachet vs llama.cpp's llama-server, side by side on this machine: the same GGUF, the same
# thread count and the same KV capacity, the same cachet-bench scenarios against each in one
# run (alternating which goes first), then the scheduling experiment (cachet with aggressive
# batching, baseline FCFS and SLO-oriented scheduling on the peak workload). In the side-by-side
# run cachet never refuses (overload_factor 0), as llama-server queues everything; the
# experiment runs the SLO configuration with its admission control.
#
# SLOs calibrated to the machine (CALIBRATE=1, the default): cachet-bench first measures lone
# requests of the peak scenario on both servers; cachet is then configured with that calibrated
# SLO as its interactive targets (an operator sets the targets their users need; llama-server
# has no such setting), and every scenario is reported against both the fixed SLO (TTFT 3 s,
# ITL 250 ms) and its own calibrated one, with open-loop arrivals scaled to the machine's
# capacity (bench/src/calibrate.rs, docs/benchmarks.md).
#
#   scripts/compare.sh          (CACHET_BIN=path runs that cachet binary instead of this tree's,
#                                to compare two builds against the same llama-server;
#                                environment: THREADS=2 CTX=16384 SLOTS=4 SCENARIOS=all
#                                SCALE=1 SEED=1 OUT=target/compare EXPERIMENT=1 SIDE_BY_SIDE=1
#                                CALIBRATE=1; MODEL=file.gguf (default: the default model);
#                                LLAMA_ARGS: more llama-server options, e.g.
#                                "--spec-type ngram-mod" for its draftless speculation;
#                                CACHET_RUST_LOG=warn is cachet's log filter:
#                                warn,cachet::pass=trace logs every forward pass)
#
# Writes $OUT/side-by-side/ and $OUT/experiment/ (results.json, results.md, ttft.svg,
# configs.svg) and $OUT/summary.md. Needs llama-server: $LLAMA_BIN, else
# ~/.cache/cachet-peer/llama.cpp/build/bin, else built from $LLAMA_SRC (scripts/llama-peer.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
CTX=${CTX:-16384}
SLOTS=${SLOTS:-4}
SCENARIOS=${SCENARIOS:-all}
SCALE=${SCALE:-1}
SEED=${SEED:-1}
OUT=${OUT:-target/compare}
EXPERIMENT=${EXPERIMENT:-1}
SIDE_BY_SIDE=${SIDE_BY_SIDE:-1}
CALIBRATE=${CALIBRATE:-1}
CACHET_PORT=${CACHET_PORT:-18080}
LLAMA_PORT=${LLAMA_PORT:-18081}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

BIN=$(scripts/llama-peer.sh)
cargo build -q --release -p cachet-api -p cachet-bench
CACHET=${CACHET_BIN:-$PWD/target/release/cachet}
BENCH=$PWD/target/release/cachet-bench
MODEL=${MODEL:-$($CACHET models pull 2>/dev/null | tail -n 1)}
MODEL_ID=$(basename "$MODEL" .gguf)

DATA="$OUT/cachet-data"
rm -rf "$DATA"
mkdir -p "$DATA"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# shellcheck source=scripts/lib.sh
. scripts/lib.sh

# cachet: the same KV capacity as llama-server's CTX, the given policy and batch settings.
start_cachet() { # name, then CACHET_* settings
  local name=$1; shift
  env "$@" CACHET_SERVER__BIND="127.0.0.1:$CACHET_PORT" CACHET_MODEL__PATH="$MODEL" \
    CACHET_MODEL__THREADS="$THREADS" CACHET_ENGINE__POOL_TOKENS="$CTX" RUST_LOG="${CACHET_RUST_LOG:-warn}" \
    "$CACHET" serve --data-dir "$DATA" > "$OUT/cachet-$name.log" 2>&1 &
  CACHET_PID=$!
  PIDS+=("$CACHET_PID")
  wait_http "http://127.0.0.1:$CACHET_PORT/readyz" cachet "$CACHET_PID" "$OUT/cachet-$name.log"
}
stop_cachet() { kill "$CACHET_PID"; wait "$CACHET_PID" 2>/dev/null || true; }

# A tenant and its token (the private Postgres is started by cachet itself when needed).
start_cachet setup
TENANT=$("$CACHET" tenants create bench --data-dir "$DATA" 2>/dev/null | tail -n 1)
TOKEN=$("$CACHET" token issue --tenant "$TENANT" --ttl 12h --data-dir "$DATA" 2>/dev/null | tail -n 1)
stop_cachet

machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
{
  echo "# cachet vs llama-server ($(date -u +%Y-%m-%d), $machine)"
  echo
  echo "Model: $MODEL_ID; $THREADS threads each; KV capacity $CTX tokens each (llama-server: $SLOTS slots,"
  echo "unified KV); seed $SEED; scale $SCALE."
} > "$OUT/summary.md"

start_llama() {
  # LLAMA_ARGS is split into words on purpose.
  # shellcheck disable=SC2086
  "$BIN/llama-server" -m "$MODEL" -a "$MODEL_ID" -t "$THREADS" -c "$CTX" -np "$SLOTS" --kv-unified \
    --host 127.0.0.1 --port "$LLAMA_PORT" --no-webui ${LLAMA_ARGS:-} > "$OUT/llama-server.log" 2>&1 &
  LLAMA_PID=$!
  PIDS+=("$LLAMA_PID")
  wait_http "http://127.0.0.1:$LLAMA_PORT/health" llama-server "$LLAMA_PID" "$OUT/llama-server.log"
}
stop_llama() { kill "$LLAMA_PID"; wait "$LLAMA_PID" 2>/dev/null || true; }
TARGETS=(--target "cachet=http://127.0.0.1:$CACHET_PORT@$MODEL_ID" --target "llama-server=http://127.0.0.1:$LLAMA_PORT@$MODEL_ID"
  --target-api-key "cachet=$TOKEN")

# The calibrated SLO of the peak scenario becomes cachet's interactive targets.
SLO_ENV=()
CAL_FLAG=(--no-calibrate)
if [ "$CALIBRATE" = 1 ]; then
  start_cachet calibrate
  start_llama
  read -r _ CAL_TTFT CAL_ITL CAL_CAPACITY < <("$BENCH" run "${TARGETS[@]}" --scenario peak --seed "$SEED" \
    --calibrate-only --out "$OUT/calibration" | tail -n 1)
  stop_llama
  stop_cachet
  SLO_ENV=(CACHET_ENGINE__INTERACTIVE_TTFT_MS="${CAL_TTFT%.*}" CACHET_ENGINE__INTERACTIVE_ITL_MS="${CAL_ITL%.*}")
  CAL_FLAG=()
  echo "calibrated on peak: TTFT <= $CAL_TTFT ms, ITL <= $CAL_ITL ms, capacity $CAL_CAPACITY req/s" >&2
  {
    echo
    echo "Calibrated SLO of the peak scenario (cachet's interactive targets in every configuration below):"
    echo "TTFT ≤ $CAL_TTFT ms, mean ITL ≤ $CAL_ITL ms; one-at-a-time capacity $CAL_CAPACITY req/s."
  } >> "$OUT/summary.md"
fi

if [ "$SIDE_BY_SIDE" = 1 ]; then
  start_cachet default CACHET_ENGINE__OVERLOAD_FACTOR=0 "${SLO_ENV[@]}"
  start_llama
  "$BENCH" run "${TARGETS[@]}" "${CAL_FLAG[@]}" \
    --scenario "$SCENARIOS" --seed "$SEED" --scale "$SCALE" --out "$OUT/side-by-side"
  stop_llama
  stop_cachet
  { echo; echo "## Side by side"; echo; cat "$OUT/side-by-side/results.md"; } >> "$OUT/summary.md"
fi

if [ "$EXPERIMENT" = 1 ]; then
  # The same peak workload against four scheduler configurations (the last also with retrying clients), one server at a time.
  run_config() { # label, then CACHET_* settings (RETRIES=n: clients retry refusals n times)
    local label=$1; shift
    start_cachet "$label" "$@" "${SLO_ENV[@]}"
    # The peak workload at the rate calibrated above, judged by the SLO calibrated above (the
    # same in every configuration).
    local fixed=()
    if [ "$CALIBRATE" = 1 ]; then
      fixed=(--rate "$(awk -v c="$CAL_CAPACITY" 'BEGIN { printf "%.6f", 0.8 * c }')" --slo-ttft-ms "$CAL_TTFT"
        --slo-itl-ms "$CAL_ITL")
    fi
    "$BENCH" run --target "cachet=http://127.0.0.1:$CACHET_PORT@$MODEL_ID" --api-key "$TOKEN" --no-calibrate \
      "${fixed[@]}" --scenario peak --seed "$SEED" --scale "$SCALE" --label "$label" --out "$OUT/experiment-$label" \
      --retries "${RETRIES:-0}"
    stop_cachet
  }
  run_config aggressive CACHET_ENGINE__POLICY=fcfs CACHET_ENGINE__TOKEN_BUDGET=4096 CACHET_ENGINE__MAX_RUNNING=64 \
    CACHET_ENGINE__OVERLOAD_FACTOR=0 CACHET_ENGINE__PACE_PREFILL=false
  run_config baseline CACHET_ENGINE__POLICY=fcfs CACHET_ENGINE__OVERLOAD_FACTOR=0 CACHET_ENGINE__PACE_PREFILL=false
  # The SLO configuration without prefill pacing, to show what pacing alone changes.
  run_config slo-unpaced CACHET_ENGINE__POLICY=slo CACHET_ENGINE__PACE_PREFILL=false
  run_config slo CACHET_ENGINE__POLICY=slo
  # The same, with clients that come back after Retry-After (up to 3 times), as SDKs do.
  RETRIES=3 run_config slo-retry CACHET_ENGINE__POLICY=slo
  "$BENCH" report --in "$OUT/experiment-aggressive/results.json" --in "$OUT/experiment-baseline/results.json" \
    --in "$OUT/experiment-slo-unpaced/results.json" --in "$OUT/experiment-slo/results.json" \
    --in "$OUT/experiment-slo-retry/results.json" --out "$OUT/experiment"
  { echo; echo "## Scheduling experiment (peak)"; echo; cat "$OUT/experiment/results.md"; } >> "$OUT/summary.md"
fi
echo "wrote $OUT/summary.md" >&2
