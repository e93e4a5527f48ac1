# Sourced by the one-call device scripts (`grep -l device_common.sh benchmarks/device/*.sh`: engine_check.sh,
# engine_motivating.sh, precision_alone.sh, calibration_run.sh, tp_run.sh and eight more): checks
# BIN and OUT, puts $BIN on the library path (libfmt.so.9 travels beside the binaries), starts the summary
# `lines` that each script prints last, and runs the test binaries named in TESTS (whole logs to
# $OUT/tests.txt, one summary line each); fixed_batch_trace writes a trace of one batch arriving at once;
# start_sampler / stop_sampler record the clocks and power while a benchmark runs; finish packs and prints.
set -uo pipefail
: "${BIN:?BIN must name the folder holding the binaries}"
: "${OUT:?OUT must name an output folder}"
mkdir -p "$OUT"  # a subfolder of the call's $OUT (OUT=$OUT/old) need not exist yet
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
lines=()
for t in ${TESTS:-}; do
  timeout 240 "$BIN/$t" >>"$OUT/tests.txt" 2>&1
  rc=$?
  lines+=("$t rc=$rc $(grep -E 'All tests passed|test cases:' "$OUT/tests.txt" | tail -1)")
done
# fixed_batch_trace B P FILE: B requests arriving at once, prompt P tokens, 64 output tokens each (after the
# prefill every step decodes exactly B sequences).
fixed_batch_trace() {
  for ((i = 0; i < $1; ++i)); do
    printf '{"arrival_s": 0.0, "prompt_tokens": %d, "output_tokens": 64}\n' "$2"
  done >"$3"
}
# start_sampler FILE: nvidia-smi writes the SM clock, memory clock, board power, temperature and utilisation
# every 50 ms into FILE (timestamp first) until stop_sampler.
# (precision_alone.py's SAMPLER_QUERY names the same columns for its parser.)
start_sampler() {
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
    --format=csv,noheader,nounits -lms 50 >"$1" 2>/dev/null &
  sampler=$!
}
stop_sampler() {
  kill "$sampler" 2>/dev/null
  wait "$sampler" 2>/dev/null
}
# finish DIR ARCHIVE SUMMARY: packs $OUT/DIR into $OUT/ARCHIVE (few files come back from a device call), then
# prints the summary lines and $OUT/SUMMARY.
finish() {
  (cd "$OUT" && tar czf "$2" "$1" && rm -rf "$1")
  printf '%s\n' "${lines[@]}"
  cat "$OUT/$3"
}
