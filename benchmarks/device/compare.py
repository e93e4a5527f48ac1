#!/usr/bin/env python3
"""One paged_moe_bench configuration against another, measured in the same processes (an A/B): per model ×
token count, each configuration's contiguous median as mean ± sd over the files (one process per seed), and
`other` / `base` taken process by process, as mean ± sd.

  python3 benchmarks/device/compare.py BASE OTHER bench_1.json bench_2.json ...
  e.g. compare.py narrow wide grouped_seed*.json   (benchmarks/device/grouped_run.sh)
       compare.py bf16-decode bf16-grouped cross_*.json
"""
import json
import sys

from quant_report import mean_sd  # 'm ± sd' over the files, or the one value
from report import tile  # a configuration's path/tile label


def main(base, other, files):
    rows, tiles = {}, {}
    for f in files:
        for c in json.load(open(f))["cases"]:
            key = (c["model"], c["tokens"])
            r = rows.setdefault(key, {})
            for x in c["configs"]:
                r.setdefault(x["config"], []).append(x["contiguous_us"])
                tiles.setdefault(key, {})[x["config"]] = tile(x)
    print(f"| model | T | {base} µs | {other} µs | {other} / {base} | tiles ({base}, {other}) |")
    print("|---|---:|---:|---:|---:|---|")
    for (model, tokens), r in rows.items():
        a, b = r.get(other), r.get(base)
        if a and b:
            t = tiles[(model, tokens)]
            print(f"| {model} | {tokens} | {mean_sd(b)} | {mean_sd(a)} | "
                  f"{mean_sd([x / y for x, y in zip(a, b)], '{:.3f}')} | {t[base]}, {t[other]} |")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
