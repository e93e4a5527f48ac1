#!/usr/bin/env python3
"""The quantized experts' layer times over several paged_moe_bench processes (benchmarks/device/quant_run.sh):
one markdown row per model × token count with bf16, int8 and int4 µs as mean ± sd over the processes, each
precision's ratio to the read floor of its own bytes, and int8 / int4 over bf16 measured in the same process.

  python3 benchmarks/device/quant_report.py quant_p1.json quant_p2.json quant_p3.json
  python3 benchmarks/device/quant_report.py --paths quant_paths.json   # decode vs grouped per precision
  python3 benchmarks/device/quant_report.py --chain chain_1.json chain_2.json chain_3.json
      # each layer beside its kernel chain (paged_moe_bench's chain_* shapes: the same E, k and chunks on
      # experts of H 256 and F 128), against the room the decode targets leave above the floor

Each precision's path is the one its configuration chose (files from before the per-configuration "path"
field show the bf16 path for all): decode, grouped, or split-K where the call took the split-K decode (the
configuration's `splitk` field; files from before it say decode).
"""
import json
import statistics as st
import sys

from report import mean_sd as _mean_sd  # the paged-MoE report's (benchmarks/device/report.py)
from report import tile


def mean_sd(v, fmt="{:.1f}"):
    """'m ± sd' over the processes, or the one value."""
    return (fmt + " ± " + fmt).format(*_mean_sd(v)) if len(v) > 1 else fmt.format(v[0])


def read_floor_us(config, read_gbs):
    """A configuration's expert bytes at the process's measured read rate, in µs."""
    return config["expert_bytes"] / (read_gbs * 1e9) * 1e6


def main(files):
    rows = {}
    for f in files:
        d = json.load(open(f))
        for c in d["cases"]:
            cs = {x["config"]: x for x in c["configs"]}
            r = rows.setdefault((c["model"], c["tokens"]), {"path": {}, "us": {}, "floor": {}})
            for cfg, name in (("default", "bf16"), ("int8", "int8"), ("int4", "int4")):
                if cfg in cs:
                    # the path of report.py's tile label (the case's path where the file has none per
                    # configuration)
                    r["path"][name] = tile({**c, **cs[cfg]}).split("/")[0]
                    r["us"].setdefault(name, []).append(cs[cfg]["contiguous_us"])
                    r["floor"].setdefault(name, []).append(read_floor_us(cs[cfg], d["read_gbs"]))
    print("| model | T | paths bf16/int8/int4 | bf16 µs (× floor) | int8 µs (× floor) | int8 / bf16 "
          "| int4 µs (× floor) | int4 / bf16 |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for (model, tokens), r in rows.items():
        def cell(k):
            if k not in r["us"]:
                return "—"
            ratio = st.mean(u / f for u, f in zip(r["us"][k], r["floor"][k]))
            return f"{mean_sd(r['us'][k])} ({ratio:.2f})"

        def rel(k):
            if k not in r["us"] or "bf16" not in r["us"]:
                return "—"
            return mean_sd([a / b for a, b in zip(r["us"][k], r["us"]["bf16"])], "{:.2f}")
        paths = "/".join(r["path"].get(k, "—") for k in ("bf16", "int8", "int4"))
        print(f"| {model} | {tokens} | {paths} | {cell('bf16')} | {cell('int8')} | {rel('int8')} | "
              f"{cell('int4')} | {rel('int4')} |")


def paths(files):
    """Decode vs grouped per precision (configs int8-decode, int8-grouped, ...; bf16 'default' beside)."""
    rows = {}
    for f in files:
        for c in json.load(open(f))["cases"]:
            cs = {x["config"]: x["contiguous_us"] for x in c["configs"]}
            r = rows.setdefault((c["model"], c["tokens"]), {})
            for k, v in cs.items():
                r.setdefault(k, []).append(v)
    print("| model | T | bf16 µs | int8 decode µs | int8 grouped µs | grouped / decode | int4 decode µs "
          "| int4 grouped µs | grouped / decode |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (model, tokens), r in rows.items():
        def us(k):
            return mean_sd(r[k]) if k in r else "—"

        def ratio(num, den):  # configuration num's time over den's, process by process
            a, b = r.get(num), r.get(den)
            return mean_sd([x / y for x, y in zip(a, b)], "{:.2f}") if a and b else "—"
        print(f"| {model} | {tokens} | {us('default')} | {us('int8-decode')} | {us('int8-grouped')} | "
              f"{ratio('int8-grouped', 'int8-decode')} | {us('int4-decode')} | {us('int4-grouped')} | "
              f"{ratio('int4-grouped', 'int4-decode')} |")


CHAIN_H, CHAIN_F = 256, 128  # the chain shapes' experts (paged_moe_bench's chain_* models)
ALLOWANCE = {"default": 0.5, "int8": 0.3, "int4": 0.3}  # the decode targets (1.5x, 1.3x) less the floor


def chain(files):
    """Each real layer beside the chain shape with its E, k and shared chunks, process by process: the chain's
    and the layer's µs, the layer's read floor, layer / floor, (layer - chain) / floor, and the chain over the
    target's room above the floor (ALLOWANCE x floor)."""
    runs = {}  # (E, k, chunks, tokens, config) -> {"chain" | "layer": [(µs, floor µs), ...], "model": name}
    for f in files:
        d = json.load(open(f))
        for c in d["cases"]:
            chained = c["H"] == CHAIN_H and c["F"] == CHAIN_F
            for x in c["configs"]:
                r = runs.setdefault((c["E"], c["k"], c["shared_chunks"], c["tokens"], x["config"]), {})
                if not chained:
                    r["model"] = c["model"]
                r.setdefault("chain" if chained else "layer", []).append(
                    (x["contiguous_us"], read_floor_us(x, d["read_gbs"])))
    print("| model | T | precision | chain µs | layer µs | floor µs | layer / floor | (layer − chain) / floor "
          "| chain / allowance |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    worst_sd = 0.0
    for (_, _, _, tokens, config), r in runs.items():
        if "chain" not in r or "layer" not in r:
            continue
        ch, (layer, floor) = [u for u, _ in r["chain"]], zip(*r["layer"])
        layer, floor = list(layer), list(floor)
        ratios = [[l / f for l, f in zip(layer, floor)], [(l - c) / f for l, c, f in zip(layer, ch, floor)],
                  [c / (ALLOWANCE[config] * f) for c, f in zip(ch, floor)]]
        worst_sd = max([worst_sd] + [_mean_sd(v)[1] for v in ratios])
        cells = " | ".join(f"{st.mean(v):.2f}" for v in ratios)
        print(f"| {r['model']} | {tokens} | {'bf16' if config == 'default' else config} | "
              f"{mean_sd(ch, '{:.2f}')} | {mean_sd(layer, '{:.2f}')} | {st.mean(floor):.2f} | {cells} |")
    print(f"\nthe ratios' largest sd over the processes: {worst_sd:.3f}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "--paths":
        paths(sys.argv[2:])
    elif sys.argv[1] == "--chain":
        chain(sys.argv[2:])
    else:
        main(sys.argv[1:])
