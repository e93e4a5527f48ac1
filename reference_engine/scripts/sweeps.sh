#!/usr/bin/env bash
# Simulated sweeps for docs/reproducing.md: request rate (throughput and TTFT per policy) and
# expert_offload_limit (elastic vs the fixed cache at the same offload), on the default scenario
# (Qwen1.5-MoE-A2.7B, simulated RTX 5090, ShareGPT-like, 1000 requests, seed 0). Writes CSVs under
# docs/results/ and, with python3-matplotlib, PNGs under docs/plots/.
#   reference_engine/scripts/sweeps.sh [path/to/amoeba]
set -euo pipefail
cd "$(dirname "$0")/../.."
AMOEBA=${1:-build/default/reference_engine/amoeba}
out=docs/results
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The default ablation (the main job), and the same at 250 requests (closer to the paper's step counts).
"$AMOEBA" ablate --quiet --json $out/engine_default_ablation.json --csv $out/engine_default_ablation.csv \
  > $out/engine_default_ablation.txt
"$AMOEBA" ablate --quiet --requests 250 --csv $out/engine_default_ablation_250.csv > /dev/null

rate_csv=$out/engine_rate_sweep.csv
: > "$tmp/rate.csv"
for rate in 2 3 4 4.5 5 5.5 6 8 10 14; do
  "$AMOEBA" ablate --quiet --rate "$rate" --policies static,fixed,lru,elastic --csv "$tmp/r.csv" > /dev/null
  if [[ ! -s "$tmp/rate.csv" ]]; then head -1 "$tmp/r.csv" > "$tmp/rate.csv"; fi
  tail -n +2 "$tmp/r.csv" >> "$tmp/rate.csv"
done
mv "$tmp/rate.csv" "$rate_csv"

limit_csv=$out/ablation_offload_limit_sweep.csv
: > "$tmp/limit.csv"
for limit in 0 1 2 4 6 8 10 12 16 20 30; do
  # elastic may offload up to `limit` experts per layer; the fixed cache always offloads exactly `limit`.
  "$AMOEBA" ablate --quiet --expert-offload-limit "$limit" --fixed-offload "$limit" --policies fixed,elastic \
    --csv "$tmp/r.csv" > /dev/null
  if [[ ! -s "$tmp/limit.csv" ]]; then head -1 "$tmp/r.csv" | sed 's/^/fixed_offload,/' > "$tmp/limit.csv"; fi
  tail -n +2 "$tmp/r.csv" | sed "s/^/$limit,/" >> "$tmp/limit.csv"
done
mv "$tmp/limit.csv" "$limit_csv"

burst_csv=$out/ablation_offload_limit_burst.csv
: > "$tmp/burst.csv"
for limit in 0 2 4 6 10 16 30; do
  # bursty arrivals (gamma shape 0.25) at a lower mean rate: load comes and goes
  "$AMOEBA" ablate --quiet --rate 6 --burstiness 0.25 --expert-offload-limit "$limit" --policies elastic \
    --csv "$tmp/r.csv" > /dev/null
  if [[ ! -s "$tmp/burst.csv" ]]; then head -1 "$tmp/r.csv" > "$tmp/burst.csv"; fi
  tail -n +2 "$tmp/r.csv" >> "$tmp/burst.csv"
done
mv "$tmp/burst.csv" "$burst_csv"

echo "wrote $out/engine_default_ablation.* $rate_csv $limit_csv $burst_csv"
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 reference_engine/scripts/plot_sweeps.py
else
  echo "python3-matplotlib not installed: no plots (apt-get install python3-matplotlib)" >&2
fi
