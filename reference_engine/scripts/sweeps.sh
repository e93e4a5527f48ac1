#!/usr/bin/env bash
# Every SIMULATED result and plot of docs/reproducing.md, regenerated:
#   - the motivating experiment (Qwen1.5-MoE-A2.7B, simulated RTX 5090, ShareGPT-like, 1000 requests, seed 0):
#     the default ablation, the 250-request row, the rate sweep, the expert_offload_limit sweeps;
#   - the paper's end-to-end settings (`amoeba scenarios`: e2e-*), each over its request rates;
#   - the Fate ablation (fate-ablation) over request rates;
#   - the expert_offload_limit curve on the 122B end-to-end setting;
#   - the "when elastic pays" grid: elastic/static throughput over (model, GPUs, precision, rate).
# Runs are independent and go two at a time (2 cores). Writes CSVs under docs/results/ and, with
# python3-matplotlib, PNGs under docs/plots/.
#   reference_engine/scripts/sweeps.sh [path/to/amoeba]
set -euo pipefail
cd "$(dirname "$0")/../.."
AMOEBA=$(realpath "${1:-build/default/reference_engine/amoeba}")
out=docs/results
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
jobs=$(( $(nproc) < 2 ? 1 : 2 ))
list="$tmp/jobs.txt"
: > "$list"
job() { printf '%s\n' "$*" >> "$list"; }   # one shell command per line
A="\"$AMOEBA\" ablate --quiet"

# ---- the motivating experiment (default scenario)
job "$A --json $out/engine_default_ablation.json --csv $out/engine_default_ablation.csv > $out/engine_default_ablation.txt"
job "$A --requests 250 --csv $out/engine_default_ablation_250.csv > /dev/null"
for rate in 2 3 4 4.5 5 5.5 6 8 10 14; do
  job "$A --rate $rate --policies static,fixed,lru,elastic --csv $tmp/rate_$rate.csv > /dev/null"
done
for limit in 0 1 2 4 6 8 10 12 16 20 30; do
  # elastic may offload up to `limit` experts per layer; the fixed cache always offloads exactly `limit`.
  job "$A --expert-offload-limit $limit --fixed-offload $limit --policies fixed,elastic --csv $tmp/limit_$limit.csv > /dev/null"
done
for limit in 0 2 4 6 10 16 30; do
  # bursty arrivals (gamma shape 0.25) at a lower mean rate: load comes and goes
  job "$A --rate 6 --burstiness 0.25 --expert-offload-limit $limit --policies elastic --csv $tmp/burst_$limit.csv > /dev/null"
done

# ---- the paper's end-to-end settings and the Fate ablation, each over the rates its scenario file lists
scenario_rates() {
  /usr/bin/python3 -c "import json,sys; print(' '.join(str(r) for r in json.load(open(sys.argv[1]))['sweep']['rates']))" \
    "reference_engine/data/scenarios/$1.json"
}
for f in reference_engine/data/scenarios/e2e-*.json reference_engine/data/scenarios/fate-ablation.json; do
  sc=$(basename "$f" .json)
  for rate in $(scenario_rates "$sc"); do
    job "$A --scenario $sc --rate $rate --json $tmp/paper__${sc}__$rate.json > /dev/null"
  done
done
# expert_offload_limit on the 122B setting at 20 req/s: elastic up to `limit`, fixed exactly `limit`
for limit in 0 8 16 32 64 96 128; do
  job "$A --scenario e2e-qwen3.5-122b-a10b-8x-rtx5090 --rate 20 --policies fixed,elastic --expert-offload-limit $limit --fixed-offload $limit --json $tmp/limit122__$limit.json > /dev/null"
done

# ---- when elastic pays: static vs elastic over (model, GPUs, precision, rate), 300 requests each.
# The elastic policy may offload a quarter of each layer's experts (10 of 60 for Qwen1.5, as the default).
grid() {  # model gpu precision limit [extra flags...]
  local model=$1 gpu=$2 prec=$3 limit=$4; shift 4
  for rate in 10 20 40; do  # below 10 req/s only the one-GPU setting is ever short of KV
    job "$A --model $model --gpu $gpu --expert-precision $prec --expert-offload-limit $limit $* --requests 300 --rate $rate --policies static,elastic --json $tmp/grid__${model}__${gpu}__${prec}$([[ $# -gt 0 ]] && echo _u95)__$rate.json > /dev/null 2> $tmp/grid__${model}__${gpu}__${prec}$([[ $# -gt 0 ]] && echo _u95)__$rate.err || true"
  done
}
for p in bf16 int8 int4; do
  grid qwen1.5-moe-a2.7b rtx5090 $p 10
  for g in 2x-rtx4090d 2x-rtx5090 8x-rtx5090; do grid qwen3-30b-a3b $g $p 32; done
  for g in 2x-rtx4090d 8x-rtx5090; do grid qwen3.5-35b-a3b $g $p 64; done
  grid qwen3.5-122b-a10b 8x-rtx5090 $p 64
done
grid qwen3.5-122b-a10b 8x-rtx5090 bf16 64 --usable-fraction 0.95
"$AMOEBA" trace generate --requests 1000 --seed 0 -o "$tmp/trace.jsonl"

t0=$(date +%s)
xargs -P "$jobs" -d '\n' -I{} bash -c '{}' < "$list"
echo "$(wc -l < "$list") simulated runs in $(( $(date +%s) - t0 )) s on $jobs cores"

# Assemble the motivating experiment's CSVs in a fixed order.
cat_csv() {  # out prefix-column files...
  local dest=$1 col=$2; shift 2
  : > "$tmp/cat.csv"
  for f in "$@"; do
    if [[ ! -s "$tmp/cat.csv" ]]; then
      if [[ -n $col ]]; then head -1 "$f" | sed "s/^/$col,/" > "$tmp/cat.csv"; else head -1 "$f" > "$tmp/cat.csv"; fi
    fi
    if [[ -n $col ]]; then
      local v; v=$(basename "$f" .csv); v=${v##*_}
      tail -n +2 "$f" | sed "s/^/$v,/" >> "$tmp/cat.csv"
    else
      tail -n +2 "$f" >> "$tmp/cat.csv"
    fi
  done
  mv "$tmp/cat.csv" "$dest"
}
cat_csv $out/engine_rate_sweep.csv "" $(for r in 2 3 4 4.5 5 5.5 6 8 10 14; do echo "$tmp/rate_$r.csv"; done)
cat_csv $out/ablation_offload_limit_sweep.csv fixed_offload $(for l in 0 1 2 4 6 8 10 12 16 20 30; do echo "$tmp/limit_$l.csv"; done)
cat_csv $out/ablation_offload_limit_burst.csv "" $(for l in 0 2 4 6 10 16 30; do echo "$tmp/burst_$l.csv"; done)

# The paper's settings: CSVs, the side-by-side tables (docs/results/paper_tables.md) and the rule's inputs.
/usr/bin/python3 reference_engine/scripts/paper_results.py "$tmp"
echo "wrote $out/engine_* $out/ablation_offload_limit_* $out/paper_*"
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 reference_engine/scripts/plot_sweeps.py
else
  echo "python3-matplotlib not installed: no plots (apt-get install python3-matplotlib)" >&2
fi
