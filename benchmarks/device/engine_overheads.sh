#!/usr/bin/env bash
# Overheads of the CUDA backend (docs/results/engine_h200.md): one uncapped static run of Qwen1.5-MoE-A2.7B
# (random weights) at a rate high enough to reach batch 256, served twice: as always (the step's wall time, the
# forward's host time) and with AMOEBA_GATE_FORWARD=1 (the GPU held until the forward is enqueued, so the
# compute span is the GPU's own time without launch gaps). benchmarks/device/overheads.py reads the two
# timelines. Optionally first: TESTS (binaries of $BIN, logs to $OUT/tests.txt) and SANITIZE (test binaries
# to run under compute-sanitizer memcheck and racecheck, with their Catch filters after a colon).
#   BIN=.gpu OUT=$OUT [REQUESTS=500] [TESTS="..."] [SANITIZE="device_engine_tests:[reference]"] \
#     bash benchmarks/device/engine_overheads.sh
source "$(dirname "$0")/device_common.sh"
for spec in ${SANITIZE:-}; do
  bin=${spec%%:*} filter=${spec#*:}
  for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool "$tool" "$BIN/$bin" "$filter" >>"$OUT/sanitizer.txt" 2>&1
    lines+=("$tool $bin $filter rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.txt" | tail -1)")
  done
done
for mode in plain gated; do
  start=$(date +%s)
  gate=0
  [[ $mode == gated ]] && gate=1
  AMOEBA_GATE_FORWARD=$gate "$BIN/amoeba" run --backend cuda --gpu h200 --policy static --rate 200 \
    --requests "${REQUESTS:-500}" --csv "$OUT/overhead_$mode.csv" --quiet >>"$OUT/overhead.txt" 2>&1
  lines+=("overhead $mode rc=$? wall=$(($(date +%s) - start)) s")
done
tail -12 "$OUT/overhead.txt"
printf '%s\n' "${lines[@]}"
