#!/usr/bin/env bash
# The bf16 grouped GEMM's sm_90 kernels side by side in one device call: the two-block cp.async one (128
# weight rows per block, config `narrow`) and the persistent TMA one (256, MoeConfig::grouped_rows; `wide`),
# or the configurations CONFIGS names. (1) The GPU test of TEST_TAG (paged_moe_device_test "[tma]": bit for
# bit against the two-block kernel); (2) the layer on every configuration, interleaved in one process per
# seed at the grouped sizes; (3) with NCU=1, Nsight Compute's speed of light, warp stall reasons, scheduler
# and tensor-pipe statistics of one gate/up and one down launch of each kernel in NCU_KERNELS at Mixtral 4096
# tokens.
#   BIN=.gpu OUT=$OUT [SEEDS=3] [TOKENS=256,1024,4096,16384] [CONFIGS=narrow,wide] [TEST_TAG="[tma]"]
#   [NCU=0] [NCU_KERNELS="gemm_wgmma_kernel gemm_tma_kernel"] bash benchmarks/device/grouped_run.sh
# Writes $OUT/grouped.tgz: grouped_seed<i>.json (paged_moe_bench's format; `python3
# benchmarks/device/compare.py narrow wide grouped_seed*.json`), the test's and the profiler's logs.
set -uo pipefail
: "${BIN:?BIN must name the folder holding paged_moe_bench and paged_moe_device_test}"
: "${OUT:?OUT must name an output folder}"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
tag="${TEST_TAG:-[tma]}"
configs="${CONFIGS:-narrow,wide}"
timeout 240 "$BIN/paged_moe_device_test" "$tag" >"$OUT/grouped_test.txt" 2>&1
echo "$tag test rc=$? $(grep -E 'All tests passed|test cases:' "$OUT/grouped_test.txt" | tail -1)"
for seed in $(seq 1 "${SEEDS:-3}"); do
  timeout 240 "$BIN/paged_moe_bench" --models qwen15_shared,qwen3,mixtral \
    --tokens "${TOKENS:-256,1024,4096,16384}" --placement shuffled --seed "$seed" --config "$configs" \
    --json "$OUT/grouped_seed$seed.json" >"$OUT/grouped_seed$seed.txt" 2>&1
  echo "bench seed $seed rc=$?"
done
if [[ "${NCU:-0}" == 1 ]] && command -v ncu >/dev/null; then
  for k in ${NCU_KERNELS:-gemm_wgmma_kernel gemm_tma_kernel}; do
    timeout 150 ncu --clock-control none --kernel-name "regex:$k" --launch-count 2 --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
      "$BIN/paged_moe_bench" --models mixtral --tokens 4096 --config "$configs" \
      --placement shuffled --seed 1 --seconds 0.01 --json /dev/null >"$OUT/ncu_$k.txt" 2>&1
    echo "ncu $k rc=$?"
  done
fi
# Few files come back from a device call: everything travels as one archive.
(cd "$OUT" && tar czf grouped.tgz --exclude=grouped.tgz ./* && find . -maxdepth 1 -type f ! -name grouped.tgz -delete)
