#!/usr/bin/env bash
# Calibrates the simulator on the GPU and validates it on held-out traces in one device call
# (docs/results/calibration_h200.md). Per model: `amoeba calibrate` (static policy, every expert resident: the
# compute phases and the copy probes), then `amoeba validate` for each policy on ShareGPT-like traces that the
# calibration never saw (seed 1 at RATE, default 10 req/s; seed 2 bursty at BURST_RATE, default 8, gamma
# 0.5), under the memory cap.
#   BIN=.gpu OUT=$OUT [MODELS="qwen1.5-moe-a2.7b qwen3-30b-a3b"] [POLICIES="static fixed elastic"] \
#     [TRACES="poisson bursty"] [REQUESTS=60] [COST_MODEL=file.json] bash benchmarks/device/calibration_run.sh
# COST_MODEL skips `amoeba calibrate` and validates that cost model instead (one model per call).
# PRECISION=int8|int4 serves quantized experts on both sides; START names calibrate's starting cost model
# (default `default`; for a quantized fit the bf16 profile it extends, e.g. START=h200-qwen1.5).
# BACKEND=sim (with BIN=build/ci/reference_engine) runs the same flow on the CPU against the simulator (a dry
# run).
# Qwen1.5-MoE-A2.7B is calibrated and validated on the H200 capped at an RTX 5090's 31.84 GiB. Qwen3-30B-A3B
# (61 GB of bf16 weights) cannot keep every expert resident there, so it is calibrated uncapped and validated
# capped at QWEN3_GIB (31.84) with QWEN3_OFFLOAD (80) of its 128 experts per layer offloadable (elastic) or
# offloaded (fixed); its static run is uncapped. (At 31.84 GiB every Qwen3 step streams gigabytes: a
# 60-request trace runs ~220 s per policy; QWEN3_GIB=64 QWEN3_OFFLOAD=32 runs ~20-90 s.) Writes
# $OUT/<model>.json (the fitted cost model), $OUT/validate_<model>_<policy>_<trace>.json, both
# runs' per-step timelines (timeline_<model>_<policy>_<trace>_{measured,simulated}.csv) and
# one summary line per run ($OUT/summary.txt), all of it but summary.txt (left beside it) packed into
# $OUT/calibration.tgz (a device call returns few files); a run longer than its timeout is killed and reported.
source "$(dirname "$0")/device_common.sh"
requests=${REQUESTS:-60}
precision="--expert-precision ${PRECISION:-bf16}"
for model in ${MODELS:-qwen1.5-moe-a2.7b qwen3-30b-a3b}; do
  cap="--gpu-memory-gib 31.84" cal_cap="$cap" offload=""
  if [[ $model == qwen3-30b-a3b ]]; then
    cap="--gpu-memory-gib ${QWEN3_GIB:-31.84}" cal_cap=""
    offload="--expert-offload-limit ${QWEN3_OFFLOAD:-80} --fixed-offload ${QWEN3_OFFLOAD:-80}"
  fi
  cost_model="$OUT/$model.json"
  if [[ -n "${COST_MODEL:-}" ]]; then
    cost_model="$COST_MODEL"
  else
    start=$(date +%s)
    timeout 240 "$BIN/amoeba" calibrate --backend "${BACKEND:-cuda}" --model "$model" --gpu h200 $cal_cap \
      $precision --cost-model "${START:-default}" --out "$OUT/$model.json" >"$OUT/calibrate_$model.txt" 2>&1
    lines+=("calibrate $model rc=$? wall=$(($(date +%s) - start)) s")
  fi
  [[ -f "$cost_model" ]] || continue
  for policy in ${POLICIES:-static fixed elastic}; do
    run_cap="$cap"
    [[ $model == qwen3-30b-a3b && $policy == static ]] && run_cap=""
    for trace in "poisson:1:${RATE:-10}:1" "bursty:2:${BURST_RATE:-8}:0.5"; do
      IFS=: read -r name seed rate burst <<<"$trace"
      [[ " ${TRACES:-poisson bursty} " == *" $name "* ]] || continue
      start=$(date +%s)
      timeout 150 "$BIN/amoeba" validate --backend "${BACKEND:-cuda}" --model "$model" --gpu h200 \
        $run_cap $offload $precision \
        --cost-model "$cost_model" --policy "$policy" --requests "$requests" --rate "$rate" \
        --burstiness "$burst" --seed "$seed" --quiet --json "$OUT/validate_${model}_${policy}_$name.json" \
        --csv-measured "$OUT/timeline_${model}_${policy}_${name}_measured.csv" \
        --csv-simulated "$OUT/timeline_${model}_${policy}_${name}_simulated.csv" \
        >"$OUT/validate_${model}_${policy}_$name.txt" 2>&1
      rc=$?
      # The paired steps' error, then (where validate priced the measured steps) the priced steps'.
      err=$(grep -E "\|error\| median" "$OUT/validate_${model}_${policy}_$name.txt" | sed 's/^ *//' |
        paste -sd '#' - | sed 's/#/ || priced: /')
      lines+=("validate $model $policy $name rc=$rc wall=$(($(date +%s) - start)) s: $err")
    done
  done
done
printf '%s\n' "${lines[@]}" | tee "$OUT/summary.txt"
# Few files come back from a device call: everything else travels as one archive.
(cd "$OUT" && tar czf calibration.tgz --exclude=calibration.tgz --exclude=summary.txt ./* &&
  find . -maxdepth 1 -type f ! -name calibration.tgz ! -name summary.txt -delete)
