#!/usr/bin/env bash
# Two builds of paged_moe_bench against each other in one device call: for each seed a process of build A
# then one of build B (the same configurations, models, token counts), merged pair by pair (merge_ab.py: B's
# configurations read as `<config>-new`), then compare.py --paged-ratio for each configuration (B / A on
# contiguous and on paged experts). For a change that moves the default table or a kernel, where one binary
# cannot hold both sides.
#   A=.gpu/old B=.gpu/new OUT=$OUT [SEEDS=3] [MODELS=qwen15_shared,qwen3,mixtral] [TOKENS=16,64,256]
#   [CONFIGS=int8,int4] bash benchmarks/device/bin_ab.sh
# Writes $OUT/bin_ab.tgz: a_<s>.json, b_<s>.json, ab_<s>.json, bin_ab.md and the processes' logs a_<s>.txt, b_<s>.txt.
set -uo pipefail
: "${A:?A must name the folder holding the paged_moe_bench of build A}"
: "${B:?B must name the folder holding the paged_moe_bench of build B}"
: "${OUT:?OUT must name an output folder}"
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)
configs=${CONFIGS:-int8,int4}
status=0
for seed in $(seq 1 "${SEEDS:-3}"); do
  for v in a b; do
    dir=$A
    [[ $v == b ]] && dir=$B
    LD_LIBRARY_PATH="$dir:${LD_LIBRARY_PATH:-}" timeout 240 "$dir/paged_moe_bench" \
      --models "${MODELS:-qwen15_shared,qwen3,mixtral}" --tokens "${TOKENS:-16,64,256}" --placement shuffled \
      --seed "$seed" --seconds 0.05 --config "$configs" --json "$OUT/${v}_$seed.json" >"$OUT/${v}_$seed.txt" 2>&1
    rc=$?
    echo "build $v seed $seed rc=$rc"
    [[ $rc -ne 0 ]] && status=1
  done
  python3 "$here/merge_ab.py" "$OUT/a_$seed.json" "$OUT/b_$seed.json" "$OUT/ab_$seed.json" || status=1
done
for c in ${configs//,/ }; do
  python3 "$here/compare.py" --paged-ratio "$c" "$c-new" "$OUT"/ab_*.json | tee -a "$OUT/bin_ab.md" || status=1
done
echo "(A: $A as <config>; B: $B as <config>-new)" | tee -a "$OUT/bin_ab.md"
# Few files come back from a device call: everything travels as one archive.
(cd "$OUT" && tar czf bin_ab.tgz --exclude=bin_ab.tgz ./* && find . -maxdepth 1 -type f ! -name bin_ab.tgz -delete)
exit $status
