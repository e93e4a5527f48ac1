#!/usr/bin/env python3
"""Sums an Nsight Compute CSV (`ncu --metrics gpu__time_duration.sum --csv ...`) per kernel: calls, total and
mean µs, share of the total, in descending order of total time. Kernel names are cut at their template or
parameter list. Used by benchmarks/device/engine_decode.sh (NCU=1). With --per-launch: one line per launch
with every metric the CSV holds (benchmarks/device/gemv_probe.sh). With --medians: per kernel and grid (a
decode GEMV's gate/up and down stages differ in their grids), the launches and the median of every metric
per launch, times in µs and bytes in MB (benchmarks/device/gemv_dram_probe.sh).
    python3 benchmarks/device/kernel_breakdown.py [--per-launch | --medians] NCU.csv
"""
import collections
import csv
import re
import statistics
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


def scaled(value, unit):
    """A metric value in µs (times) or MB (bytes); other units as they are."""
    times = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    sizes = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}
    return value * times.get(unit, sizes.get(unit, 1.0))


def metric_groups(path, name=short):
    """{(name(kernel), grid): {metric: [value per launch]}}, times in µs and bytes in MB (steady_summary.py
    names kernels with their template arguments)."""
    groups = {}
    for r in rows(path):
        key = (name(r["Kernel Name"]), r["Grid Size"])
        v = scaled(float(r["Metric Value"].replace(",", "")), r.get("Metric Unit", ""))
        groups.setdefault(key, collections.defaultdict(list))[r["Metric Name"]].append(v)
    return groups


def medians(path):
    for (name, grid), metrics in sorted(metric_groups(path).items()):
        n = max(len(v) for v in metrics.values())
        values = "; ".join(f"{m}={statistics.median(v):.1f}" for m, v in sorted(metrics.items()))
        print(f"{name} grid{grid} launches={n} median: {values}")


def main():
    if sys.argv[1] == "--per-launch":
        per_launch(sys.argv[2])
        return
    if sys.argv[1] == "--medians":
        medians(sys.argv[2])
        return
    total = collections.defaultdict(float)
    calls = collections.Counter()
    for row in rows(sys.argv[1]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        us = scaled(float(row["Metric Value"].replace(",", "")), row.get("Metric Unit") or "ns")
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
