#!/usr/bin/env bash
# Where a paged MoE kernel's warps wait, per instruction: Nsight Compute (ncu, with --clock-control none: the
# clocks stay as they are) profiles the first launches of the kernels matching KERNEL in paged_moe_bench, one
# configuration at a time, and stall_summary.py prints each kernel's speed-of-light lines, its warp states and
# the SASS instructions holding the most stall samples (with their reasons).
#   BIN=.gpu OUT=$OUT [MODEL=qwen15_shared] [TOKENS=4096] [CONFIGS="default int8 int4"] \
#     [KERNEL=regex:gemm_tma] [LAUNCHES=2] bash benchmarks/device/stall_profile.sh
# Needs ncu on the PATH or in /usr/local/cuda/bin (the device machine has both; hardware counters need a
# runtime that exposes them). Writes $OUT/stalls.txt (the summary) and $OUT/stall_profile.tgz (the reports
# and their CSV pages).
source "$(dirname "$0")/device_common.sh"
here="$(dirname "$0")"
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
mkdir -p "$OUT/ncu"
for config in ${CONFIGS:-default int8 int4}; do
  rep="$OUT/ncu/${MODEL:-qwen15_shared}_${TOKENS:-4096}_$config"
  timeout 300 "$ncu" --clock-control none --kernel-name "${KERNEL:-regex:gemm_tma}" --launch-count \
    "${LAUNCHES:-2}" --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section SourceCounters --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis -f -o "$rep" "$BIN/paged_moe_bench" --models "${MODEL:-qwen15_shared}" \
    --tokens "${TOKENS:-4096}" --config "$config" --placement adjacent --seed 1 --seconds 0.02 \
    --json /dev/null >"$rep.log" 2>&1
  lines+=("ncu $config rc=$? $(grep -c '==PROF== Profiling' "$rep.log") launches profiled")
  "$ncu" -i "$rep.ncu-rep" --page details --csv >"$rep.details.csv" 2>&1
  "$ncu" -i "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.source.csv" 2>&1
  python3 "$here/stall_summary.py" "$config" "$rep.details.csv" "$rep.source.csv" >>"$OUT/stalls.txt" 2>&1
done
finish ncu stall_profile.tgz stalls.txt
