#!/usr/bin/env python3
"""Summarises benchmarks/device/precision_alone.sh's folder: per model × tokens and quantized configuration,
the layer's µs over bf16's (`default`) with each configuration alone in its process and with all interleaved
in one process, mean ± sd over the seeds (one ratio per seed: alone, the processes of that seed; interleaved,
that seed's process), the µs of each, and the median SM clock and board power while the GPU was busy (samples
at ≥ 90% utilisation) in each kind of process, averaged over the seeds.
    python3 benchmarks/device/precision_alone.py FOLDER
"""
import collections
import glob
import json
import os
import statistics
import sys


def layer_us(path):
    """{(model, tokens, config): contiguous µs} of one bench JSON."""
    out = {}
    try:
        doc = json.load(open(path))
    except (OSError, ValueError):
        return out
    for case in doc.get("cases", []):
        for c in case.get("configs", []):
            out[(case["model"], case["tokens"], c["config"])] = c["contiguous_us"]
    return out


# What device_common.sh's start_sampler asks nvidia-smi for, in this order.
SAMPLER_QUERY = ["--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu",
                 "--format=csv,noheader,nounits"]


def busy_samples(path):
    """The SM clock (MHz) and board power (W) samples of a start_sampler file taken at >= 90% utilisation."""
    return busy_lines(open(path, errors="replace"))


def busy_lines(lines):
    """busy_samples over the sampler's lines (SAMPLER_QUERY's columns)."""
    sm, power = [], []
    for line in lines:
        f = [x.strip() for x in line.split(",")]
        try:
            if len(f) >= 6 and float(f[5]) >= 90:
                sm.append(float(f[1]))
                power.append(float(f[3]))
        except ValueError:
            continue
    return sm, power


def busy_clock(path):
    sm, power = busy_samples(path)
    return (statistics.median(sm), statistics.median(power)) if sm else None


def ms(values, digits=3):
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def per_seed(by_seed, key, bf16):
    """Over the seeds of {seed: {key: µs}}: key's µs, and its µs over bf16's where the seed has both."""
    us = [d[key] for d in by_seed.values() if key in d]
    return us, [d[key] / d[bf16] for d in by_seed.values() if key in d and bf16 in d]


def main():
    folder = sys.argv[1]
    alone = collections.defaultdict(dict)  # seed -> {(model, tokens, config): us}
    mixed = collections.defaultdict(dict)
    clocks = collections.defaultdict(list)  # (bench model key, kind) -> [(MHz, W)]
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        stem = os.path.basename(path)[: -len(".json")]
        us = layer_us(path)
        clk = busy_clock(path[: -len(".json")] + ".clk.csv")
        if stem.startswith("alone_"):
            rest, config, seed = stem[len("alone_"):].rsplit("_", 2)
            alone[seed].update(us)
            kind = config
        else:
            rest, seed = stem[len("mixed_"):].rsplit("_", 1)
            mixed[seed].update(us)
            kind = "interleaved"
        if clk:
            clocks[(rest, kind)].append(clk)
    keys = sorted({k for d in list(alone.values()) + list(mixed.values()) for k in d})
    cases = sorted({(m, t) for m, t, _ in keys})
    configs = sorted({c for _, _, c in keys if c != "default"})
    print("| model | T | config | alone: µs | alone: / bf16 | interleaved: µs | interleaved: / bf16 |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for model, tokens in cases:
        for config in ["default"] + configs:
            key, bf16 = (model, tokens, config), (model, tokens, "default")
            a, ra = per_seed(alone, key, bf16)
            m, rm = per_seed(mixed, key, bf16)
            bf = config == "default"
            print(f"| {model} | {tokens} | {config} | {ms(a, 1)} | {'' if bf else ms(ra)} | {ms(m, 1)} | "
                  f"{'' if bf else ms(rm)} |")
    print()
    print("| processes of | configuration | busy SM clock MHz | board power W | processes |")
    print("|---|---|---:|---:|---:|")
    for (rest, kind), v in sorted(clocks.items()):
        print(f"| {rest} | {kind} | {statistics.mean(x for x, _ in v):.0f} | "
              f"{statistics.mean(w for _, w in v):.0f} | {len(v)} |")


if __name__ == "__main__":
    main()
