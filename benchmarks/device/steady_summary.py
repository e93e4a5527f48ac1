#!/usr/bin/env python3
"""Summarises benchmarks/device/steady_breakdown.sh's folder: per model × tokens × configuration, the layer's
median µs in paged_moe_bench's steady state (contiguous and paged), the SM clock and board power nvidia-smi saw
while the GPU was busy (samples at ≥ 90% utilisation), and every kernel's median µs, cycles and clock under
Nsight Compute (launches serialised; caches and clocks left as they were). "kernels" sums the medians of the
kernels launched once per layer call (those with at least half the launches of the most frequent one), each
kernel once: its paged and contiguous instantiations' launches taken together.
    python3 benchmarks/device/steady_summary.py FOLDER
"""
import glob
import json
import os
import re
import statistics
import sys

from kernel_breakdown import metric_groups
from precision_alone import busy_samples


def long_name(name):
    """A kernel's name with its template arguments (the stages of one kernel template differ only there)."""
    name = re.sub(r"^void ", "", name)
    return re.split(r"[(]", name, maxsplit=1)[0].replace("amoeba::kernels::", "")[:120]


def without_addressing(name):
    """A kernel's name with its addressing policy (Paged, Contiguous) left out."""
    return re.sub(r"\b(amoeba::)?(Paged|Contiguous)\b", "·", name)


def kernels(path):
    """{(kernel, grid): {"us": [..], "cycles": [..]}} from an ncu CSV (empty when it has no rows)."""
    try:
        groups = metric_groups(path, name=long_name)
    except (OSError, StopIteration):
        return {}
    return {key: {"us": m.get("gpu__time_duration.sum", []), "cycles": m.get("sm__cycles_elapsed.max", [])}
            for key, m in groups.items()}


def layer_us(path):
    try:
        doc = json.load(open(path))
    except (OSError, ValueError):
        return None, None
    for case in doc.get("cases", []):
        for c in case.get("configs", []):
            paged = [p["us"] for p in c.get("paged", [])]
            return c["contiguous_us"], (paged[0] if paged else None)
    return None, None


def main():
    folder = sys.argv[1]
    for base in sorted(glob.glob(os.path.join(folder, "*.clk.csv"))):
        stem = base[: -len(".clk.csv")]
        name = os.path.basename(stem)
        contiguous, paged = layer_us(stem + ".json")
        sm, power = busy_samples(base)
        clk = f"{statistics.median(sm):.0f} MHz, {statistics.median(power):.0f} W ({len(sm)} samples)" if sm else "no busy samples"
        print(f"== {name}: layer contiguous {contiguous} us, paged {paged} us; while busy {clk}")
        ks = kernels(stem + ".ncu.csv")
        if not ks:
            print("   no ncu rows")
            continue
        # The benchmark replays a contiguous and a paged graph, so a kernel's two instantiations share the
        # launches of the ncu window: "kernels" sums each kernel once, over both instantiations' launches.
        merged = {}
        for (k, grid), m in ks.items():
            merged.setdefault((without_addressing(k), grid), []).extend(m["us"])
        most = max(len(us) for us in merged.values())
        for (k, grid), m in sorted(ks.items(), key=lambda kv: -statistics.median(kv[1]["us"] or [0])):
            us = statistics.median(m["us"]) if m["us"] else float("nan")
            cyc = statistics.median(m["cycles"]) if m["cycles"] else float("nan")
            per_layer = len(merged[(without_addressing(k), grid)]) * 2 >= most
            print(f"   {us:9.1f} us {cyc:10.0f} cyc {cyc / us:6.0f} MHz  x{len(m['us']):<3d} {'' if per_layer else '(not every call) '}{k} grid{grid}")
        total = sum(statistics.median(us) for us in merged.values() if us and len(us) * 2 >= most)
        print(f"   kernels: {total:.1f} us (each kernel once, paged and contiguous launches together)")


if __name__ == "__main__":
    main()
