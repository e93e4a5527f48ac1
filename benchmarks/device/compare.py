#!/usr/bin/env python3
"""One paged_moe_bench configuration against another, measured in the same processes (an A/B): per model ×
token count, each configuration's contiguous median as mean ± sd over the files (one process per seed), and
`other` / `base` taken process by process, as mean ± sd.

  python3 benchmarks/device/compare.py [--paged] [--floor] [--paged-ratio] BASE OTHER bench_1.json bench_2.json ...
--paged adds each configuration's paged views over its contiguous median, mean ± sd over files × views (%).
--floor adds each configuration's contiguous median over the read floor of its own expert bytes (the bytes at
the process's measured read rate, quant_report.read_floor_us), mean over the files.
--paged-ratio adds `other` / `base` on paged experts: per file, the mean of each configuration's paged views,
their ratio, mean ± sd over the files (two builds' configurations after merge_ab.py, bin_ab.sh).
  e.g. compare.py narrow wide grouped_seed*.json   (benchmarks/device/grouped_run.sh)
       compare.py bf16-decode bf16-grouped cross_*.json
"""
import json
import statistics
import sys

from quant_report import mean_sd, read_floor_us  # 'm ± sd' over the files, or the one value
from report import tile  # a configuration's path/tile label


def signed(v):
    """'+m ± sd%' over the values."""
    return f"{statistics.mean(v):+.2f} ± {statistics.stdev(v) if len(v) > 1 else 0.0:.2f}%"


def main(base, other, files, paged=False, floor=False, paged_ratio=False):
    rows, tiles, views, floors, paged_means = {}, {}, {}, {}, {}
    for f in files:
        data = json.load(open(f))
        for c in data["cases"]:
            key = (c["model"], c["tokens"])
            r = rows.setdefault(key, {})
            for x in c["configs"]:
                r.setdefault(x["config"], []).append(x["contiguous_us"])
                floors.setdefault(key, {}).setdefault(x["config"], []).append(
                    x["contiguous_us"] / read_floor_us(x, data["read_gbs"]))
                tiles.setdefault(key, {})[x["config"]] = tile(x)
                views.setdefault(key, {}).setdefault(x["config"], []).extend(
                    100.0 * (v["us"] - x["contiguous_us"]) / x["contiguous_us"] for v in x.get("paged", []))
                paged_means.setdefault(key, {}).setdefault(x["config"], []).append(
                    statistics.mean(v["us"] for v in x["paged"]) if x.get("paged") else None)
    extra = f" {base} paged vs contig | {other} paged vs contig |" if paged else ""
    extra += f" {base} × floor | {other} × floor |" if floor else ""
    extra += f" {other} / {base} paged |" if paged_ratio else ""
    print(f"| model | T | {base} µs | {other} µs | {other} / {base} | tiles ({base}, {other}) |{extra}")
    print("|---|---:|---:|---:|---:|---|" + ("---:|---:|" if paged else "") + ("---:|---:|" if floor else "") +
          ("---:|" if paged_ratio else ""))
    for (model, tokens), r in rows.items():
        a, b = r.get(other), r.get(base)
        if a and b:
            t = tiles[(model, tokens)]
            line = (f"| {model} | {tokens} | {mean_sd(b)} | {mean_sd(a)} | "
                    f"{mean_sd([x / y for x, y in zip(a, b)], '{:.3f}')} | {t[base]}, {t[other]} |")
            if paged:
                v = views[(model, tokens)]
                line += "".join(f" {signed(v[n])} |" if v.get(n) else " – |" for n in (base, other))
            if floor:
                line += "".join(f" {statistics.mean(floors[(model, tokens)][n]):.2f} |" for n in (base, other))
            if paged_ratio:
                pm = paged_means[(model, tokens)]
                q = [x / y for x, y in zip(pm[other], pm[base]) if x is not None and y is not None]
                line += f" {mean_sd(q, '{:.3f}')} |" if q else " – |"
            print(line)


if __name__ == "__main__":
    args = sys.argv[1:]
    flags = {a for a in args if a in ("--paged", "--floor", "--paged-ratio")}
    args = [a for a in args if a not in flags]
    if len(args) < 3:
        sys.exit(__doc__)
    main(args[0], args[1], args[2:], "--paged" in flags, "--floor" in flags, "--paged-ratio" in flags)
