#!/usr/bin/env python3
"""The motivating experiment measured beside the simulator: mean ± sd over the measured processes, and the
same scenario simulated with each cost model named.

    python3 benchmarks/device/motivating_compare.py --amoeba build/ci/reference_engine/amoeba \
        --measured DIR [--cost-models default,h200-qwen1.5] [--out compare.json]

DIR holds what benchmarks/device/engine_motivating.sh writes with REPEATS>=1: measured_rate<R>.json or
measured_rate<R>_r<i>.json (`amoeba ablate --backend cuda --scenario motivating-h200-capped --json`). For each
rate the simulator runs the same scenario, request count, routing source and policies on the CPU (`amoeba
ablate --scenario motivating-h200-capped --rate R --requests N --routing ROUTING --policies P --cost-model C
--predictor none`: the GPU backend prefetches nothing predicted), with the run's --expert-precision and
--gpu-memory-gib where it set them.
Prints one markdown table per rate; --out writes the numbers as JSON. Measured rows are labelled MEASURED,
simulated ones SIMULATED.
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

METRICS = [  # (label, key in a result, sub-key or None, format)
    ("peak conc.", "peak_concurrency", None, "{:.0f}"),
    ("forward steps", "forward_steps", None, "{:.0f}"),
    ("tok/s", "throughput_tok_s", None, "{:.1f}"),
    ("TTFT p50 ms", "ttft_ms", "p50", "{:.0f}"),
    ("TTFT p99 ms", "ttft_ms", "p99", "{:.0f}"),
    ("TPOT p50 ms", "tpot_ms", "p50", "{:.1f}"),
    ("expert GB H2D", "expert_bytes_h2d", None, "{:.1f}"),
    ("preemptions", "preemptions", None, "{:.0f}"),
]


def value(result, key, sub):
    v = result.get(key)
    if sub is not None:
        v = v.get(sub) if isinstance(v, dict) else None
    if v is None:
        return None
    return v / 1e9 if key == "expert_bytes_h2d" else float(v)


def routing_of(scenario):
    return scenario.get("routing", {}).get("source") or "synthetic"


def by_policy(doc):
    return {r["policy"]: r for r in doc["results"]}


def simulate(amoeba, scenario, cost_model):
    w = scenario["workload"]
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    # The GPU backend prefetches no predicted experts: the simulator runs no predictor either.
    cmd = [amoeba, "ablate", "--scenario", "motivating-h200-capped", "--rate", str(w["rate"]), "--requests",
           str(w["requests"]), "--policies", ",".join(scenario["policies"]), "--cost-model", cost_model,
           "--predictor", "none", "--routing", routing_of(scenario)]
    # A quantized or capped run (engine_motivating.sh's ARGS): the same precision and memory cap.
    if scenario.get("expert_precision", "bf16") != "bf16":
        cmd += ["--expert-precision", scenario["expert_precision"]]
    if scenario.get("memory_cap_gib"):
        cmd += ["--gpu-memory-gib", str(scenario["memory_cap_gib"])]
    cmd += ["--json", path, "--quiet"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(path) as f:
        doc = json.load(f)
    os.unlink(path)
    return doc, " ".join(cmd[:-3])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--amoeba", required=True, help="a CPU build of amoeba (runs the simulator)")
    ap.add_argument("--measured", required=True, help="the folder engine_motivating.sh wrote")
    ap.add_argument("--cost-models", default="default,h200-qwen1.5")
    ap.add_argument("--out", help="write the numbers as JSON here")
    args = ap.parse_args()

    runs = {}
    for path in sorted(glob.glob(os.path.join(args.measured, "measured_rate*.json"))):
        m = re.match(r"measured_rate([0-9.]+)(?:_r\d+)?\.json$", os.path.basename(path))
        if m:
            with open(path) as f:
                runs.setdefault(m.group(1), []).append(json.load(f))
    if not runs:
        sys.exit(f"motivating_compare: no measured_rate*.json in {args.measured}")
    out = {}
    for rate, docs in sorted(runs.items(), key=lambda kv: float(kv[0])):
        scenario = docs[0]["scenario"]
        sims = {c: simulate(args.amoeba, scenario, c) for c in args.cost_models.split(",")}
        policies = scenario["policies"]
        n = len(docs)
        print(f"\n### {rate} req/s, {scenario['workload']['requests']} requests, "
              f"{scenario.get('expert_precision', 'bf16')} experts, routing "
              f"{routing_of(scenario)}: MEASURED over {n} process(es) (mean ± sd) beside the "
              f"SIMULATED GPU per cost model\n")
        cols = ["MEASURED"] + [f"SIMULATED {c}" for c in sims]
        print("| policy | metric | " + " | ".join(cols) + " |")
        print("|---|---|" + "---:|" * len(cols))
        out[rate] = {"measured_processes": n, "simulate_commands": {c: s[1] for c, s in sims.items()},
                     "rows": []}
        for p in policies:
            for label, key, sub, fmt in METRICS:
                vals = [value(by_policy(d)[p], key, sub) for d in docs if p in by_policy(d)]
                vals = [v for v in vals if v is not None]
                if vals:
                    mean = statistics.fmean(vals)
                    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
                    meas = fmt.format(mean) + (" ± " + fmt.format(sd) if len(vals) > 1 else "")
                else:
                    mean, sd, meas = None, None, "-"
                simv = {c: value(by_policy(s[0])[p], key, sub) for c, s in sims.items()}
                print(f"| {p} | {label} | {meas} | " +
                      " | ".join("-" if v is None else fmt.format(v) for v in simv.values()) + " |")
                out[rate]["rows"].append({"policy": p, "metric": label, "measured_mean": mean,
                                          "measured_sd": sd, "measured_values": vals, "simulated": simv})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
