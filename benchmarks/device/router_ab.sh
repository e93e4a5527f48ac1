#!/usr/bin/env bash
# The same layer under two routers, in one device call: paged_moe_bench with --router uniform and with
# --router $ROUTER (balanced by default: every expert T·k / E tokens, so no expert's last work tile is partly
# empty beyond what T·k / E leaves), one process each per seed, alternating, then compare.py on the pairs
# (the second router's configurations read as `<config>-new`). What the partly filled last tiles of uniform
# routing cost the grouped GEMMs.
#   BIN=.gpu OUT=$OUT [SEEDS=3] [MODELS=qwen15_shared,qwen3,mixtral] [TOKENS=1024,4096,16384]
#   [ROUTER=balanced] [CONFIG=default] bash benchmarks/device/router_ab.sh
# Writes $OUT/router_ab.tgz: uniform_<s>.json, <router>_<s>.json, ab_<s>.json (merge_ab.py) and the table.
set -uo pipefail
: "${BIN:?BIN must name the folder holding paged_moe_bench}"
: "${OUT:?OUT must name an output folder}"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
here=$(cd "$(dirname "$0")" && pwd)
router=${ROUTER:-balanced}
config=${CONFIG:-default}
status=0
for seed in $(seq 1 "${SEEDS:-3}"); do
  for r in uniform "$router"; do
    timeout 280 "$BIN/paged_moe_bench" --models "${MODELS:-qwen15_shared,qwen3,mixtral}" \
      --tokens "${TOKENS:-1024,4096,16384}" --router "$r" --placement shuffled --seed "$seed" \
      --config "$config" --json "$OUT/${r}_$seed.json" >"$OUT/${r}_$seed.txt" 2>&1
    rc=$?
    echo "router $r seed $seed rc=$rc"
    [[ $rc -ne 0 ]] && status=1
  done
  python3 "$here/merge_ab.py" "$OUT/uniform_$seed.json" "$OUT/${router}_$seed.json" "$OUT/ab_$seed.json" ||
    status=1
done
python3 "$here/compare.py" "$config" "$config-new" "$OUT"/ab_*.json | tee "$OUT/router_ab.md" || status=1
echo "(uniform: $config; $router: $config-new)" | tee -a "$OUT/router_ab.md"
# Few files come back from a device call: everything travels as one archive.
(cd "$OUT" && tar czf router_ab.tgz --exclude=router_ab.tgz ./* && find . -maxdepth 1 -type f ! -name router_ab.tgz -delete)
exit $status
