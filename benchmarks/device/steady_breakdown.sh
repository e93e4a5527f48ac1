#!/usr/bin/env bash
# A layer's time in the benchmark's steady state set beside its kernels' times and the clocks it ran at. For
# each model × token count × configuration: paged_moe_bench alone for a few seconds while nvidia-smi samples
# the SM clock and the board power every 50 ms (the layer's median µs and the clock while the GPU draws
# power), then Nsight Compute times every kernel of later layer calls one by one (`--cache-control none
# --clock-control none`: caches and clocks as the run leaves them; ncu serialises the launches, so the sum
# of a layer's kernels leaves out their overlap and the gaps between them). steady_summary.py prints one
# table: per configuration the layer's µs, its kernels' median µs and cycles, and the clock in each.
#   BIN=.gpu OUT=$OUT [MODELS="qwen3"] [TOKENS="4096 16384"] [CONFIGS="default int4 int8"] \
#     [RUN_SECONDS=2] bash benchmarks/device/steady_breakdown.sh
# Writes $OUT/steady.txt (the table) and $OUT/steady_breakdown.tgz (bench JSON, clock samples, ncu CSVs).
source "$(dirname "$0")/device_common.sh"
here="$(dirname "$0")"
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
mkdir -p "$OUT/steady"
# The layer's kernels (not the benchmark's setup fills): the MoE kernels and the routing kernels (older
# builds: offsets and scatter; CUB's sort: expand, Device..., finalize).
layer_kernels='gemm|gemv|combine|experts|permute|small_kernel|count_kernel|place_kernel|offsets_kernel|scatter_kernel|expand|Device|finalize'
for model in ${MODELS:-qwen3}; do
  for tokens in ${TOKENS:-4096 16384}; do
    for config in ${CONFIGS:-default int4 int8}; do
      base="$OUT/steady/${model}_${tokens}_$config"
      start_sampler "$base.clk.csv"
      timeout 120 "$BIN/paged_moe_bench" --models "$model" --tokens "$tokens" --config "$config" \
        --placement adjacent --seed 1 --seconds "${RUN_SECONDS:-2}" --json "$base.json" >"$base.txt" 2>&1
      rc=$?
      stop_sampler
      timeout 300 "$ncu" --cache-control none --clock-control none --metrics \
        gpu__time_duration.sum,sm__cycles_elapsed.max --csv --kernel-name "regex:$layer_kernels" \
        --launch-skip 20 --launch-count 60 \
        "$BIN/paged_moe_bench" --models "$model" --tokens "$tokens" --config "$config" --placement adjacent \
        --seed 1 --seconds 0.05 --json /dev/null >"$base.ncu.csv" 2>"$base.ncu.log"
      lines+=("$model $tokens $config bench rc=$rc ncu rc=$?")
    done
  done
done
python3 "$here/steady_summary.py" "$OUT/steady" >"$OUT/steady.txt" 2>&1
finish steady steady_breakdown.tgz steady.txt
