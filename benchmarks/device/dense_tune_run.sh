#!/usr/bin/env bash
# One device call: what cuBLASLt's first heuristic algorithm costs the decode steps, against DenseGemm's tuning
# (the fastest of its first 8 at M <= 64, chosen once per process at the CUDA backend's warm-up; the default,
# AMOEBA_TUNE_GEMM=0 turns it off). 1. dense_gemm_bench: every projection of Qwen1.5-MoE and Qwen3-30B at
# M = 1..16, each candidate's median. 2. device_model_tests "[dense]" (tune()'s and tune_once()'s results within
# one bf16 ulp). 3. Qwen1.5-MoE with int8 experts (PRECISION) on the held-out Poisson trace (static policy, the
# committed h200-qwen1.5 costs), untuned and tuned: the decode steps' phases by batch (timeline_steps.py
# priced); untuned, the rest of the step jumps by ~0.4 ms at 7-10 sequences (docs/results/dense_gemm_h200.md).
#   BIN=.gpu OUT=$OUT [PRECISION=int8] bash benchmarks/device/dense_tune_run.sh
# BIN holds dense_gemm_bench, device_model_tests and amoeba (with libfmt.so.9). Writes $OUT/dense_gemm.json,
# $OUT/summary.txt and $OUT/runs.tgz (the validate outputs and timelines of both runs, dense_gemm.txt and the
# device model tests' log dense_tests.txt).
source "$(dirname "$0")/device_common.sh"
here="$(dirname "$0")"
timeout 240 "$BIN/dense_gemm_bench" --json "$OUT/dense_gemm.json" >"$OUT/dense_gemm.txt" 2>&1
lines+=("dense_gemm_bench rc=$?")
timeout 240 "$BIN/device_model_tests" "[dense]" >"$OUT/dense_tests.txt" 2>&1
lines+=("device_model_tests [dense] rc=$? $(grep -E 'All tests passed|test cases:' "$OUT/dense_tests.txt" | tail -1)")
mkdir -p "$OUT/runs"
for tune in 0 1; do
  mkdir -p "$OUT/runs/tune$tune"
  AMOEBA_TUNE_GEMM=$tune PRECISION=${PRECISION:-int8} MODELS=qwen1.5-moe-a2.7b POLICIES=static TRACES=poisson \
    COST_MODEL=reference_engine/data/cost_models/h200-qwen1.5.json BIN="$BIN" OUT="$OUT/runs/tune$tune" \
    bash "$here/calibration_run.sh" >/dev/null 2>&1
  (cd "$OUT/runs/tune$tune" && tar xzf calibration.tgz)
  lines+=("validate tune=$tune: $(cat "$OUT/runs/tune$tune/summary.txt" | tr '\n' ' ')")
  lines+=("$(python3 "$here/timeline_steps.py" priced --max-batch 16 \
    "$OUT/runs/tune$tune/timeline_qwen1.5-moe-a2.7b_static_poisson_measured.csv")")
done
(cd "$OUT" && tar czf runs.tgz runs dense_gemm.txt dense_tests.txt && rm -rf runs dense_tests.txt)
printf '%s\n' "${lines[@]}" | tee "$OUT/summary.txt"
echo "projections and M where cuBLASLt's first algorithm is > 5% slower than the fastest of its first 8:"
awk '$NF + 0 > 1.05' "$OUT/dense_gemm.txt"
