#!/usr/bin/env bash
# Issue 54's capacity run: how many tenants' repository contexts one KV pool of a fixed memory
# keeps warm, with f16 K/V and with q8_0 K/V. For each format: `cachet serve` (release build, the
# default model, private Postgres) with `[engine] pool_mib = POOL_MIB`, TENANTS tenants each with
# its own ~CONTEXT-token context (stretches of this repository's sources), scripts/kv_capacity.py
# (every tenant once, then probes most recent first). Prints a table; docs/performance.md has a
# run.
#
#   scripts/kv-capacity.sh   (environment: POOL_MIB=128 CONTEXT=1000 TENANTS=24 FORMATS="f16 q8_0"
#                             MODEL=file.gguf CACHET_BIN=target/release/cachet OUT=target/kv-capacity)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
POOL_MIB=${POOL_MIB:-128}
CONTEXT=${CONTEXT:-1000}
TENANTS=${TENANTS:-24}
FORMATS=${FORMATS:-f16 q8_0}
OUT=${OUT:-target/kv-capacity}
BIN=${CACHET_BIN:-target/release/cachet}
[ -x "$BIN" ] || cargo build -q --release -p cachet-api
mkdir -p "$OUT"
MODEL_ARGS=()
[ -n "${MODEL:-}" ] && MODEL_ARGS=(--model "$MODEL")
# The contexts: this repository's Rust sources at HEAD, in name order.
for f in $(git ls-files '*.rs' | sort); do git show "HEAD:$f"; done > "$OUT/text.txt"
for fmt in $FORMATS; do
  printf '[engine]\npool_mib = %s\nkv_format = "%s"\n' "$POOL_MIB" "$fmt" > "$OUT/$fmt.toml"
  start_cachet "$BIN" "capacity-$fmt" --config "$OUT/$fmt.toml" "${MODEL_ARGS[@]}"
  tokens=()
  for i in $(seq "$TENANTS"); do tokens+=("$(tenant_token "repo-$i")"); done
  model=$(curl -fs -H "Authorization: Bearer ${tokens[0]}" "$BASE/v1/models" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
  # The pool's size in tokens: /metrics (the operator's).
  operator=$("$BIN" token issue --operator --ttl 1h --data-dir "$DATA" 2>/dev/null | tail -n 1)
  pool=$(curl -fs -H "Authorization: Bearer $operator" "$BASE/metrics" | awk '$1 == "cachet:kv_cache_capacity_tokens" { print $2 }')
  echo "== $fmt: pool of $POOL_MIB MiB ($pool tokens), $TENANTS tenants of ~$CONTEXT tokens" >&2
  python3 scripts/kv_capacity.py "$BASE" "$model" "$CONTEXT" "$OUT/text.txt" "${tokens[@]}" |
    python3 -c 'import json, sys; r = json.load(sys.stdin); r["pool_tokens"] = sys.argv[1]; print(json.dumps(r))' "$pool" \
    > "$OUT/$fmt.json"
  stop_cachet
  PID=
done
python3 - "$OUT" $FORMATS <<'PY'
import json, sys
out, formats = sys.argv[1], sys.argv[2:]
rows = {f: json.load(open(f"{out}/{f}.json")) for f in formats}
print("| K/V format | pool tokens | tenants | contexts held warm | of f16's | warm probe (s) | cold probe (s) |")
print("|---|---:|---:|---:|---:|---:|---:|")
base = rows.get("f16", {}).get("held_warm")
for f, r in rows.items():
    ratio = f"{r['held_warm'] / base:.2f}x" if base else "-"
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    print(f"| {f} | {r['pool_tokens']} | {r['tenants']} (~{r['context_tokens']:.0f} tokens each) | {r['held_warm']} | "
          f"{ratio} | {fmt(r['warm_probe_s'])} | {fmt(r['cold_probe_s'])} |")
PY
