#!/usr/bin/env bash
# The paper's motivating experiment, measured (docs/results/engine_h200.md): Qwen1.5-MoE-A2.7B (random
# weights, real shapes) on the H200 capped at an RTX 5090's memory (scenario motivating-h200-capped),
# ShareGPT-like requests, static / fixed / elastic in one `amoeba ablate --backend cuda` per rate; then one
# uncapped static run at a high rate whose per-step timeline gives the overheads at batch 1 to 256.
#   BIN=.gpu OUT=$OUT [RATES="10 7"] [REQUESTS=200] [REPEATS=1] [ROUTING=model] [OVERHEAD_REQUESTS=600] \
#     [ARGS="..."] [TESTS="..."] bash benchmarks/device/engine_motivating.sh
# ARGS: more flags for every ablate, e.g. "--expert-precision int8 --gpu-memory-gib 19.5 --cost-model
# h200-qwen1.5 --predictor none" (docs/results/quantized_h200.md, "The motivating experiment with int8 and
# int4 experts, measured").
# REPEATS=3 serves each rate in 3 separate processes (measured_rate<R>_r<i>.json: mean ± sd over processes);
# ROUTING=synthetic gives the GPU the simulator's expert sets (the comparison with a calibrated simulator).
# TESTS: test binaries of $BIN to run first (their whole logs go to $OUT/tests.txt).
# Beside the simulator (on the CPU, afterwards): python3 benchmarks/device/motivating_compare.py
#   --amoeba build/ci/reference_engine/amoeba --measured <the fetched $OUT> [--cost-models default,h200-qwen1.5]
source "$(dirname "$0")/device_common.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$OUT/measured.txt"
for r in ${RATES:-10 7}; do
  for i in $(seq 1 "${REPEATS:-1}"); do
    start=$(date +%s)
    json="$OUT/measured_rate$r.json"
    [[ ${REPEATS:-1} -gt 1 ]] && json="$OUT/measured_rate${r}_r$i.json"
    "$BIN/amoeba" ablate --backend cuda --scenario motivating-h200-capped --rate "$r" \
      --routing "${ROUTING:-model}" --requests "${REQUESTS:-200}" --policies static,fixed,elastic ${ARGS:-} \
      --json "$json" >>"$OUT/measured.txt" 2>>"$OUT/stderr.txt"
    lines+=("ablate rate $r process $i rc=$? wall=$(($(date +%s) - start)) s")
  done
done
if [[ "${OVERHEAD_REQUESTS:-600}" != 0 ]]; then
  start=$(date +%s)
  "$BIN/amoeba" run --backend cuda --gpu h200 --policy static --rate 200 --requests "${OVERHEAD_REQUESTS:-600}" \
    --csv "$OUT/overhead_timeline.csv" --json "$OUT/overhead.json" >>"$OUT/measured.txt" 2>>"$OUT/stderr.txt"
  lines+=("overhead run rc=$? wall=$(($(date +%s) - start)) s")
fi
cat "$OUT/measured.txt"
tail -5 "$OUT/stderr.txt"
printf '%s\n' "${lines[@]}"
