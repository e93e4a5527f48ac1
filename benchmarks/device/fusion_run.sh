#!/usr/bin/env bash
# The decode fusions (MoeConfig::decode_fusion) side by side in one device call: (1) their GPU tests
# (paged_moe_device_test and quant_moe_device_test "decode fusions*": bit for bit against the unfused decode
# layer, against the references) and compute-sanitizer memcheck and racecheck on the small one; (2) the
# layer with each fusion, interleaved in one process per seed at the decode sizes, bf16 (configs fuse-none,
# fuse-routing, fuse-all) and int8 / int4 (contiguous).
#   BIN=.gpu OUT=$OUT [SEEDS=3] [TOKENS=1,3,8,14] bash benchmarks/device/fusion_run.sh
# Writes $OUT/fusion.tgz: fusion_seed<i>.json and quant_fusion_seed<i>.json (paged_moe_bench's format;
# `python3 benchmarks/device/compare.py fuse-none fuse-all fusion_seed*.json`), the tests' logs.
set -uo pipefail
: "${BIN:?BIN must name the folder holding paged_moe_bench and the device tests}"
: "${OUT:?OUT must name an output folder}"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
for t in paged_moe_device_test quant_moe_device_test; do
  timeout 300 "$BIN/$t" "*decode fusions*" >"$OUT/test_$t.txt" 2>&1
  echo "$t fusions rc=$? $(grep -E 'All tests passed|test cases:' "$OUT/test_$t.txt" | tail -1)"
done
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    timeout 300 compute-sanitizer --tool "$tool" "$BIN/paged_moe_device_test" \
      "decode fusions equal the unfused decode layer" >"$OUT/$tool.txt" 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.txt" | tail -1)"
  done
fi
for seed in $(seq 1 "${SEEDS:-3}"); do
  timeout 240 "$BIN/paged_moe_bench" --models qwen15,qwen15_shared,qwen3,mixtral --tokens "${TOKENS:-1,3,8,14}" \
    --placement shuffled --seed "$seed" --config fuse-none,fuse-routing,fuse-all \
    --json "$OUT/fusion_seed$seed.json" >"$OUT/fusion_seed$seed.txt" 2>&1
  echo "bf16 bench seed $seed rc=$?"
  timeout 240 "$BIN/paged_moe_bench" --models qwen15,qwen15_shared,qwen3,mixtral --tokens "${TOKENS:-1,3,8,14}" \
    --placement shuffled --seed "$seed" \
    --config int8-fuse-none,int8-fuse-routing,int8-fuse-all,int4-fuse-none,int4-fuse-routing,int4-fuse-all \
    --json "$OUT/quant_fusion_seed$seed.json" >"$OUT/quant_fusion_seed$seed.txt" 2>&1
  echo "quant bench seed $seed rc=$?"
done
# Few files come back from a device call: everything travels as one archive.
(cd "$OUT" && tar czf fusion.tgz --exclude=fusion.tgz ./* && find . -maxdepth 1 -type f ! -name fusion.tgz -delete)
