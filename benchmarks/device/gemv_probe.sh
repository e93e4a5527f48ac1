#!/usr/bin/env bash
# Why the decode GEMV is slower inside the engine than in paged_moe_bench: (1) the routing the engine's
# router produces at batch 32 (distinct experts per layer, from --record-routing), (2) Nsight Compute's DRAM
# bytes and throughput of the engine's GEMV launches and of the benchmark's at T = 32.
#   BIN=.gpu OUT=$OUT bash benchmarks/device/gemv_probe.sh
source "$(dirname "$0")/device_common.sh"
here=$(dirname "$0")
fixed_batch_trace 32 512 "$OUT/trace_b32.jsonl"
"$BIN/amoeba" run --backend cuda --gpu h200 --policy static --trace "$OUT/trace_b32.jsonl" --quiet \
  --record-routing "$OUT/rec.jsonl" >"$OUT/rec_run.txt" 2>&1
lines+=("record rc=$?")
python3 - "$OUT/rec.jsonl" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
dec = [r for r in rows if r["tokens"] == 32]
d = [len(e) for r in dec for e in r["experts"]]
print(f"decode steps {len(dec)}: distinct experts per layer mean {st.mean(d):.1f} min {min(d)} max {max(d)}")
PY
metrics=dram__bytes_read.sum,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct
timeout 200 ncu --clock-control none --cache-control none --metrics $metrics --csv -k regex:gemv_kernel \
  --launch-skip 1200 --launch-count 4 "$BIN/amoeba" run --backend cuda --gpu h200 --policy static \
  --trace "$OUT/trace_b32.jsonl" --quiet >"$OUT/ncu_engine.csv" 2>"$OUT/ncu_engine.err"
lines+=("ncu engine rc=$?")
timeout 200 ncu --clock-control none --cache-control none --metrics $metrics --csv -k regex:gemv_kernel \
  --launch-skip 40 --launch-count 4 "$BIN/paged_moe_bench" --models qwen15_shared --tokens 32 \
  --placement adjacent --seed 1 --seconds 0.02 --json "$OUT/b.json" >"$OUT/ncu_bench.csv" 2>"$OUT/ncu_bench.err"
lines+=("ncu bench rc=$?")
for f in ncu_engine ncu_bench; do
  echo "== $f"
  python3 "$here/kernel_breakdown.py" --per-launch "$OUT/$f.csv"
done
printf '%s\n' "${lines[@]}"
