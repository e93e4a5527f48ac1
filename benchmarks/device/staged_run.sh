#!/usr/bin/env bash
# Staged quantized decode tiles (decode::Tile's kStages: each thread keeps 2, 3 or 4 k-steps of its operands
# in flight through shared memory with cp.async), in one device call: (1) their GPU test (bit for bit against
# their register-loop twins, and the reference); (2) int8 / int4 decode at 1–128 tokens on Qwen1.5 (with its
# shared chunks), Qwen3 and Mixtral, the configurations CONFIGS side by side, one process per seed. The sweep
# that chose the table's stages (at cb3c7eb, when the table had no staged row) is the default CONFIGS; the
# table's check: CONFIGS=default,int8,int8-steady,int4 (int8-steady: the table without staged tiles).
# BETWEEN: MB read : written by other kernels after every layer call (paged_moe_bench's --between-read /
# --between-write), one set of processes per setting, e.g. BETWEEN="0:0 64:0". SECS: the bench's --seconds.
#   BIN=.gpu OUT=$OUT [SEEDS=3] [TOKENS=1,3,8,16,33,64,128] [CONFIGS=...] [TEST=1] [TESTS="<test names>"] \
#     [BETWEEN="0:0"] [SECS=0.1] bash benchmarks/device/staged_run.sh
# Writes $OUT/staged.tgz: staged_seed<i>.json, or staged_<R>_<W>_seed<i>.json with BETWEEN (paged_moe_bench's
# format: `python3 benchmarks/device/compare.py int8 int8-staged2 staged_seed*.json`) and the logs.
set -uo pipefail
: "${BIN:?BIN must name the folder holding paged_moe_bench and quant_moe_device_test}"
: "${OUT:?OUT must name an output folder}"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
if [[ "${TEST:-1}" == 1 ]]; then
  timeout 250 "$BIN/quant_moe_device_test" \
    "${TESTS:-quantized experts: staged decode tiles = their register-loop twins bit for bit}" \
    >"$OUT/staged_test.txt" 2>&1
  echo "staged decode test rc=$? $(grep -E 'All tests passed|test cases:' "$OUT/staged_test.txt" | tail -1)"
fi
configs="${CONFIGS:-int8,int8-staged2,int8-staged3,int8-staged4,int4,int4-staged2,int4-staged3,int4-staged4}"
for seed in $(seq 1 "${SEEDS:-3}"); do
  for between in ${BETWEEN:-0:0}; do
    name=staged_seed$seed
    [[ -n ${BETWEEN:-} ]] && name=staged_${between/:/_}_seed$seed
    timeout 200 "$BIN/paged_moe_bench" --models qwen15_shared,qwen3,mixtral \
      --tokens "${TOKENS:-1,3,8,16,33,64,128}" --placement shuffled --seed "$seed" --config "$configs" \
      --seconds "${SECS:-0.1}" --between-read "${between%%:*}" --between-write "${between##*:}" --json "$OUT/$name.json" \
      >"$OUT/$name.txt" 2>&1
    echo "staged seed $seed between $between rc=$?"
  done
done
(cd "$OUT" && tar czf staged.tgz --exclude=staged.tgz ./* && find . -maxdepth 1 -type f ! -name staged.tgz -delete)
