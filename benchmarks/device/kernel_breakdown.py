#!/usr/bin/env python3
"""Sums an Nsight Compute CSV (`ncu --metrics gpu__time_duration.sum --csv ...`) per kernel: calls, total and
mean µs, share of the total, in descending order of total time. Kernel names are cut at their template or
parameter list. Used by benchmarks/device/engine_decode.sh (NCU=1). With --per-launch: one line per launch
with every metric the CSV holds (benchmarks/device/gemv_probe.sh).
    python3 benchmarks/device/kernel_breakdown.py [--per-launch] NCU.csv
"""
import collections
import csv
import re
import sys


def short(name):
    name = re.sub(r"^void ", "", name)
    name = re.split(r"[<(]", name, maxsplit=1)[0]
    return name.split("::")[-1] if len(name) > 60 else name


def rows(path):
    lines = open(path, errors="replace").read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    return list(csv.DictReader(lines[start:]))


def per_launch(path):
    launches = {}
    for r in rows(path):
        key = (r["ID"], short(r["Kernel Name"]), r["Grid Size"])
        launches.setdefault(key, {})[r["Metric Name"]] = f'{r["Metric Value"]} {r["Metric Unit"]}'
    for (_, name, grid), metrics in launches.items():
        print(name, grid, "; ".join(f"{m}={v}" for m, v in metrics.items()))


def main():
    if sys.argv[1] == "--per-launch":
        per_launch(sys.argv[2])
        return
    total = collections.defaultdict(float)
    calls = collections.Counter()
    for row in rows(sys.argv[1]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        us = v / 1e3 if unit == "ns" else v * 1e3 if unit == "msecond" else v if unit == "usecond" else v / 1e3
        k = short(row["Kernel Name"])
        total[k] += us
        calls[k] += 1
    s = sum(total.values())
    print(f"{'kernel':60} {'calls':>6} {'total us':>10} {'mean us':>9} {'share':>6}")
    for k, t in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"{k[:60]:60} {calls[k]:6d} {t:10.1f} {t / calls[k]:9.2f} {100 * t / s:5.1f}%")
    print(f"{'all':60} {sum(calls.values()):6d} {s:10.1f}")


if __name__ == "__main__":
    main()
