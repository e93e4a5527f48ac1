#!/usr/bin/env bash
# Refits the committed H200 cost models after a kernel change, in one device call: Qwen1.5-MoE-A2.7B's bf16
# fit starting from the committed h200-qwen1.5 (so parameters without samples keep their values), then its
# int8 and int4 scales on top of that fit (each precision's calibrate starts from the previous one's file, so
# the result holds all three), then Qwen3-30B-A3B's bf16 fit from h200-qwen3. Each fit is validated on the
# held-out Poisson trace with the static policy (benchmarks/device/calibration_run.sh does both).
#   BIN=.gpu OUT=$OUT [QWEN3=1] [STEPS="bf16 int8 int4"] [START=file.json] bash benchmarks/device/refit_run.sh
# STEPS and START split the chain over device calls when it outlasts one (since every decode batch 1..16 is
# calibrated, a Qwen1.5 step takes an estimated ~3 min): e.g. STEPS=bf16 QWEN3=0, then STEPS="int8 int4" QWEN3=0
# START=<the first call's h200-qwen1.5.json, carried>. STEPS= (set, empty) QWEN3=1: Qwen3's fit alone (an
# unset STEPS runs all three).
# Writes $OUT/steps.tgz (per step, bf16, int8, int4, qwen3: <step>/calibration.tgz, summary.txt and run.txt) and
# the final fits as $OUT/h200-qwen1.5.json and $OUT/h200-qwen3.json (copy them over
# reference_engine/data/cost_models/).
set -uo pipefail
: "${BIN:?BIN must name the folder holding amoeba}"
: "${OUT:?OUT must name an output folder}"
here=$(dirname "$0")
models=reference_engine/data/cost_models
start=${START:-$models/h200-qwen1.5.json}
for step in ${STEPS-bf16 int8 int4}; do
  mkdir -p "$OUT/$step"
  BIN=$BIN OUT=$OUT/$step START=$start PRECISION=$step MODELS=qwen1.5-moe-a2.7b POLICIES=static \
    TRACES=poisson bash "$here/calibration_run.sh" >"$OUT/$step/run.txt" 2>&1
  echo "$step: $(head -c 400 "$OUT/$step/summary.txt" | tr '\n' ' ')"
  tar xzf "$OUT/$step/calibration.tgz" -C "$OUT" ./qwen1.5-moe-a2.7b.json || { echo "$step: no fit"; exit 1; }
  cp "$OUT/qwen1.5-moe-a2.7b.json" "$OUT/h200-qwen1.5.json"
  start=$OUT/h200-qwen1.5.json
done
if [[ "${QWEN3:-1}" == 1 ]]; then
  mkdir -p "$OUT/qwen3"
  BIN=$BIN OUT=$OUT/qwen3 START=$models/h200-qwen3.json MODELS=qwen3-30b-a3b POLICIES=static TRACES=poisson \
    bash "$here/calibration_run.sh" >"$OUT/qwen3/run.txt" 2>&1
  echo "qwen3: $(head -c 400 "$OUT/qwen3/summary.txt" | tr '\n' ' ')"
  tar xzf "$OUT/qwen3/calibration.tgz" -C "$OUT" ./qwen3-30b-a3b.json && cp "$OUT/qwen3-30b-a3b.json" "$OUT/h200-qwen3.json"
fi
rm -f "$OUT/qwen1.5-moe-a2.7b.json" "$OUT/qwen3-30b-a3b.json"
# A profile's name is its file's stem (`--cost-model h200-qwen1.5`); calibrate names a fit after the model.
for f in "$OUT"/h200-*.json; do
  python3 -c "import json,sys; p=sys.argv[1]; d=json.load(open(p)); d['name']=p.split('/')[-1][:-5]; json.dump(d, open(p, 'w'), indent=2)" "$f"
done
# Few files come back from a device call: the steps' folders (calibration.tgz and summary.txt each)
# travel as one archive beside the final fits.
steps=$(cd "$OUT" && for d in bf16 int8 int4 qwen3; do [[ -d $d ]] && echo "$d"; done)
if [[ -n "$steps" ]]; then
  # shellcheck disable=SC2086
  (cd "$OUT" && tar czf steps.tgz $steps && rm -rf $steps)
fi
