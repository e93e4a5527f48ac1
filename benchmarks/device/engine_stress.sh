#!/usr/bin/env bash
# The CUDA backend's churn test under GPU contention: another load keeps the GPU busy while
# device_engine_tests' "evictions and restores at every step" case runs again and again, so that work the
# backend queues on different streams lands in orders a quiet GPU never shows. Prints how many runs failed
# and the first failure's lines; exits non-zero if any did. LOAD=bench (default): paged_moe_bench in a loop;
# LOAD=tests: paged_moe_device_test "[small]" and quant_moe_device_test "[small]" in a loop (CPU references
# and GPU kernels, the load the plain suites give each other under gpu_tests.sh PARALLEL=1).
#   BIN=.gpu OUT=$OUT [DURATION=100] [LOAD=bench|tests] bash benchmarks/device/engine_stress.sh
# $BIN: device_engine_tests and the load's binaries from the ci or gpu preset, libfmt.so.9 beside them.
source "$(dirname "$0")/device_common.sh"
case_name="cuda backend: evictions and restores at every step leave the tokens bit-identical"
load() {
  while true; do
    if [[ "${LOAD:-bench}" == tests ]]; then
      "$BIN/paged_moe_device_test" "[small]" >/dev/null 2>&1 &
      "$BIN/quant_moe_device_test" "[small]" >/dev/null 2>&1
      wait
    else
      "$BIN/paged_moe_bench" --models mixtral --tokens 64,256 --seconds 0.5 --config default \
        --json /dev/null >/dev/null 2>&1
    fi
  done
}
load &
load_pid=$!
end=$(($(date +%s) + ${DURATION:-100}))
runs=0
failed=0
while [[ $(date +%s) -lt $end ]]; do
  runs=$((runs + 1))
  if ! timeout 100 "$BIN/device_engine_tests" "$case_name" >"$OUT/stress_run.log" 2>&1; then
    failed=$((failed + 1))
    [[ -f "$OUT/stress_fail.log" ]] || cp "$OUT/stress_run.log" "$OUT/stress_fail.log"
  fi
done
kill "$load_pid" 2>/dev/null
pkill -f "$BIN/(paged_moe_bench|paged_moe_device_test|quant_moe_device_test)" 2>/dev/null
wait 2>/dev/null
rm -f "$OUT/stress_run.log"
echo "churn case under LOAD=${LOAD:-bench}: $failed of $runs runs failed"
[[ -f "$OUT/stress_fail.log" ]] && grep -E "FAILED|illegal|error" "$OUT/stress_fail.log" | head -8
[[ $failed -eq 0 ]]
