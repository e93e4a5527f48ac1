#!/usr/bin/env bash
# One device call: A/B of the sm_90 grouped GEMM variants at prefill sizes (ab.sh, no tests), then the full
# run.sh (tests, sanitizers, benchmark, torch, report) with the variant whose paged+contiguous times, relative
# to the best variant of each case, sum lowest. The A/B files come back as ab.tar.gz.
#   OUT=/some/dir BIN=build/kern2 COMMIT=<sha> bash benchmarks/device/final.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
AB=/tmp/ab_out
mkdir -p $AB
OUT=$AB SKIP_TESTS=1 PLACEMENTS="${PLACEMENTS:-}" VARIANTS="${VARIANTS:-grid pair pair-tiles wide-tiles}" \
  bash benchmarks/device/ab.sh
best=$(python3 - "$AB" <<'PY'
import glob, json, sys
cases = {}
for f in glob.glob(sys.argv[1] + "/ab_*.json"):
    d = json.load(open(f))
    for c in d["cases"]:
        cases.setdefault((c["model"], c["tokens"]), {})[d["variant"]] = c["paged_us"] + c["contiguous_us"]
score = {}
for per in cases.values():
    m = min(per.values())
    for v, t in per.items():
        score[v] = score.get(v, 0.0) + t / m
print(min(score, key=score.get) if score else "pair")
PY
)
echo "fastest grouped variant: $best" | tee -a "$AB/ab.log"
tar czf "$OUT/ab.tar.gz" -C "$AB" .
VARIANT=$best bash benchmarks/device/run.sh
