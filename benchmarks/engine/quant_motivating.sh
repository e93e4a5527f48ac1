#!/usr/bin/env bash
# The motivating experiment in the simulator with bf16, int8 and int4 experts (docs/results/quantized_h200.md):
# Qwen1.5-MoE-A2.7B on the simulated H200 (scenario motivating-h200-capped, cost model h200-qwen1.5 with the
# quantized kernel's measured scales and tables, synthetic routing, no predictor), static / fixed / elastic,
# at 10 req/s (100 requests) and 20 req/s (150 requests); each precision under the 31.84 GiB cap and, for
# int8 / int4, under a cap that leaves the KV room bf16 has at 31.84 GiB (19.5 / 13.3 GiB). CPU only: every
# number is SIMULATED. Prints one markdown table.
#   AMOEBA=build/ci/reference_engine/amoeba bash benchmarks/engine/quant_motivating.sh
set -euo pipefail
amoeba=${AMOEBA:-build/ci/reference_engine/amoeba}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "| rate | experts | cap GiB | policy | tok/s | TTFT p50 ms | TPOT p50 ms | peak conc. | expert GB H2D |"
echo "|---:|---|---:|---|---:|---:|---:|---:|---:|"
for run in "10 100" "20 150"; do
  read -r rate requests <<<"$run"
  for pc in "bf16 31.84" "int8 31.84" "int8 19.5" "int4 31.84" "int4 13.3"; do
    read -r precision cap <<<"$pc"
    "$amoeba" ablate --scenario motivating-h200-capped --rate "$rate" --requests "$requests" \
      --policies static,fixed,elastic --cost-model h200-qwen1.5 --predictor none --routing synthetic \
      --expert-precision "$precision" --gpu-memory-gib "$cap" --quiet --json "$tmp/r.json" >/dev/null
    python3 - "$tmp/r.json" "$rate" "$precision" "$cap" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for x in d["results"]:
    print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {x['policy']} | {x['throughput_tok_s']:.1f} | "
          f"{x['ttft_ms']['p50']:.0f} | {x['tpot_ms']['p50']:.1f} | {x['peak_concurrency']} | "
          f"{x['expert_bytes_h2d'] / 1e9:.1f} |")
PY
  done
done
