#!/usr/bin/env python3
"""PagedMoe against vLLM's Triton fused-MoE layer measured on the same GPU in one device call: paged_moe_bench's
files (one process each) beside vllm_peer.py's (one process each), paired process by process in the order given.
Per model × token count: our contiguous and paged layer (placement PLACEMENT, first configuration of the file),
vLLM's layer (routing given, as ours: alignment, two kernels, SiLU·mul, top-k sum) and total (its router's
softmax / top-k too), as mean ± sd over processes, and paged / vLLM layer taken process by process.

  python3 benchmarks/device/peer_compare.py --ours ours_*.json --peer vllm_*.json [--placement shuffled]
      [--json out.json]
"""
import argparse
import json
import statistics


def mean_sd(xs, fmt="{:.1f}"):
    if len(xs) == 1:
        return fmt.format(xs[0])
    return f"{fmt.format(statistics.fmean(xs))} ± {fmt.format(statistics.stdev(xs))}"


def ours_of(path, placement):
    """(model, tokens) -> (contiguous µs, paged µs at `placement`, mean over its seeds) of the first config."""
    out = {}
    for c in json.load(open(path))["cases"]:
        x = c["configs"][0]
        paged = [p["us"] for p in x["paged"] if p["placement"] == placement]
        out[(c["model"], c["tokens"])] = (x["contiguous_us"], statistics.fmean(paged) if paged else None)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ours", nargs="+", required=True)
    ap.add_argument("--peer", nargs="+", required=True)
    ap.add_argument("--placement", default="shuffled")
    ap.add_argument("--json")
    a = ap.parse_args()
    if len(a.ours) != len(a.peer):
        raise SystemExit(f"--ours has {len(a.ours)} files and --peer {len(a.peer)}: pair them process by process")
    ours = [ours_of(f, a.placement) for f in a.ours]
    peer = [{(c["model"], c["tokens"]): c for c in json.load(open(f))["cases"]} for f in a.peer]
    rows = []
    print(f"| model | T | ours contiguous µs | ours paged ({a.placement}) µs | vLLM layer µs | vLLM total µs | "
          "paged / vLLM layer | paged / vLLM total | vLLM config |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for key in peer[0]:
        if not all(key in o and key in p for o, p in zip(ours, peer)):
            continue
        contig = [o[key][0] for o in ours]
        paged = [o[key][1] for o in ours]
        layer = [p[key]["layer_us"] for p in peer]
        total = [p[key]["total_us"] for p in peer]
        cfg = peer[0][key]["config"]
        row = {"model": key[0], "tokens": key[1], "ours_contiguous_us": contig, "ours_paged_us": paged,
               "vllm_layer_us": layer, "vllm_total_us": total, "vllm_config": cfg,
               "paged_over_vllm_layer": [x / y for x, y in zip(paged, layer)],
               "paged_over_vllm_total": [x / y for x, y in zip(paged, total)]}
        rows.append(row)
        tile = f"M{cfg['BLOCK_SIZE_M']} N{cfg['BLOCK_SIZE_N']} K{cfg['BLOCK_SIZE_K']}"
        print(f"| {key[0]} | {key[1]} | {mean_sd(contig)} | {mean_sd(paged)} | {mean_sd(layer)} | "
              f"{mean_sd(total)} | {mean_sd(row['paged_over_vllm_layer'], '{:.3f}')} | "
              f"{mean_sd(row['paged_over_vllm_total'], '{:.3f}')} | {tile} |")
    wins = sum(statistics.fmean(r["paged_over_vllm_layer"]) < 1 for r in rows)
    print(f"\nours (paged) faster than vLLM's layer in {wins} of {len(rows)} cases")
    if a.json:
        json.dump({"placement": a.placement, "ours": a.ours, "peer": a.peer, "cases": rows}, open(a.json, "w"),
                  indent=1)


if __name__ == "__main__":
    main()
