#!/usr/bin/env bash
# Decode step time against the HBM floor at fixed batches (docs/results/engine_h200.md, "Decode at fixed
# batches"): B requests arrive at once (prompt P tokens, 64 output tokens), so after the prefill steps every
# step decodes B sequences at contexts P..P+64. Qwen1.5-MoE-A2.7B (MODEL= another catalog name), random
# weights, uncapped, static policy.
# benchmarks/device/overheads.py reads each timeline (medians over the decode-only steps). With NCU=1 a batch-32
# run of the default model (bf16, uncapped, one GPU, whatever MODEL, PRECISIONS, CAPS and TPS say) is also profiled
# with Nsight Compute (each kernel's duration over about two decode steps: launches NCU_SKIP (9000) to NCU_SKIP +
# NCU_COUNT (1100); clocks and caches left alone), and benchmarks/device/kernel_breakdown.py sums it per kernel.
# CAPS="0 40" serves each batch under each memory cap in GiB (0: uncapped, the default), to see whether the
# arena's size (the pages' spread over the device) changes the step. PRECISIONS="bf16 int8 int4" serves each
# batch with the experts in each precision (--expert-precision; the floor then counts the packed bytes).
# TPS="1 2" serves each batch with tensor parallelism over that many GPUs (--tp; a machine of that many:
# nvidia-h200-x2), the floor then per GPU (each reads 1/tp of every expert).
#   BIN=.gpu OUT=$OUT [BATCHES="1 32 256"] [CAPS="0"] [PRECISIONS="bf16"] [TPS="1"] [REPEATS=1] [NCU=1] \
#     [TESTS="..."] bash benchmarks/device/engine_decode.sh
source "$(dirname "$0")/device_common.sh"
here=$(dirname "$0")
for b in ${BATCHES:-1 32 256}; do
  p=512
  ((b > 64)) && p=256
  fixed_batch_trace "$b" "$p" "$OUT/trace_b$b.jsonl"
  for cap in ${CAPS:-0}; do
    for prec in ${PRECISIONS:-bf16}; do
      for tp in ${TPS:-1}; do
        for r in $(seq 1 "${REPEATS:-1}"); do
          start=$(date +%s)
          name=decode_b${b}_cap${cap}_r$r
          [[ $prec != bf16 ]] && name=decode_b${b}_cap${cap}_${prec}_r$r
          [[ $tp != 1 ]] && name=${name/_r$r/_tp${tp}_r$r}
          "$BIN/amoeba" run --backend cuda --gpu h200 ${MODEL:+--model "$MODEL"} --policy static \
            --trace "$OUT/trace_b$b.jsonl" \
            --gpu-memory-gib "$cap" --expert-precision "$prec" --tp "$tp" --csv "$OUT/$name.csv" --quiet \
            >>"$OUT/decode.txt" 2>&1
          lines+=("decode b=$b p=$p cap=$cap $prec tp=$tp run $r rc=$? wall=$(($(date +%s) - start)) s")
          echo "# $name" >>"$OUT/decode_table.txt"
          if [[ -f $OUT/$name.csv ]]; then
            python3 "$here/overheads.py" "$OUT/$name.csv" --targets "$b" --context $((p + 32)) \
              --precision "$prec" --tp "$tp" ${MODEL:+--model "$MODEL"} >>"$OUT/decode_table.txt" 2>&1
          else
            echo "no timeline: the run failed (decode.txt)" >>"$OUT/decode_table.txt"
          fi
        done
      done
    done
  done
done
if [[ ${NCU:-0} == 1 ]]; then
  fixed_batch_trace 32 512 "$OUT/trace_b32.jsonl"
  start=$(date +%s)
  timeout 300 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    --launch-skip "${NCU_SKIP:-9000}" --launch-count "${NCU_COUNT:-1100}" \
    "$BIN/amoeba" run --backend cuda --gpu h200 --policy static --trace "$OUT/trace_b32.jsonl" --quiet \
    >"$OUT/ncu_b32.csv" 2>"$OUT/ncu_b32.err"
  lines+=("ncu b=32 rc=$? wall=$(($(date +%s) - start)) s")
  python3 "$here/kernel_breakdown.py" "$OUT/ncu_b32.csv" >"$OUT/kernels_b32.txt" 2>&1
  head -40 "$OUT/kernels_b32.txt"
fi
cat "$OUT/decode_table.txt"
printf '%s\n' "${lines[@]}"
