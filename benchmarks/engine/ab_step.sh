#!/usr/bin/env bash
# Host cost of one engine step, before/after in one run: alternates two engine_bench binaries (BEFORE, AFTER)
# over separate processes and prints mean ± sd of each benchmark present in both or either.
#   benchmarks/engine/ab_step.sh BEFORE_BIN AFTER_BIN [processes=3]
set -euo pipefail
before=$1 after=$2 n=${3:-3}
filter='BM_SchedulerAdjusterStep/256|BM_StepWithPlanning/256|BM_RoutingAndSimForward/256'
out=$(mktemp -d)
for i in $(seq 1 "$n"); do
  for side in before after; do
    bin=$before; [[ $side == after ]] && bin=$after
    "$bin" --benchmark_filter="$filter" --benchmark_min_time=1 --benchmark_format=json >"$out/$side.$i.json" 2>/dev/null
  done
done
python3 - "$out" "$n" <<'PY'
import json, statistics, sys, glob
out, n = sys.argv[1], int(sys.argv[2])
rows = {}
for side in ("before", "after"):
    for i in range(1, n + 1):
        for b in json.load(open(f"{out}/{side}.{i}.json"))["benchmarks"]:
            rows.setdefault((b["name"], side), []).append(b["real_time"])
print(f"{'benchmark':36} {'side':7} {'mean us':>9} {'sd':>7}  processes")
for (name, side), v in sorted(rows.items()):
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    print(f"{name:36} {side:7} {statistics.mean(v):9.2f} {sd:7.2f}  {len(v)}")
PY
