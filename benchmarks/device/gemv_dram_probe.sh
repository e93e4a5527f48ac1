#!/usr/bin/env bash
# The decode GEMV kernels' time and DRAM bytes, one launch at a time (Nsight Compute: kernels serialized,
# clocks and caches left as they are), in the CUDA backend at fixed batches (Qwen1.5-MoE-A2.7B, random
# weights, static policy, 512-token prompts; 10 decode steps skipped, then 10 profiled) and in paged_moe_bench
# at the same shape and router (zipf:0.6, Qwen1.5 with its shared chunks), the benchmark once per BETWEEN
# setting (READ:WRITE MB of other memory traffic after every layer call, paged_moe_bench's --between-read /
# --between-write; 0:0 none). docs/results/paged_moe_h200.md, "The engine's decode GEMV reads more from DRAM
# than the benchmark's".
#   BIN=.gpu OUT=$OUT [BATCHES="6 7"] [BETWEEN="0:0"] [ENGINE=1] [CAP=0] [ENGINE_COUNT=480] [BENCH_COUNT=288] \
#     [CONFIG=default] \
#     [METRICS=gpu__time_duration.sum,dram__bytes_read.sum] [REPLAY=kernel] bash benchmarks/device/gemv_dram_probe.sh
# CONFIG: the benchmark's configuration (paged_moe_bench --config).
# CAP: the engine's --gpu-memory-gib (0: all the device; a replay needs room to save memory, e.g. 40).
# Prints, per batch and program, each GEMV grid's launches and median µs / MB per launch
# (kernel_breakdown.py --medians); writes the CSVs to $OUT/gemv_dram_probe.tgz. More than two metrics make
# ncu replay each kernel (memory saved and restored between passes), which changes what the L2 holds;
# REPLAY=application runs the whole program once per pass instead (slower; the L2 as the program leaves it).
source "$(dirname "$0")/device_common.sh"
here=$(dirname "$0")
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
metrics=${METRICS:-gpu__time_duration.sum,dram__bytes_read.sum}
mkdir -p "$OUT/probe"
profile() {  # NAME SKIP COUNT COMMAND...: ncu over the command's GEMV launches, then the medians
  local name=$1 skip=$2 count=$3
  shift 3
  timeout 300 "$ncu" --clock-control none --cache-control none --replay-mode "${REPLAY:-kernel}" \
    --metrics "$metrics" --csv -k regex:gemv \
    --launch-skip "$skip" --launch-count "$count" "$@" >"$OUT/probe/$name.csv" 2>"$OUT/probe/$name.err"
  echo "== $name rc=$?"
  python3 "$here/kernel_breakdown.py" --medians "$OUT/probe/$name.csv"
}
for b in ${BATCHES:-6 7}; do
  if [[ ${ENGINE:-1} == 1 ]]; then
    fixed_batch_trace "$b" 512 "$OUT/probe/trace_b$b.jsonl"
    profile "engine_b$b" 480 "${ENGINE_COUNT:-480}" "$BIN/amoeba" run --backend cuda --gpu h200 --policy static \
      --gpu-memory-gib "${CAP:-0}" --trace "$OUT/probe/trace_b$b.jsonl" --csv "$OUT/probe/engine_b$b.steps.csv" --quiet
  fi
  for between in ${BETWEEN:-0:0}; do
    profile "bench_b${b}_between${between/:/_}_${CONFIG:-default}" 96 "${BENCH_COUNT:-288}" "$BIN/paged_moe_bench" --models qwen15_shared \
      --tokens "$b" --router zipf:0.6 --placement shuffled --seed 1 --config "${CONFIG:-default}" --seconds 0.001 \
      --between-read "${between%%:*}" --between-write "${between##*:}" --json /dev/null
  done
done
(cd "$OUT" && tar czf gemv_dram_probe.tgz probe && rm -rf probe)
