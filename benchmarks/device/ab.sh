#!/usr/bin/env bash
# One device call of A/B measurements behind the results in docs/kernel.md (tests first, then timings):
#  - the sm_90 grouped GEMM's variants (paged_moe_bench --variant: grid | pair | pair-inflight | wide, with
#    -tiles for tile-major order and -persistent) at prefill token counts: VARIANTS="grid grid-tiles";
#  - paged placement (shuffled pages / whole experts shuffled / identity) against contiguous at decode sizes
#    (PLACEMENTS=none skips them).
#   OUT=/some/dir BIN=build/kern2 bash benchmarks/device/ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/kern}
OUT=${OUT:-/tmp/ab}
mkdir -p "$OUT"
TEST=$BIN/tests/device/paged_moe_device_test
BENCH=$BIN/benchmarks/device/paged_moe_bench
rc=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/ab.log"
if [[ ${SKIP_TESTS:-0} != 1 ]]; then
  "$TEST" "[small]" >>"$OUT/ab.log" 2>&1 || { rc=1; echo "small tests FAILED"; }
  compute-sanitizer --tool memcheck --error-exitcode 3 "$TEST" "[sanitize]" >"$OUT/sanitizer.log" 2>&1 || rc=1
  compute-sanitizer --tool racecheck --error-exitcode 3 "$TEST" "[sanitize]" >>"$OUT/sanitizer.log" 2>&1 || rc=1
  grep -E "SUMMARY|passed|failed" "$OUT/sanitizer.log"
  "$TEST" "[models]" >>"$OUT/ab.log" 2>&1 || { rc=1; echo "model tests FAILED"; }
  [[ -x $BIN/tests/device_loader/device_loader_tests ]] &&
    { $BIN/tests/device_loader/device_loader_tests >>"$OUT/ab.log" 2>&1 || { rc=1; echo "loader test FAILED"; }; }
  grep -E "test cases|assertions" "$OUT/ab.log"
fi
for v in ${VARIANTS:-grid grid-tiles}; do
  "$BENCH" --json "$OUT/ab_$v.json" --tokens ${AB_TOKENS:-1024,4096,16384} --variant "$v" | grep -v "^NVIDIA" |
    sed "s/^/$v /" | tee -a "$OUT/ab.log"
done
for pl in ${PLACEMENTS:-shuffled experts identity}; do
  [[ $pl == none ]] && continue
  "$BENCH" --json "$OUT/pl_$pl.json" --models ${PL_MODELS:-qwen3,qwen15} --tokens ${PL_TOKENS:-1,16,33,64} \
    --placement "$pl" | grep -v "^NVIDIA" | sed "s/^/$pl /" | tee -a "$OUT/ab.log"
done
exit $rc
