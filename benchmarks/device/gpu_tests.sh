#!/usr/bin/env bash
# One device call that runs every GPU test suite (paged MoE on bf16 and on int8/int4 experts, loader, paged
# attention and K/V append, decoder operations) and, unless SKIP_SANITIZER=1, compute-sanitizer memcheck on
# the quick ones; prints one line per suite and exits non-zero if any failed. For an integration check after
# merging kernel work.
#   BIN=/folder/with/binaries bash benchmarks/device/gpu_tests.sh
# $BIN holds the test binaries as the ci or gpu preset builds them (build/ci/tests/*/...), copied into a carried
# folder (e.g. .gpu/): paged_moe_device_test, quant_moe_device_test, device_loader_tests, device_attention_tests,
# device_model_tests, device_engine_tests (the CUDA backend under the engine);
# a missing one is reported, not fatal. Knobs:
#  - TIMEOUT: per suite, 540 s (`quant_moe_device_test` with no filter takes 365 s alone on one H200 at
#    9bb0a83, 2026-12-04, and more beside the other suites);
#  - SKIP_SANITIZER;
#  - LOG: a file that receives every suite's whole output (otherwise only failing suites' last 30 lines are
#    printed);
#  - PARALLEL=1: the six suites at once, each to its own log, correctness only. Bound by
#    quant_moe_device_test's CPU references: at least the 365 s it takes alone (at 9bb0a83 with TIMEOUT=280 the
#    other five passed and it timed out). In turn the six take longer than one 600 s device call. The
#    sanitizer runs still go one at a time after them;
#  - SUITES: a space-separated subset of the six, in the order given (e.g. SUITES=quant_moe_device_test).
set -uo pipefail
: "${BIN:?BIN must name the folder holding the test binaries}"
timeout_s=${TIMEOUT:-540}
status=0
summary=()
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# exec_suite ID ARGS...: runs ARGS under the timeout into $logs/ID.log and $logs/ID.rc.
exec_suite() {
  local id=$1
  shift
  timeout "$timeout_s" "$@" >"$logs/$id.log" 2>&1
  echo $? >"$logs/$id.rc"
}
# report ID NAME ARGS...: one summary line for that run; a failing one's last 30 lines; the whole log to LOG.
report() {
  local id=$1 name=$2
  shift 2
  local rc last
  rc=$(cat "$logs/$id.rc")
  last=$(grep -E "All tests passed|test cases:|ERROR SUMMARY" "$logs/$id.log" | tail -1)
  [[ -n "${LOG:-}" ]] && printf '==== %s (rc=%s)\n%s\n' "$*" "$rc" "$(cat "$logs/$id.log")" >>"$LOG"
  [[ $rc -ne 0 ]] && status=1 && tail -30 "$logs/$id.log"
  summary+=("$(printf '%-24s rc=%-3s %s' "$name" "$rc" "$last")")
}
# present NAME: whether $BIN has that binary (a missing one is a summary line, not a failure).
present() {
  [[ -x "$BIN/$1" ]] && return 0
  summary+=("$(printf '%-24s missing' "$1")")
  return 1
}
# run ID NAME ARGS...: one run in the foreground, reported.
run() {
  local id=$1 name=$2
  shift 2
  present "$name" || return 0
  exec_suite "$id" "$@"
  report "$id" "$name" "$@"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
all_suites=(paged_moe_device_test quant_moe_device_test device_loader_tests device_attention_tests
  device_model_tests device_engine_tests)
read -r -a suites <<<"${SUITES:-${all_suites[*]}}"
for t in "${suites[@]}"; do
  [[ " ${all_suites[*]} " == *" $t "* ]] || { echo "SUITES: '$t' is not one of: ${all_suites[*]}" >&2; exit 2; }
done
if [[ "${PARALLEL:-0}" == 1 ]]; then
  # Every suite in the background, then reported in the usual order.
  for t in "${suites[@]}"; do
    [[ -x "$BIN/$t" ]] && exec_suite "$t" "$BIN/$t" &
  done
  wait
  for t in "${suites[@]}"; do
    present "$t" && report "$t" "$t" "$BIN/$t"
  done
else
  for t in "${suites[@]}"; do
    run "$t" "$t" "$BIN/$t"
  done
fi
if [[ "${SKIP_SANITIZER:-0}" != 1 ]] && command -v compute-sanitizer >/dev/null; then
  run memcheck_model device_model_tests compute-sanitizer --tool memcheck "$BIN/device_model_tests"
  run memcheck_append device_attention_tests compute-sanitizer --tool memcheck "$BIN/device_attention_tests" "[append]"
fi
printf '%s\n' "${summary[@]}"
exit $status
