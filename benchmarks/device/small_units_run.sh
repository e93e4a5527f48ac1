#!/usr/bin/env bash
# The quantized TMA kernel's 32-token units (tile_tokens 32) against the default table's quantized layers, in
# one device call: quant_moe_device_test's TMA cases first (the 32-token units bit for bit against the
# 128-token ones, paged = contiguous, the references), then paged_moe_bench with the default table (int8,
# int4) and the 32-token units at every size (int8-tma32, int4-tma32) in the same processes, one process per
# seed, then compare.py on each pair.
#   BIN=.gpu OUT=$OUT [SEEDS=3] [MODELS=qwen15_shared,qwen3,mixtral] [TOKENS=8,16,33,64,128,256]
#   [CONFIGS=int8,int4,int8-tma32,int4-tma32] [TESTS=1] [TEST_FILTER=catch2 filter] bash benchmarks/device/small_units_run.sh
# Writes $OUT/small_units.tgz: tests.txt, units_<s>.json / .txt and small_units.md.
set -uo pipefail
: "${BIN:?BIN must name the folder holding paged_moe_bench and quant_moe_device_test}"
: "${OUT:?OUT must name an output folder}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
here=$(cd "$(dirname "$0")" && pwd)
configs=${CONFIGS:-int8,int4,int8-tma32,int4-tma32}
status=0
if [[ "${TESTS:-1}" == 1 ]]; then
  timeout 300 "$BIN/quant_moe_device_test" "${TEST_FILTER:-[small],*32-token units on model shapes*,*TMA grouped GEMM on model shapes*}" \
    >"$OUT/tests.txt" 2>&1
  rc=$?
  echo "quant_moe_device_test rc=$rc: $(tail -n 3 "$OUT/tests.txt" | tr '\n' ' ')"
  [[ $rc -ne 0 ]] && status=1
fi
for seed in $(seq 1 "${SEEDS:-3}"); do
  timeout 240 "$BIN/paged_moe_bench" --models "${MODELS:-qwen15_shared,qwen3,mixtral}" \
    --tokens "${TOKENS:-8,16,33,64,128,256}" --placement shuffled --seed "$seed" --seconds 0.05 \
    --config "$configs" --json "$OUT/units_$seed.json" >"$OUT/units_$seed.txt" 2>&1
  rc=$?
  echo "bench seed $seed rc=$rc"
  [[ $rc -ne 0 ]] && status=1
done
for p in int8 int4; do
  if [[ ",$configs," == *",$p,"* && ",$configs," == *",$p-tma32,"* ]]; then
    python3 "$here/compare.py" "$p" "$p-tma32" "$OUT"/units_*.json | tee -a "$OUT/small_units.md" || status=1
  fi
done
# Few files come back from a device call: everything travels as one archive.
(cd "$OUT" && tar czf small_units.tgz --exclude=small_units.tgz ./* &&
  find . -maxdepth 1 -type f ! -name small_units.tgz -delete)
exit $status
