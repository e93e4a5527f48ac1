#!/usr/bin/env bash
# The warp-specialised grouped GEMM (grouped::gemm_wgmma_ws_kernel, opt-in) beside the two-block wgmma kernel
# in one device call: (1) its GPU tests (bf16: paged_moe_device_test "[ws]"; int8/int4: quant_moe_device_test
# "[ws]"; both compare it bit for bit with the two-block kernel); (2) the layer on both kernels, interleaved in
# one process per seed at the grouped sizes (bf16 `default` / `ws`, int8/int4 `-grouped` / `-ws`); (3) Nsight
# Compute's speed-of-light of one gate/up and one down launch of each bf16 kernel at Mixtral 4096 tokens.
#   BIN=.gpu OUT=$OUT [SEEDS=1] [TOKENS=256,1024,4096,16384] [NCU=1] bash benchmarks/device/ws_run.sh
# Writes $OUT/ws.tgz: ws_seed<i>.json (paged_moe_bench's format; `python3 benchmarks/device/quant_report.py
# --paths` reads it), the tests' and the profiler's logs.
set -uo pipefail
: "${BIN:?BIN must name the folder holding paged_moe_bench and the device tests}"
: "${OUT:?OUT must name an output folder}"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
timeout 240 "$BIN/paged_moe_device_test" "[ws]" >"$OUT/ws_test_bf16.txt" 2>&1
echo "bf16 [ws] test rc=$? $(grep -E 'All tests passed|test cases:' "$OUT/ws_test_bf16.txt" | tail -1)"
timeout 240 "$BIN/quant_moe_device_test" "[ws]" >"$OUT/ws_test_quant.txt" 2>&1
echo "quant [ws] test rc=$? $(grep -E 'All tests passed|test cases:' "$OUT/ws_test_quant.txt" | tail -1)"
for seed in $(seq 1 "${SEEDS:-1}"); do
  timeout 240 "$BIN/paged_moe_bench" --models qwen15_shared,qwen3,mixtral \
    --tokens "${TOKENS:-256,1024,4096,16384}" --placement shuffled --seed "$seed" \
    --config default,ws,int8-grouped,int8-ws,int4-grouped,int4-ws --json "$OUT/ws_seed$seed.json" \
    >"$OUT/ws_seed$seed.txt" 2>&1
  echo "bench seed $seed rc=$?"
done
if [[ "${NCU:-1}" == 1 ]] && command -v ncu >/dev/null; then
  for k in gemm_wgmma_kernel gemm_wgmma_ws_kernel; do
    timeout 150 ncu --clock-control none --kernel-name "regex:$k" --launch-count 2 --section SpeedOfLight \
      --section Occupancy "$BIN/paged_moe_bench" --models mixtral --tokens 4096 --config default,ws \
      --placement shuffled --seed 1 --seconds 0.01 --json /dev/null >"$OUT/ncu_$k.txt" 2>&1
    echo "ncu $k rc=$?"
  done
fi
# Few files come back from a device call: everything travels as one archive.
(cd "$OUT" && tar czf ws.tgz --exclude=ws.tgz ./* && find . -maxdepth 1 -type f ! -name ws.tgz -delete)
