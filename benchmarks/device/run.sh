#!/usr/bin/env bash
# One device call: device tests (+ compute-sanitizer on the small case), kernel benchmark, PyTorch baseline,
# merged results. Uses binaries in $BIN (default build/kern; build them with the `gpu` preset, or carry them),
# else configures and builds there (needs Catch2 for the tests).
#   OUT=/some/dir bash benchmarks/device/run.sh     # everything (tests, sanitizers, benchmark, torch, report)
# Knobs: TOKENS=1,16 MODELS=qwen15 (subsets), VARIANT=pair-persistent (grouped GEMM variant, see the benchmark), SKIP_TESTS=1, SKIP_SANITIZER=1, SKIP_TORCH=1, DIAG=1 (ncu per-kernel
# times + SASS of the decode kernel into diag.log), COMMIT=<sha> (recorded in the results).
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/kern}
OUT=${OUT:-docs/results}
mkdir -p "$OUT"
if [[ ! -x $BIN/benchmarks/device/paged_moe_bench ]]; then
  cmake -S . -B "$BIN" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAMOEBA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DAMOEBA_BUILD_BENCHMARKS=ON && cmake --build "$BIN" --target paged_moe_bench paged_moe_device_test || exit 1
fi
TEST=$BIN/tests/device/paged_moe_device_test
BENCH=$BIN/benchmarks/device/paged_moe_bench
TOKENS=${TOKENS:-1,3,16,33,64,256,1024,4096,16384}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/tests.log"
rc=0
if [[ ${SKIP_TESTS:-0} != 1 ]]; then
  "$TEST" "[small]" 2>&1 | tee -a "$OUT/tests.log" || rc=1
  if command -v compute-sanitizer >/dev/null && [[ ${SKIP_SANITIZER:-0} != 1 ]]; then
    compute-sanitizer --tool memcheck --error-exitcode 3 "$TEST" "[sanitize]" >"$OUT/sanitizer.log" 2>&1 || rc=1
    compute-sanitizer --tool racecheck --error-exitcode 3 "$TEST" "[sanitize]" >>"$OUT/sanitizer.log" 2>&1 || rc=1
    grep -E "SUMMARY|passed|failed" "$OUT/sanitizer.log"
  fi
  "$TEST" "[models]" 2>&1 | tee -a "$OUT/tests.log" || rc=1
  "$TEST" "[variants]" 2>&1 | tee -a "$OUT/tests.log" || rc=1
  if [[ -x $BIN/tests/device_loader/device_loader_tests ]]; then
    "$BIN/tests/device_loader/device_loader_tests" 2>&1 | tail -3 | tee -a "$OUT/tests.log" || rc=1
  fi
fi
if [[ ${DIAG:-0} == 1 ]]; then  # per-kernel times (ncu, caches flushed) and the decode kernel's SASS
  ncu --clock-control none -k 'regex:gemv|gemm|routing|combine' --launch-count 24 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum \
    "$BENCH" --json /dev/null --models qwen15 --tokens ${DIAG_TOKENS:-1} --sets 1 >"$OUT/diag.log" 2>&1
  cuobjdump -sass -fun '_ZN6amoeba7kernels6decode11gemv_kernelINS0_5PagedELNS1_5StageE0ELi1EEEvNS0_9MoeParamsIT_EE' \
    "$BENCH" | grep -E "LDG|HMMA|BRA|BAR" >>"$OUT/diag.log" 2>&1
fi
"$BENCH" --json "$OUT/bench.json" --tokens "$TOKENS" ${MODELS:+--models $MODELS} ${VARIANT:+--variant $VARIANT} || rc=1
if [[ ${SKIP_TORCH:-0} != 1 ]]; then
  PYTHONUNBUFFERED=1 python3 benchmarks/device/torch_baseline.py --json "$OUT/torch.json" --tokens "$TOKENS" \
    ${MODELS:+--models $MODELS} || rc=1
fi
python3 benchmarks/device/report.py --bench "$OUT/bench.json" --torch "$OUT/torch.json" \
  --out-json "$OUT/paged_moe_h200.json" --out-md "$OUT/paged_moe_h200.md" \
  --commit "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" --date "$(date -u +%F)" || rc=1
exit $rc
