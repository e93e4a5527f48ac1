#!/usr/bin/env bash
# Quantized against bf16 experts with each precision alone in its processes, and interleaved in one process
# (how bin_ab.sh and quant_run.sh compare them). Under the board's power limit a layer's clock depends on
# what runs: alone, each precision settles at its own clock; interleaved, the precisions share one. For each
# seed and model: one paged_moe_bench process per configuration (the configurations in turn), then one
# process with all of them interleaved; nvidia-smi samples the SM clock and board power every 50 ms in each.
# precision_alone.py prints the ratios to bf16 (mean ± sd over the seeds) both ways and the busy clocks.
#   BIN=.gpu OUT=$OUT [SEEDS=3] [MODELS="qwen15_shared qwen3 mixtral"] [TOKENS=4096,16384] \
#     [CONFIGS="default int4 int8"] [RUN_SECONDS=1.5] bash benchmarks/device/precision_alone.sh
# Writes $OUT/alone.txt (the tables) and $OUT/precision_alone.tgz (bench JSON and logs, clock samples).
source "$(dirname "$0")/device_common.sh"
here="$(dirname "$0")"
mkdir -p "$OUT/alone"
configs=${CONFIGS:-default int4 int8}
# run NAME CONFIG MODEL SEED: one bench process, its clock samples beside it.
run() {
  local base="$OUT/alone/$1"
  start_sampler "$base.clk.csv"
  timeout 200 "$BIN/paged_moe_bench" --models "$3" --tokens "${TOKENS:-4096,16384}" --config "$2" \
    --placement adjacent --seed "$4" --seconds "${RUN_SECONDS:-1.5}" --json "$base.json" >"$base.txt" 2>&1
  local rc=$?
  stop_sampler
  [[ $rc -ne 0 ]] && lines+=("$1 rc=$rc")
}
for seed in $(seq 1 "${SEEDS:-3}"); do
  for model in ${MODELS:-qwen15_shared qwen3 mixtral}; do
    for config in $configs; do run "alone_${model}_${config}_$seed" "$config" "$model" "$seed"; done
    run "mixed_${model}_$seed" "${configs// /,}" "$model" "$seed"
    echo "seed $seed $model done"
  done
done
python3 "$here/precision_alone.py" "$OUT/alone" >"$OUT/alone.txt" 2>&1
finish alone precision_alone.tgz alone.txt
