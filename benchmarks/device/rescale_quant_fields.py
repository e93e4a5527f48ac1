#!/usr/bin/env python3
"""Carries a cost model's int8/int4 MoE fields over a refit of its bf16 fields, on the host: the quantized
fields are factors on the bf16 ones (reference_engine/engine/gpu.hpp: moe_{memory,compute}_efficiency times
int8_/int4_moe_{memory,compute}_scale; moe_token_scale times int8_/int4_moe_token_scale), so after a bf16-only
refit they would price quantized steps differently although the quantized kernels did not change. This
writes REFIT with its int8_/int4_ fields set so that every product equals PREVIOUS's: the scales exactly, the
token tables at the union of the three tables' knots (token_scale_at interpolates in log2 of the tokens, so
between knots the products differ slightly: printed). Everything else is REFIT's. For when a quantized
refit (`benchmarks/device/refit_run.sh` STEPS="int8 int4") is not possible; it is not a measurement.
    python3 benchmarks/device/rescale_quant_fields.py PREVIOUS.json REFIT.json OUT.json
"""
import json
import math
import sys


def token_scale_at(table, tokens):
    """reference_engine/engine/gpu.cpp's token_scale_at: 1 for an empty table, constant beyond the ends,
    linear in log2(tokens) between knots."""
    if not table:
        return 1.0
    if tokens <= table[0]["tokens"]:
        return table[0]["scale"]
    if tokens >= table[-1]["tokens"]:
        return table[-1]["scale"]
    for lo, hi in zip(table, table[1:]):
        if lo["tokens"] <= tokens < hi["tokens"]:
            f = math.log2(tokens / lo["tokens"]) / math.log2(hi["tokens"] / lo["tokens"])
            return lo["scale"] + f * (hi["scale"] - lo["scale"])
    return table[-1]["scale"]


def main(previous_path, refit_path, out_path):
    old, new = json.load(open(previous_path)), json.load(open(refit_path))
    old_bf16, new_bf16 = old.get("moe_token_scale", []), new.get("moe_token_scale", [])
    for p in ("int8", "int4"):
        for kind in ("memory", "compute"):
            key, eff = f"{p}_moe_{kind}_scale", f"moe_{kind}_efficiency"
            new[key] = old[eff] * old[key] / new[eff]
        table = old.get(f"{p}_moe_token_scale", [])
        knots = sorted({k["tokens"] for k in old_bf16 + new_bf16 + table})
        new[f"{p}_moe_token_scale"] = [
            {"tokens": t, "scale": token_scale_at(table, t) * token_scale_at(old_bf16, t) / token_scale_at(new_bf16, t)}
            for t in knots]
        worst = max(abs(token_scale_at(new[f"{p}_moe_token_scale"], t) * token_scale_at(new_bf16, t)
                        / (token_scale_at(table, t) * token_scale_at(old_bf16, t)) - 1) for t in range(1, 2049))
        print(f"{p}: memory scale {new[f'{p}_moe_memory_scale']:.4f}, compute scale "
              f"{new[f'{p}_moe_compute_scale']:.4f}, {len(knots)} knots; token-scale product within "
              f"{100 * worst:.2f}% of the previous one at 1..2048 tokens")
    with open(out_path, "w") as f:
        json.dump(new, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
