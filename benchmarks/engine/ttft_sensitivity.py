#!/usr/bin/env python3
"""How far the simulator's TTFT moves when its step costs move by a percent or two: `amoeba validate --backend
sim` runs one trace on the simulator twice, once with a cost model standing in for the measured GPU
(--measured-cost-model) and once with that cost model's compute (efficiencies, per-layer and per-step
overheads) and/or copy bandwidth scaled by a few percent. A run whose TTFT p50 moves far more than its step
costs is one where no cost model of percent-level accuracy can predict TTFT to 10%: the bound that
docs/results/calibration_h200.md holds the held-out TTFT to.

  python3 benchmarks/engine/ttft_sensitivity.py --amoeba build/ci/reference_engine/amoeba \
      [--cost-model reference_engine/data/cost_models/h200-qwen1.5.json] [--requests 60,150] \
      [--policies static,fixed,elastic] [--scales 0.98,0.99,1.01,1.02] [--json out.json]

The traces and caps are calibration_run.sh's for Qwen1.5-MoE-A2.7B: Poisson seed 1 at 10 req/s and bursty
(gamma 0.5) seed 2 at 8 req/s, 31.84 GiB. CPU only; every number is simulated.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

TRACES = {"poisson": ("1", "10", "1"), "bursty": ("2", "8", "0.5")}


def perturbed(base, compute, copy):
    """The cost model with every compute cost times `compute` and the copy time times `copy`. An efficiency
    cannot pass 1 (the cost model refuses it): one already at 1 stays there when compute < 1, so that phase's
    bound is not scaled (reported on stderr)."""
    d = json.loads(json.dumps(base))
    d["name"] = f"{base.get('name', 'cost')}-compute{compute}-copy{copy}"
    for k in list(d):
        if k.endswith("_efficiency"):
            d[k] = d[k] / compute
            if d[k] > 1.0:
                print(f"ttft_sensitivity: {k} = {base[k]} / {compute} capped at 1 (not scaled)", file=sys.stderr)
                d[k] = 1.0
    d["per_layer_overhead_us"] = d.get("per_layer_overhead_us", 0.0) * compute
    d["step_overhead_us"] = d.get("step_overhead_us", 0.0) * compute
    d["h2d_bandwidth_scale"] = d.get("h2d_bandwidth_scale", 1.0) / copy
    return d


def ratio(text, label):
    m = re.search(r"^" + re.escape(label) + r".*?([0-9.]+)\s*$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--amoeba", required=True)
    ap.add_argument("--cost-model", default="reference_engine/data/cost_models/h200-qwen1.5.json")
    ap.add_argument("--model", default="qwen1.5-moe-a2.7b")
    ap.add_argument("--requests", default="60,150")
    ap.add_argument("--policies", default="static,fixed,elastic")
    ap.add_argument("--traces", default="poisson,bursty")
    ap.add_argument("--scales", default="0.98,0.99,1.01,1.02")
    ap.add_argument("--json")
    a = ap.parse_args()
    base = json.load(open(a.cost_model))
    scales = [float(s) for s in a.scales.split(",")]
    variants = [("compute", s, 1.0) for s in scales] + [("copy", 1.0, s) for s in scales] + \
               [("both", s, s) for s in scales]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        measured = os.path.join(tmp, "measured.json")
        json.dump(base, open(measured, "w"))
        print(f"{'policy':8} {'trace':8} {'req':>4} {'what':8} {'scale':>5}  {'tput':>6} {'TTFT50':>6} "
              f"{'TPOT50':>6}  TTFT by request (median p10 p90)")
        for policy in a.policies.split(","):
            for trace in a.traces.split(","):
                seed, rate, burst = TRACES[trace]
                for requests in a.requests.split(","):
                    for what, comp, copy in variants:
                        path = os.path.join(tmp, "sim.json")
                        json.dump(perturbed(base, comp, copy), open(path, "w"))
                        cmd = [a.amoeba, "validate", "--backend", "sim", "--measured-cost-model", measured,
                               "--cost-model", path, "--model", a.model, "--gpu", "h200", "--gpu-memory-gib",
                               "31.84", "--policy", policy, "--requests", requests, "--rate", rate,
                               "--burstiness", burst, "--seed", seed, "--quiet"]
                        out = subprocess.run(cmd, capture_output=True, text=True)
                        if out.returncode != 0:
                            sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
                        t = out.stdout
                        pr = re.search(r"request by request.*?median ([0-9.]+), p10 ([0-9.]+), p90 ([0-9.]+)", t)
                        row = dict(policy=policy, trace=trace, requests=int(requests), perturbed=what,
                                   scale=comp if what != "copy" else copy,
                                   throughput=ratio(t, "throughput"), ttft_p50=ratio(t, "TTFT p50"),
                                   tpot_p50=ratio(t, "TPOT p50"),
                                   ttft_paired=[float(x) for x in pr.groups()] if pr else None)
                        rows.append(row)
                        p = row["ttft_paired"] or [float("nan")] * 3
                        print(f"{policy:8} {trace:8} {requests:>4} {what:8} {row['scale']:5.2f}  "
                              f"{row['throughput']:6.3f} {row['ttft_p50']:6.3f} {row['tpot_p50']:6.3f}  "
                              f"{p[0]:.3f} {p[1]:.3f} {p[2]:.3f}", flush=True)
    if a.json:
        json.dump({"cost_model": a.cost_model, "model": a.model, "rows": rows}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
