# Sourced by the one-call device scripts (engine_check.sh, engine_motivating.sh, engine_overheads.sh): checks
# BIN and OUT, puts $BIN on the library path (libfmt.so.9 travels beside the binaries), starts the summary
# `lines` that each script prints last, and runs the test binaries named in TESTS (whole logs to
# $OUT/tests.txt, one summary line each); fixed_batch_trace writes a trace of one batch arriving at once.
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
