#!/usr/bin/env bash
# Tensor parallelism on a machine of two GPUs (nvidia-h200-x2), in one device call (docs/results/tp_h200x2.md):
#  1. device_engine_tests "[tp]": tp 2 against tp 1's logits, through the host-staged sums and over NCCL;
#  2. Qwen3-30B-A3B decode steps at tp 1 and tp 2 for each of BATCHES (engine_decode.sh, static, uncapped);
#  3. an offloading run at tp 1 and tp 2 (fixed policy, OFFLOAD experts per layer on the host, two short
#     requests), whose h2d bytes per copy call are one rank's bytes of one expert over its PCIe link (halved at
#     tp 2: each rank loads its slice).
#   BIN=.gpu/tp OUT=$OUT [BATCHES="1 32 256"] [OFFLOAD=32] bash benchmarks/device/tp_run.sh
# BIN holds amoeba and device_engine_tests (with libfmt.so.9). Writes $OUT/tp_run.tgz and prints the tables.
source "$(dirname "$0")/device_common.sh"
here=$(dirname "$0")
model=qwen3-30b-a3b
mkdir -p "$OUT/tp"
timeout 240 "$BIN/device_engine_tests" "[tp]" >"$OUT/tp/tests.txt" 2>&1
lines+=("device_engine_tests [tp] rc=$? $(grep -E 'All tests passed|test cases:' "$OUT/tp/tests.txt" | tail -1)")
grep -A1 "worst max" "$OUT/tp/tests.txt" | grep -v "^--$"
BIN=$BIN OUT=$OUT/tp MODEL=$model TPS="1 2" BATCHES="${BATCHES:-1 32 256}" bash "$here/engine_decode.sh" \
  >"$OUT/tp/decode.log" 2>&1
lines+=("engine_decode rc=$?")
printf '{"arrival_s": 0.0, "prompt_tokens": 64, "output_tokens": 8}\n%.0s' 1 2 >"$OUT/tp/trace_offload.jsonl"
for tp in 1 2; do
  start=$(date +%s)
  timeout 200 "$BIN/amoeba" run --backend cuda --gpu h200 --model $model --policy fixed \
    --fixed-offload "${OFFLOAD:-32}" --trace "$OUT/tp/trace_offload.jsonl" --tp "$tp" \
    --json "$OUT/tp/offload_tp$tp.json" --csv "$OUT/tp/offload_tp$tp.csv" --quiet >"$OUT/tp/offload_tp$tp.txt" 2>&1
  lines+=("offload tp=$tp rc=$? wall=$(($(date +%s) - start)) s")
done
python3 - "$OUT/tp" <<'PY'
import csv, os, sys
d = sys.argv[1]
for tp in (1, 2):
    path = os.path.join(d, f"offload_tp{tp}.csv")
    if not os.path.exists(path):
        print(f"offload tp {tp}: no timeline")
        continue
    rows = list(csv.DictReader(open(path)))
    b = sum(int(float(r["h2d_bytes"] or 0)) for r in rows)
    c = sum(int(float(r["copy_calls"] or 0)) for r in rows)
    print(f"offload tp {tp}: {b / 1e9:.2f} GB in {c} copy calls, {b / max(c, 1) / 1e6:.3f} MB per call (rank 0)")
PY
tail -40 "$OUT/tp/decode.log"
(cd "$OUT" && tar czf tp_run.tgz tp && rm -rf tp)
printf '%s\n' "${lines[@]}"
