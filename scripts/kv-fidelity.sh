#!/usr/bin/env bash
# K/V in 8 bits against f16, cachet beside llama.cpp on the same GGUF and the same text (issue
# 54): the mean KL divergence of next-token distributions over windows of real code, scored at
# the positions llama.cpp's llama-perplexity scores (each window's second half).
#   cachet:    cachet bench --kv-kl TEXT --kl-ctx CTX --kl-windows WINDOWS --kv-format q8_0
#   llama.cpp: llama-perplexity -c CTX -fa on, once with f16 K/V (--kl-divergence-base), then with
#              -ctk q8_0 -ctv q8_0 (--kl-divergence)
#
#   LLAMA_BIN=dir scripts/kv-fidelity.sh   [MODEL=file.gguf] [CTX=2048] [WINDOWS=4] [THREADS=2]
#                                          [TEXT=file] [OUT=target/kv-fidelity]
#
# TEXT defaults to this repository's engine sources (engine/src/runtime/*.rs at HEAD, in name
# order): code an agent reads, WINDOWS × CTX tokens of it. Needs llama-perplexity beside the
# other llama.cpp binaries (scripts/llama-peer.sh builds it).
set -euo pipefail
cd "$(dirname "$0")/.."
CTX=${CTX:-2048}
WINDOWS=${WINDOWS:-4}
THREADS=${THREADS:-2}
OUT=${OUT:-target/kv-fidelity}
mkdir -p "$OUT"
BIN=$(scripts/llama-peer.sh)
[ -x "$BIN/llama-perplexity" ] || { echo "no llama-perplexity in $BIN (scripts/llama-peer.sh builds it)" >&2; exit 1; }
cargo build -q --release -p cachet-api
CACHET=target/release/cachet
MODEL=${MODEL:-$($CACHET models pull 2>/dev/null | tail -n 1)}
TEXT=${TEXT:-$OUT/text.txt}
if [ ! -s "$TEXT" ]; then
  # About 3.5 bytes a token of Rust: enough for WINDOWS windows and a spare one.
  for f in $(git ls-files 'engine/src/runtime/*.rs' | sort); do git show "HEAD:$f"; done > "$OUT/all.txt"
  head -c $(((WINDOWS + 1) * CTX * 4)) "$OUT/all.txt" > "$TEXT"
fi
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== llama.cpp: f16 K/V (the base), then q8_0 K/V against it"
"$BIN/llama-perplexity" -m "$MODEL" -f "$TEXT" -c "$CTX" --chunks "$WINDOWS" -t "$THREADS" -fa on \
  --kl-divergence-base "$OUT/llama-f16.kld" > "$OUT/llama-f16.log" 2>&1
"$BIN/llama-perplexity" -m "$MODEL" -f "$TEXT" -c "$CTX" --chunks "$WINDOWS" -t "$THREADS" -fa on \
  -ctk q8_0 -ctv q8_0 --kl-divergence-base "$OUT/llama-f16.kld" --kl-divergence > "$OUT/llama-q8_0.log" 2>&1
grep -E "Mean +KLD|99\.0% +KLD|Maximum KLD|Same top p" "$OUT/llama-q8_0.log" | sed 's/^/llama.cpp  /'

echo "== cachet: q8_0 K/V against f16"
RUST_LOG=warn "$CACHET" bench --model "$MODEL" --threads "$THREADS" --kv-kl "$TEXT" --kl-ctx "$CTX" \
  --kl-windows "$WINDOWS" --kv-format q8_0 2> "$OUT/cachet.log" | tee "$OUT/cachet.md"
