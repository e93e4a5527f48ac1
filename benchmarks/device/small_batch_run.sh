#!/usr/bin/env bash
# A small-batch variant of PagedMoe side by side with the default, in one device call:
# (1) its GPU test: the 64-token grouped GEMM (grouped::gemm_wgmma_small_kernel, bit for bit against the
#     two-block grouped GEMM);
# (2) bf16 at the grouped GEMM's small batches: the default against `small4` / `small3` / `small8` (64-token
#     tiles with 4 stages and 2 blocks per SM, 3 and 3, 8 and 1), one process per seed;
# (3) (at 6a301c7 only, since removed: the rolling int8 / int4 decode tiles against the default's;
#     benchmarks/device/staged_run.sh measures their successor, the staged tiles);
# (4) with NCU=1, Nsight Compute's duration and DRAM throughput of the gate/up and down launches of the
#     default and the small4 grouped GEMM at Qwen3 64 tokens.
# With CONFIRM=1 (once the table took both, commit c2db93d), instead of (2)-(4): the default against
# `tile128` (128-token grouped tiles) around the table's switch (128-1024 tokens) and against `int8-steady` (at
# c2db93d: no rolling tile; today: no staged tile), one process per seed: `compare.py tile128 default confirm_tiles_seed*.json`, `compare.py
# int8-steady int8 confirm_quant_seed*.json`.
#   BIN=.gpu OUT=$OUT [SEEDS=3] [CONFIRM=0] bash benchmarks/device/small_batch_run.sh
# Writes $OUT/small_batch.tgz: small_seed<i>.json (paged_moe_bench's format; `python3
# benchmarks/device/compare.py default small4 small_seed*.json`), the test's and the profiler's logs.
set -uo pipefail
: "${BIN:?BIN must name the folder holding paged_moe_bench and paged_moe_device_test}"
: "${OUT:?OUT must name an output folder}"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
timeout 200 "$BIN/paged_moe_device_test" "the small-batch grouped GEMM equals the two-block grouped GEMM" \
  >"$OUT/small_test.txt" 2>&1
echo "small-batch grouped test rc=$? $(grep -E 'All tests passed|test cases:' "$OUT/small_test.txt" | tail -1)"
# bench NAME SEED MODELS TOKENS CONFIGS: one process, $OUT/NAME_seedSEED.{json,txt}.
bench() {
  timeout 150 "$BIN/paged_moe_bench" --models "$3" --tokens "$4" --placement shuffled --seed "$2" \
    --config "$5" --json "$OUT/$1_seed$2.json" >"$OUT/$1_seed$2.txt" 2>&1
  echo "$1 seed $2 rc=$?"
}
for seed in $(seq 1 "${SEEDS:-3}"); do
  if [[ "${CONFIRM:-0}" == 1 ]]; then
    bench confirm_tiles "$seed" qwen15_shared,qwen3,mixtral 128,256,512,1024 default,tile128
    bench confirm_quant "$seed" qwen15_shared,qwen3,mixtral 1,3,8,16,33,64,128 default,int8,int8-steady,int4
  else
    bench small "$seed" qwen15,qwen15_shared,qwen3,mixtral 16,33,64,128,256 default,small4,small3,small8
  fi
done
if [[ "${NCU:-0}" == 1 && "${CONFIRM:-0}" != 1 ]] && command -v ncu >/dev/null; then
  for c in default small4; do
    timeout 100 ncu --clock-control none -k "regex:gemm_wgmma" --launch-count 4 \
      --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
      --csv "$BIN/paged_moe_bench" --models qwen3 --tokens 64 --config "$c" --placement shuffled --seed 1 \
      --seconds 0.001 --json /dev/null >"$OUT/ncu_$c.csv" 2>&1
    echo "ncu $c rc=$?"
  done
fi
# Few files come back from a device call: everything travels as one archive.
(cd "$OUT" && tar czf small_batch.tgz --exclude=small_batch.tgz ./* && find . -maxdepth 1 -type f ! -name small_batch.tgz -delete)
