#!/usr/bin/env bash
# The CUDA backend's churn test under GPU contention: another process keeps the GPU busy (paged_moe_bench in
# a loop) while device_engine_tests' "evictions and restores at every step" case runs again and again, so that
# work the backend queues on different streams lands in orders a quiet GPU never shows. Prints how many runs
# failed and the first failure's lines. A race between streams shows up here long before it does in the plain
# suite (the loader's page-table clear on the legacy default stream failed 2 of 5 runs here and 1 of 94 beside
# two other test suites, never alone).
#   BIN=.gpu OUT=$OUT [DURATION=100] bash benchmarks/device/engine_stress.sh
# $BIN: device_engine_tests and paged_moe_bench from the ci or gpu preset, libfmt.so.9 beside them.
set -uo pipefail
: "${BIN:?BIN must name the folder holding the binaries}"
: "${OUT:?OUT must name an output folder}"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
case_name="cuda backend: evictions and restores at every step leave the tokens bit-identical"
(while true; do
  "$BIN/paged_moe_bench" --models mixtral --tokens 64,256 --seconds 0.5 --config default --json /dev/null \
    >/dev/null 2>&1
done) &
hog=$!
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
kill "$hog" 2>/dev/null
pkill -f "$BIN/paged_moe_bench" 2>/dev/null
wait 2>/dev/null
rm -f "$OUT/stress_run.log"
echo "churn case under a GPU hog: $failed of $runs runs failed"
[[ -f "$OUT/stress_fail.log" ]] && grep -E "FAILED|illegal|error" "$OUT/stress_fail.log" | head -8
[[ $failed -eq 0 ]]
