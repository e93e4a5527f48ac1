#!/usr/bin/env bash
# One device call: device tests (+ compute-sanitizer on the small case), kernel benchmark, PyTorch baseline,
# merged results. Uses binaries in $BIN (default build/kern; build them with the `gpu` preset, or carry them),
# else configures and builds there (needs Catch2 for the tests).
#   OUT=/some/dir bash benchmarks/device/run.sh            # everything
#   QUICK=1 ...                                             # fewer token counts (smoke run)
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
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
rc=0
if [[ ${SKIP_TESTS:-0} != 1 ]]; then
  "$TEST" "[small]" 2>&1 | tee "$OUT/tests_small.log" || rc=1
  if command -v compute-sanitizer >/dev/null && [[ ${SKIP_SANITIZER:-0} != 1 ]]; then
    compute-sanitizer --tool memcheck --error-exitcode 3 "$TEST" "[sanitize]" >"$OUT/memcheck.log" 2>&1 || rc=1
    compute-sanitizer --tool racecheck --error-exitcode 3 "$TEST" "[sanitize]" >"$OUT/racecheck.log" 2>&1 || rc=1
    tail -n 3 "$OUT/memcheck.log" "$OUT/racecheck.log"
  fi
  "$TEST" "[models]" 2>&1 | tee "$OUT/tests_models.log" || rc=1
fi
"$BENCH" --json "$OUT/bench.json" --tokens "$TOKENS" ${MODELS:+--models $MODELS} || rc=1
PYTHONUNBUFFERED=1 python3 benchmarks/device/torch_baseline.py --json "$OUT/torch.json" --tokens "$TOKENS" \
  ${MODELS:+--models $MODELS} || rc=1
python3 benchmarks/device/report.py --bench "$OUT/bench.json" --torch "$OUT/torch.json" \
  --out-json "$OUT/paged_moe_h200.json" --out-md "$OUT/paged_moe_h200.md" \
  --commit "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" --date "$(date -u +%F)" || rc=1
exit $rc
