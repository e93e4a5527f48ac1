#!/usr/bin/env bash
# One device call that runs every GPU test suite (paged MoE on bf16 and on int8/int4 experts, loader, paged
# attention and K/V append, decoder operations) and, unless SKIP_SANITIZER=1, compute-sanitizer memcheck on
# the quick ones; prints one line per suite and exits non-zero if any failed. For an integration check after
# merging kernel work.
#   BIN=/folder/with/binaries bash benchmarks/device/gpu_tests.sh
# $BIN holds the test binaries as the ci or gpu preset builds them (build/ci/tests/*/...), copied into a carried
# folder (e.g. .gpu/): paged_moe_device_test, quant_moe_device_test, device_loader_tests, device_attention_tests,
# device_model_tests, device_engine_tests (the CUDA backend under the engine);
# a missing one is reported, not fatal. Knobs: TIMEOUT (per suite, 300 s), SKIP_SANITIZER, LOG (a file that
# receives every suite's whole output; otherwise only failing suites' last 30 lines are printed), PARALLEL=1
# (the six suites at once, each to its own log: correctness only, ~3.5 min on the H200 against ~8 in turn,
# bound by quant_moe_device_test's CPU references; the sanitizer runs still go one at a time after them).
set -uo pipefail
: "${BIN:?BIN must name the folder holding the test binaries}"
timeout_s=${TIMEOUT:-300}
status=0
summary=()
run() {  # run NAME ARGS...
  local name=$1
  shift
  if [[ ! -x "$BIN/$name" ]]; then
    summary+=("$(printf '%-24s missing' "$name")")
    return
  fi
  local log
  log=$(timeout "$timeout_s" "$@" 2>&1)
  local rc=$?
  local last
  last=$(grep -E "All tests passed|test cases:|ERROR SUMMARY" <<<"$log" | tail -1)
  [[ -n "${LOG:-}" ]] && printf '==== %s (rc=%s)\n%s\n' "$*" "$rc" "$log" >>"$LOG"
  [[ $rc -ne 0 ]] && status=1 && echo "$log" | tail -30
  summary+=("$(printf '%-24s rc=%-3s %s' "$name" "$rc" "$last")")
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
suites=(paged_moe_device_test quant_moe_device_test device_loader_tests device_attention_tests device_model_tests
  device_engine_tests)
if [[ "${PARALLEL:-0}" == 1 ]]; then
  # Each suite in the background with its own log and exit code, then collected in the usual order.
  dir=$(mktemp -d)
  for t in "${suites[@]}"; do
    [[ -x "$BIN/$t" ]] || continue
    (timeout "$timeout_s" "$BIN/$t" >"$dir/$t.log" 2>&1; echo $? >"$dir/$t.rc") &
  done
  wait
  for t in "${suites[@]}"; do
    if [[ ! -x "$BIN/$t" ]]; then
      summary+=("$(printf '%-24s missing' "$t")")
      continue
    fi
    rc=$(cat "$dir/$t.rc")
    last=$(grep -E "All tests passed|test cases:" "$dir/$t.log" | tail -1)
    [[ -n "${LOG:-}" ]] && printf '==== %s (rc=%s)\n%s\n' "$BIN/$t" "$rc" "$(cat "$dir/$t.log")" >>"$LOG"
    [[ $rc -ne 0 ]] && status=1 && tail -30 "$dir/$t.log"
    summary+=("$(printf '%-24s rc=%-3s %s' "$t" "$rc" "$last")")
  done
  rm -rf "$dir"
else
  for t in "${suites[@]}"; do
    run "$t" "$BIN/$t"
  done
fi
if [[ "${SKIP_SANITIZER:-0}" != 1 ]] && command -v compute-sanitizer >/dev/null; then
  run device_model_tests compute-sanitizer --tool memcheck "$BIN/device_model_tests"
  run device_attention_tests compute-sanitizer --tool memcheck "$BIN/device_attention_tests" "[append]"
fi
printf '%s\n' "${summary[@]}"
exit $status
