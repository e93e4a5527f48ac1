#!/usr/bin/env bash
# One device call for paged attention: the device tests (errors per case, against the fp64 reference), the
# benchmark (JSON + a short table), compute-sanitizer memcheck on the small cases, then the benchmark's output.
#   BIN=<dir with device_attention_tests and attention_bench> OUT=<dir> bash attention_run.sh
# BIN defaults to the `gpu` preset's build tree; OUT must be given (a device call's $OUT: the script never
# writes into docs/results by itself). Each stage has its own time limit so a slow stage leaves the others
# their time (T_TEST, T_BENCH, T_SAN seconds); SKIP_SANITIZER=1 leaves compute-sanitizer out.
set -uo pipefail
BIN=${BIN:-build/gpu}
: "${OUT:?OUT must name an output folder, e.g. the OUT of a device call}"
mkdir -p "$OUT"
find_bin() { [[ -x $BIN/$1 ]] && echo "$BIN/$1" || find "$BIN" -name "$1" -type f -perm -u+x | head -1; }
TEST=$(find_bin device_attention_tests)
BENCH=$(find_bin attention_bench)
rc=0
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv,noheader
} | tee "$OUT/attention_env.log"
timeout "${T_TEST:-150}" "$TEST" >"$OUT/attention_tests.log" 2>&1 || rc=1
grep -E "^attn:|passed|failed|FAILED|with expansion|skipped|error|Error" "$OUT/attention_tests.log" | cut -c1-260
timeout "${T_BENCH:-90}" "$BENCH" --json "$OUT/attention_bench.json" >"$OUT/attention_bench.log" 2>&1 || rc=1
if command -v compute-sanitizer >/dev/null && [[ ${SKIP_SANITIZER:-0} != 1 ]]; then
  timeout "${T_SAN:-60}" compute-sanitizer --tool memcheck --error-exitcode 3 "$TEST" "[small]" >"$OUT/attention_sanitizer.log" 2>&1 ||
    rc=1
  grep -E "ERROR SUMMARY|All tests passed|failed" "$OUT/attention_sanitizer.log" | tail -3
fi
cat "$OUT/attention_bench.log"
echo "attention_run: rc=$rc"
exit $rc
