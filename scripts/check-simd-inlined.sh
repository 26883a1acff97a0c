#!/usr/bin/env bash
# Every SIMD intrinsic in cachet's kernels is inlined into its kernel. One that is left as a
# function of its own (LLVM did not inline a closure that holds it into a function with the CPU
# features it needs) turns each instruction into a call: on 2026-12-07 a small change in the
# Q5_0 decode loop left the default model decoding at 4 tokens/s instead of 68, with every test
# passing (results are the same, only slow). This looks for such functions in the binary:
# AVX, AVX2, AVX-512, FMA and F16C intrinsics compiled out of line. Runs in scripts/test.sh on
# the test build, and on any binary: scripts/check-simd-inlined.sh [BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/debug/cachet}
[ -x "$BIN" ] || { echo "no binary at $BIN" >&2; exit 1; }
# A dependency's own (not a kernel): aho-corasick's Teddy searcher builder loads its masks with
# an out-of-line `_mm256_loadu_si256` in the debug profile.
ALLOW='^core::core_arch::x86::avx::_mm256_loadu_si256$'
found=$(nm -C "$BIN" | awk '$2 == "t" || $2 == "T" { $1 = ""; $2 = ""; sub(/^ +/, ""); print }' |
  grep -E '^core::core_arch::x86::(avx|avx2|avx512[a-z0-9_]*|fma|f16c)::_mm' | sort -u | grep -vE "$ALLOW" || true)
if [ -n "$found" ]; then
  echo "SIMD intrinsics compiled as functions of their own in $BIN (a kernel calls them instead of" >&2
  echo "inlining them; look for a closure holding intrinsics in a helper without target features):" >&2
  echo "$found" >&2
  exit 1
fi
echo "every SIMD intrinsic in $BIN is inlined"
