#!/usr/bin/env bash
# One device call that checks the CUDA backend end to end: every GPU test suite (the backend under the engine
# included), the transformers oracle for the host reference and the CUDA backend on one transformers run each,
# and a short served trace of Qwen1.5-MoE-A2.7B (random weights, real shapes) on the H200 capped at an RTX
# 5090's memory for static and elastic. Prints one summary table last.
#   BIN=.gpu OUT=$OUT bash benchmarks/device/engine_check.sh
# $BIN: binaries from the ci or gpu preset (tests and reference_engine/amoeba, with libfmt.so.9 beside them).
# Knobs: REQUESTS (default 40), SKIP_TESTS=1, SKIP_ORACLE=1, SKIP_SERVE=1, SKIP_SANITIZER (default 1), TIMEOUT (per
# test suite, gpu_tests.sh's: 540 s, what quant_moe_device_test needs alone).
source "$(dirname "$0")/device_common.sh"
requests=${REQUESTS:-40}
if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  LOG="$OUT/gpu_tests_full.txt" SKIP_SANITIZER=${SKIP_SANITIZER:-1} TIMEOUT=${TIMEOUT:-540} \
    bash benchmarks/device/gpu_tests.sh >"$OUT/gpu_tests.txt" 2>&1
  lines+=("gpu tests rc=$?")
  tail -8 "$OUT/gpu_tests.txt"
fi
if [[ "${SKIP_ORACLE:-0}" != 1 ]]; then
  timeout 300 python3 benchmarks/device/hf_oracle.py --amoeba "$BIN/amoeba" --out "$OUT/oracle" \
    --backend reference,cuda >"$OUT/oracle.txt" 2>&1
  lines+=("oracle rc=$?")
  tail -8 "$OUT/oracle.txt"
fi
if [[ "${SKIP_SERVE:-0}" != 1 ]]; then
  for p in static elastic; do
    /usr/bin/time -v "$BIN/amoeba" run --backend cuda --scenario motivating-h200-capped --policy "$p" \
      --requests "$requests" --json "$OUT/serve_$p.json" --csv "$OUT/serve_$p.csv" >"$OUT/serve_$p.txt" \
      2>"$OUT/serve_$p.err"
    rc=$?
    lines+=("serve $p rc=$rc wall=$(grep 'Elapsed (wall' "$OUT/serve_$p.err" | awk '{print $NF}')")
    tail -25 "$OUT/serve_$p.txt"
    tail -5 "$OUT/serve_$p.err"
  done
fi
printf '%s\n' "${lines[@]}"
