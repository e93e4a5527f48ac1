#!/usr/bin/env python3
"""Collects `amoeba calibrate` / `amoeba validate` outputs into one results JSON and a markdown table.

    python3 benchmarks/device/calibration_summary.py --out results.json \
        --run DIR COMMIT [PRECISION] [--run DIR COMMIT [PRECISION] ...]

Each DIR holds what benchmarks/device/calibration_run.sh packs (calibration.tgz, unpacked): the fitted cost
models (<model>.json) and validate_<model>_<policy>_<trace>.json. COMMIT names the binaries that made them;
PRECISION the experts' (bf16, int8, int4) where a validate JSON does not record it (those written before
`expert_precision` was added to it); a recorded one wins, a differing PRECISION is an error.
Prints the table (step error paired and priced when present, end-to-end ratios, targets in bold) to stdout and
writes the JSON to --out (nothing is written anywhere else).
"""
import argparse
import glob
import json
import os
import sys

TARGETS = {"median": 0.05, "p90": 0.15, "ratio": 0.10}


def load(path):
    with open(path) as f:
        return json.load(f)


def workload(run):
    """The run's workload line, with its memory where the report gives it (validate since ccb6152)."""
    m = run.get("memory")
    if not m:
        return run["workload"]
    return (f'{run["workload"]}; {m["gpu_memory_gib"]:.2f} GiB, at most {m["expert_offload_limit"]} experts '
            f'per layer offloaded')


def bold(text, ok):
    return f"**{text}**" if ok else text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", nargs="+", action="append", metavar="DIR COMMIT [PRECISION]", required=True)
    ap.add_argument("--out", required=True, help="the results JSON")
    args = ap.parse_args()

    cost_models, runs = [], []
    for run in args.run:
        if len(run) not in (2, 3):
            sys.exit(f"calibration_summary: --run takes DIR COMMIT [PRECISION], got {run}")
        folder, commit = run[:2]
        precision = run[2] if len(run) == 3 else None
        for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
            d = load(path)
            name = os.path.basename(path)
            if d.get("format") == "amoeba.validation":
                recorded = d.get("expert_precision")
                if recorded and precision and recorded != precision:
                    sys.exit(f"calibration_summary: {path} records expert_precision {recorded}, --run says "
                             f"{precision}")
                runs.append({"commit": commit, "file": name, "expert_precision": recorded or precision, **d})
            elif "moe_memory_efficiency" in d:
                cost_models.append({"commit": commit, "file": name, **d})
    if not runs:
        sys.exit("calibration_summary: no validate_*.json in " + ", ".join(r[0] for r in args.run))

    print("| model | precision | policy | workload | commit | paired steps | median | p90 | priced median "
          "| priced p90 | throughput | TTFT p50 | TPOT p50 |")
    print("|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        s, e = r["steps"], r["end_to_end"]
        m, sim = e["measured"], e["simulated"]

        def ratio(key):
            x = sim[key] / m[key] if m[key] else float("nan")
            return bold(f"{x:.3f}", abs(x - 1) <= TARGETS["ratio"])

        med = s.get("median_abs_rel_error")
        p90 = s.get("p90_abs_rel_error")
        pr = r.get("priced_steps", {})
        cells = [
            r["model"], r["expert_precision"] or "-", r["policy"], workload(r), r["commit"],
            f"{s['paired']} of {s['measured']}",
            bold(f"{100 * med:.2f}%", med <= TARGETS["median"]) if med is not None else "-",
            bold(f"{100 * p90:.2f}%", p90 <= TARGETS["p90"]) if p90 is not None else "-",
            bold(f"{100 * pr['median_abs_rel_error']:.2f}%", pr["median_abs_rel_error"] <= TARGETS["median"])
            if pr else "-",
            bold(f"{100 * pr['p90_abs_rel_error']:.2f}%", pr["p90_abs_rel_error"] <= TARGETS["p90"])
            if pr else "-",
            ratio("throughput_tok_s"), ratio("ttft_p50_ms"), ratio("tpot_p50_ms"),
        ]
        print("| " + " | ".join(str(c) for c in cells) + " |")

    with open(args.out, "w") as f:
        json.dump({"targets": TARGETS, "cost_models": cost_models, "validations": runs}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
