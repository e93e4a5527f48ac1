#!/usr/bin/env bash
# The quantized experts' kernel measurements in one device call (docs/results/quantized_h200.md):
# (1) the decode-tile sweep that chose DefaultMoeConfig::kQuantDecodeRows, two processes (Qwen, Mixtral); (2) the layer at the
# default tiles beside bf16 in PROCESSES separate processes (mean ± sd: `python3 benchmarks/device/quant_report.py quant_p*.json`).
# (3) with PATHS=1, each precision held to the decode and to the grouped path at 16–1024 tokens, one process
# (`quant_report.py --paths quant_paths.json`: where DefaultMoeConfig::kQuantDecodeTile switches).
# EXTRA_CONFIGS (e.g. int8-twoblock,int4-twoblock) joins (2)'s processes: `python3 benchmarks/device/compare.py
# int8-twoblock int8 quant_p*.json` is then an A/B in the same processes.
#   BIN=.gpu OUT=$OUT [PROCESSES=3] [SWEEP=1] [PATHS=0] [TOKENS=1,3,16,33,64,256,1024,4096,16384]
#   [MODELS=qwen15_shared,qwen3,mixtral (2)'s models] [EXTRA_CONFIGS=...]
#   bash benchmarks/device/quant_run.sh
# Writes $OUT/quant_sweep_{qwen15_shared,mixtral}.json, $OUT/quant_paths.json and $OUT/quant_p<i>.json (paged_moe_bench's
# format) and their logs, as one archive $OUT/quant.tgz.
set -uo pipefail
: "${BIN:?BIN must name the folder holding paged_moe_bench}"
: "${OUT:?OUT must name an output folder}"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
tiles="t8w4u1 t8w4u2 t8w8u1 t8w8u2 t16w4u1 t16w4u2 t32w4u1"
if [[ "${SWEEP:-1}" == 1 ]]; then
  sweep="default,int8,int4"
  for p in int8 int4; do for t in $tiles; do sweep="$sweep,$p-$t"; done; done
  for m in qwen15_shared,qwen3 mixtral; do
    timeout 250 "$BIN/paged_moe_bench" --models "$m" --tokens 1,3,16,33,64 --placement shuffled --seed 1 \
      --config "$sweep" --json "$OUT/quant_sweep_${m%%,*}.json" >"$OUT/quant_sweep_${m%%,*}.txt" 2>&1
    echo "sweep $m rc=$?"
  done
fi
if [[ "${PATHS:-0}" == 1 ]]; then
  timeout 250 "$BIN/paged_moe_bench" --models qwen15_shared,qwen3,mixtral --tokens 16,64,128,256,512,1024 \
    --placement shuffled --seed 1 --config "default,int8-decode,int8-grouped,int4-decode,int4-grouped" \
    --json "$OUT/quant_paths.json" >"$OUT/quant_paths.txt" 2>&1
  echo "paths rc=$?"
fi
for i in $(seq 1 "${PROCESSES:-3}"); do
  timeout 200 "$BIN/paged_moe_bench" --models "${MODELS:-qwen15_shared,qwen3,mixtral}" \
    --tokens "${TOKENS:-1,3,16,33,64,256,1024,4096,16384}" --placement shuffled --seed "$i" \
    --config "default,int8,int4${EXTRA_CONFIGS:+,$EXTRA_CONFIGS}" --json "$OUT/quant_p$i.json" >"$OUT/quant_p$i.txt" 2>&1
  echo "process $i rc=$?"
done
# Few files come back from a device call: everything travels as one archive.
(cd "$OUT" && tar czf quant.tgz --exclude=quant.tgz ./* && find . -maxdepth 1 -type f ! -name quant.tgz -delete)
