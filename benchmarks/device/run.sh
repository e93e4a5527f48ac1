#!/usr/bin/env bash
# One device call that checks and measures PagedMoe: device tests (+ compute-sanitizer memcheck and racecheck
# on the small case), the benchmark in $PROCESSES separate processes (each: contiguous and the paged views of
# every placement × page-permutation seed, alternating), the PyTorch bf16 matmul rate in a burst and sustained
# (and, if asked, the torch pipeline baseline), and the merged report. Writes its results only under $OUT.
#   OUT=/some/dir BIN=/folder/with/binaries bash benchmarks/device/run.sh
# $BIN holds paged_moe_bench and paged_moe_device_test (built elsewhere with the gpu preset and carried); without
# them (BIN unset: build/gpu) both are built here with the gpu preset and copied to build/gpu/bin. Knobs: TOKENS, MODELS, SEEDS (1,2,3), PLACEMENTS (shuffled,adjacent), PROCESSES (3),
# SECONDS_PER_VIEW (0.1), CONFIGS (default; e.g. default,t8w8u2,t8w4u3 for an A/B of decode tiles: paged_moe_bench's bf16_configs()),
# SKIP_TESTS=1, SKIP_SANITIZER=1, TEST_TAGS ("[small] [models]"), TORCH_MODELS (torch pipeline baseline
# models; none by default, the matmul rate is always measured), SUSTAINED=0 (skips the matmul rate sustained
# at the power limit, matmul_sustained.py, about 20 s), DIAG=1 (ncu per-kernel time and DRAM throughput of a
# few decode cases into diag.log, at DIAG_TOKENS tokens: 16), SANITIZER_TIMEOUT (150 s per compute-sanitizer tool),
# COMMIT, COMMAND (the command the report names).
set -uo pipefail
: "${OUT:?OUT must name the folder for logs and results}"
cd "$(dirname "$0")/../.." || exit 1
BIN=${BIN:-build/gpu}
mkdir -p "$OUT"
if [[ ! -x $BIN/paged_moe_bench || ! -x $BIN/paged_moe_device_test ]]; then
  cmake --preset gpu >/dev/null && cmake --build --preset gpu --target paged_moe_bench paged_moe_device_test || exit 1
  mkdir -p build/gpu/bin
  cp build/gpu/benchmarks/device/paged_moe_bench build/gpu/tests/device/paged_moe_device_test build/gpu/bin/
  BIN=build/gpu/bin
fi
TEST=$BIN/paged_moe_device_test
BENCH=$BIN/paged_moe_bench
TOKENS=${TOKENS:-1,3,16,33,64,256,1024,4096,16384}
MODELS=${MODELS:-qwen15,qwen15_shared,qwen3,mixtral}
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/tests.log"
rc=0
if [[ ${SKIP_TESTS:-0} != 1 ]]; then
  for tag in ${TEST_TAGS:-"[small]" "[models]"}; do
    "$TEST" "$tag" >>"$OUT/tests.log" 2>&1 || { rc=1; echo "tests $tag FAILED"; }
    stamp "tests $tag: $(grep -E "test cases" "$OUT/tests.log" | tail -1)"
  done
fi
benches=()
for i in $(seq 1 "${PROCESSES:-3}"); do
  "$BENCH" --json "$OUT/bench_$i.json" --tokens "$TOKENS" --models "$MODELS" --seed "${SEEDS:-1,2,3}" \
    --placement "${PLACEMENTS:-shuffled,adjacent}" --seconds "${SECONDS_PER_VIEW:-0.1}" \
    --config "${CONFIGS:-default}" >"$OUT/bench_$i.log" 2>&1 ||
    { rc=1; tail -5 "$OUT/bench_$i.log"; }
  benches+=("$OUT/bench_$i.json")
  stamp "benchmark process $i"
done
if [[ ${DIAG:-0} == 1 ]]; then
  for m in qwen3 mixtral; do
    ncu --clock-control none -k regex:gemv --launch-count 8 \
      --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum \
      "$BENCH" --json /dev/null --models $m --tokens ${DIAG_TOKENS:-16} --sets 1 --seed 1 --placement shuffled \
      --config "${CONFIGS:-default}" --seconds 0.001 >>"$OUT/diag.log" 2>&1
  done
  stamp "diag"
fi
PYTHONUNBUFFERED=1 python3 benchmarks/device/torch_baseline.py --json "$OUT/torch.json" --tokens "$TOKENS" \
  --models "${TORCH_MODELS:-}" >"$OUT/torch.log" 2>&1 || rc=1
stamp "torch"
# The matmul rate sustained at the power limit, as the layer runs (SUSTAINED=0 skips it).
sustained=()
if [[ ${SUSTAINED:-1} == 1 ]] && python3 benchmarks/device/matmul_sustained.py --reps 3 --seconds 3 \
  --json "$OUT/matmul_sustained.json" >"$OUT/matmul_sustained.log" 2>&1; then
  sustained=(--sustained "$OUT/matmul_sustained.json")
fi
stamp "sustained matmul: $(tail -1 "$OUT/matmul_sustained.log" 2>/dev/null)"
python3 benchmarks/device/report.py --bench "${benches[@]}" --torch "$OUT/torch.json" "${sustained[@]}" \
  --out-json "$OUT/paged_moe_h200.json" --out-md "$OUT/paged_moe_h200.md" \
  --commit "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" --date "$(date -u +%F)" \
  --command "${COMMAND:-OUT=\$OUT bash benchmarks/device/run.sh}" >/dev/null || rc=1
# Last, so that a slow sanitizer never costs the measurements.
if [[ ${SKIP_TESTS:-0} != 1 && ${SKIP_SANITIZER:-0} != 1 ]] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    timeout "${SANITIZER_TIMEOUT:-150}" compute-sanitizer --tool $tool --error-exitcode 3 "$TEST" "[sanitize]" \
      >>"$OUT/sanitizer.log" 2>&1 || { rc=1; echo "$tool: failed or timed out"; }
  done
  stamp "sanitizers: $(grep -cE "ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards" "$OUT/sanitizer.log") of 2 clean"
fi
exit $rc
