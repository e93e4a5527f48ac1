"""Merges the kernel benchmark of several processes (and the PyTorch matmul rate and baseline) into one
results JSON and a markdown table. Writes only the two files it is given.

    python3 benchmarks/device/report.py --bench p1.json p2.json p3.json --torch torch.json [--sustained mm.json] \
        --out-json X.json --out-md X.md [--commit C] [--date D] [--command "..."] [--note "..."]

Every paged-vs-contiguous ratio is a mean ± sd over all processes × page-permutation seeds of one placement;
times are means ± sd over processes of each process's median. Floors: max(expert bytes / read bandwidth,
FLOPs / matmul rate), once with the rates measured in the same call and once with the datasheet's; with
--sustained (matmul_sustained.py's JSON) a third time, at the matmul rate sustained at the board's power limit,
where the layer runs (the torch rate is a 20 ms burst).
"""
import argparse
import json
import statistics

DATASHEET_GBS = 4800.0  # H200 SXM HBM3e
DATASHEET_TFLOPS = 989.0  # dense bf16


def tile(x):
    """A configuration's path and tile as the results tables write it: decode/8, grouped/64, grouped/128×256,
    grouped/128×256+copy (on a dequantised bf16 copy: MoeConfig::grouped_dequant), grouped/64 (8 stages)
    (MoeConfig::small_deep); split-K/128 pairs, split-K/64, split-K/128 pairs mma, split-K/64 pairs 2 steps
    where the call took the split-K decode (the bench's `splitk` field; files from before it say decode/8)."""
    sk = x.get("splitk")
    if sk:
        t = f'split-K/{sk["features"]}' + (" pairs" if sk["h_split"] == 2 else "")
        t += f' {sk["steps"]} steps' if sk.get("steps") else ""
        return t + (" mma" if sk.get("mma") else "")
    t = f'{x["path"]}/{x["tile_tokens"]}'
    t = t + "×256" if x["path"] != "decode" and x.get("grouped_rows") == 256 else t
    t = t + " (8 stages)" if x.get("small_deep") else t
    return t + "+copy" if x.get("grouped_dequant") else t


# vLLM fused_moe (Triton 3.6, routed experts only, whole layer incl. routing), µs: GPU_NOTES, "The strongest
# peer" (H200, 2026-12-01, project commit 67fa3b5).
VLLM_US = {
    "qwen1.5-moe-a2.7b": {1: 46.8, 16: 206.1, 64: 284.8, 1024: 361.9, 4096: 842.2, 16384: 2604.0},
    "qwen3-30b-a3b": {1: 50.4, 16: 231.4, 64: 334.2, 1024: 431.6, 4096: 886.5, 16384: 2868.0},
    "mixtral-8x7b": {1: 202.0, 16: 666.7, 64: 689.5, 1024: 1639.0, 4096: 5065.0, 16384: 19102.0},
}


def mean_sd(values):
    values = list(values)
    m = statistics.fmean(values)
    return m, (statistics.stdev(values) if len(values) > 1 else 0.0)


def floor_parts(case, gbs, tflops):
    """The layer's read floor and compute floor in µs: its expert bytes at `gbs` GB/s, its FLOPs at `tflops`."""
    return case["expert_bytes"] / (gbs * 1e9) * 1e6, case["flops"] / (tflops * 1e12) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", nargs="+", required=True)
    ap.add_argument("--torch", required=True)
    ap.add_argument("--sustained", help="matmul_sustained.py --json output: adds the sustained-rate floor")
    ap.add_argument("--out-json", required=True)
    ap.add_argument("--out-md", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--date", default="unknown")
    ap.add_argument("--command", default="bash benchmarks/device/run.sh")
    ap.add_argument("--note", default="", help="an extra line under the command (how the binaries were built)")
    a = ap.parse_args()
    runs = [json.load(open(f)) for f in a.bench]
    # How the benchmark drew the routing (paged_moe_bench --router; files from before the option: uniform).
    routers = sorted({r.get("router", "uniform") for r in runs})
    if len(routers) != 1:
        raise SystemExit(f"report.py: the bench files were drawn with different routers ({', '.join(routers)})")
    router = routers[0]
    try:
        torch = json.load(open(a.torch))
    except (OSError, ValueError):
        torch = {"cases": [], "matmul_tflops": None, "torch": "unavailable"}
    tflops = torch.get("matmul_tflops") or 790.0
    sustained = None
    if a.sustained:
        try:
            sustained = statistics.fmean(x["tflops"] for x in json.load(open(a.sustained))["rounds"])
        except (OSError, ValueError, KeyError, statistics.StatisticsError) as e:
            raise SystemExit(f"report.py: --sustained {a.sustained}: no rounds with a 'tflops' value ({e})")
    read_gbs = statistics.fmean(r["read_gbs"] for r in runs)
    copy_gbs = statistics.fmean(r["copy_gbs"] for r in runs)
    tmap = {(c["model"], c["tokens"]): c for c in torch["cases"]}

    keys = [(c["model"], c["tokens"]) for c in runs[0]["cases"]]
    # The first configuration of each case is the one reported (the others are A/B runs).
    for r in runs:
        for c in r["cases"]:
            if "configs" in c:
                c.update(contiguous_us=c["configs"][0]["contiguous_us"], paged=c["configs"][0]["paged"])
    per_run = [{(c["model"], c["tokens"]): c for c in r["cases"]} for r in runs]
    rows = []
    for key in keys:
        cs = [pr[key] for pr in per_run if key in pr]
        c0 = cs[0]
        mem_us, cmp_us = floor_parts(c0, read_gbs, tflops)
        floor = max(mem_us, cmp_us)
        ds_floor = max(floor_parts(c0, DATASHEET_GBS, DATASHEET_TFLOPS))
        contig = mean_sd(c["contiguous_us"] for c in cs)
        row = {k: c0[k] for k in ("model", "tokens", "E", "k", "H", "F", "shared_chunks", "path", "tile_tokens",
                                  "distinct_experts", "expert_bytes", "flops")}
        row["grouped_rows"] = c0.get("grouped_rows", 128)  # files from before 256-row grouped blocks: 128
        row["small_deep"] = c0.get("small_deep", False)  # 64-token tiles on 8 stages (MoeConfig::small_deep)
        # The reported configuration's split-K form where its call took one (files from before the field: none).
        row["splitk"] = c0["configs"][0].get("splitk") if "configs" in c0 else None
        row.update(processes=len(cs), contiguous_us=contig[0], contiguous_sd_us=contig[1],
                   floor_us=floor, floor_memory_us=mem_us, floor_compute_us=cmp_us, floor_datasheet_us=ds_floor,
                   floor_kind="mem" if mem_us >= cmp_us else "math")
        placements = {}
        for c in cs:
            for p in c["paged"]:
                placements.setdefault(p["placement"], []).append((p["us"], c["contiguous_us"]))
        row["placements"] = {}
        for name, pairs in placements.items():
            pct = mean_sd(100.0 * (p - q) / q for p, q in pairs)
            us = mean_sd(p for p, _ in pairs)
            row["placements"][name] = {"paged_us": us[0], "paged_sd_us": us[1], "vs_contiguous_pct": pct[0],
                                       "vs_contiguous_sd_pct": pct[1], "samples": len(pairs),
                                       "worst_pct": max(100.0 * (p - q) / q for p, q in pairs)}
        main_pl = "shuffled" if "shuffled" in placements else next(iter(placements))
        samples = [p for p, _ in placements[main_pl]]
        paged = row["placements"][main_pl]["paged_us"]
        row["paged_us"] = paged
        row["paged_over_floor"], row["paged_over_floor_sd"] = mean_sd(p / floor for p in samples)
        row["paged_over_datasheet_floor"], row["paged_over_datasheet_floor_sd"] = mean_sd(p / ds_floor for p in samples)
        if sustained:
            row["floor_sustained_us"] = max(floor_parts(c0, read_gbs, sustained))
            row["paged_over_sustained_floor"], row["paged_over_sustained_floor_sd"] = mean_sd(
                p / row["floor_sustained_us"] for p in samples)
        t = tmap.get((row["model"], row["tokens"]), {})
        row["torch_us"], row["torch_graph_us"] = t.get("torch_us"), t.get("torch_graph_us")
        # vLLM was measured with uniform routing: compared only on the same.
        v = (VLLM_US.get(row["model"], {}).get(row["tokens"])
             if row["shared_chunks"] == 0 and router == "uniform" else None)
        row["vllm_us"] = v
        row["paged_over_vllm"], row["paged_over_vllm_sd"] = mean_sd(p / v for p in samples) if v else (None, None)
        rows.append(row)

    def summary_for(pl):
        vals = [r["placements"][pl] for r in rows if pl in r["placements"]]
        big = [r["placements"][pl] for r in rows if pl in r["placements"] and r["tokens"] >= 16]
        if not vals:
            return None
        return {"mean_pct": statistics.fmean(v["vs_contiguous_pct"] for v in vals),
                "max_mean_pct_at_16_plus": max(v["vs_contiguous_pct"] for v in big) if big else None,
                "max_single_pct_at_16_plus": max(v["worst_pct"] for v in big) if big else None}

    order = {"shuffled": 0, "adjacent": 1, "identity": 2}
    placements = sorted({pl for r in rows for pl in r["placements"]}, key=lambda pl: (order.get(pl, 9), pl))
    summary = {pl: summary_for(pl) for pl in placements}
    out = {"gpu": runs[0]["gpu"], "date": a.date, "commit": a.commit, "command": a.command,
           "processes": len(runs), "read_gbs": read_gbs, "copy_gbs": copy_gbs, "matmul_tflops": tflops,
           "matmul_sustained_tflops": sustained,
           "datasheet_gbs": DATASHEET_GBS, "datasheet_tflops": DATASHEET_TFLOPS, "torch": torch.get("torch"),
           "rotating_sets": runs[0]["sets"], "router": router, "summary": summary, "cases": rows}
    json.dump(out, open(a.out_json, "w"), indent=1)

    # The results file is named for the H200; a run on another card says which in its title.
    md = ["# PagedMoe on the H200" if "H200" in runs[0]["gpu"] else f"# PagedMoe on {runs[0]['gpu']}", ""]
    md.append(f"GPU: {runs[0]['gpu']}; date {a.date}; commit {a.commit}; torch {torch.get('torch')}.  ")
    md.append(f"Command: `{a.command}`.  ")
    if router != "uniform":
        md.append(f"Routing: `--router {router}` (tests/device/routing_draw.hpp); the vLLM times were measured "
                  "with uniform routing, so no vLLM column.  ")
    if a.note:
        md.append(a.note + "  ")
    md.append(f"Measured in the same call: read {read_gbs:.0f} GB/s, device copy {copy_gbs:.0f} GB/s (read+write), "
              f"bf16 matmul {tflops:.0f} TFLOP/s (8192³, torch); datasheet {DATASHEET_GBS:.0f} GB/s, "
              f"{DATASHEET_TFLOPS:.0f} TFLOP/s.  ")
    if sustained:
        md.append(f"bf16 matmul sustained at the power limit: {sustained:.0f} TFLOP/s (matmul_sustained.py); "
                  "column 'paged / sust. floor'.  ")
    md.append(f"{len(runs)} processes; in each, contiguous and every paged view (placement × page-permutation seed) "
              f"alternate, CUDA-graph medians per layer call over {runs[0]['sets']} rotating input sets. "
              "contiguous: mean ± sd over processes; paged µs, paged / floor, paged / vLLM: shuffled pages, mean (± sd) "
              "over processes × seeds; paged vs contig: mean ± sd over processes × seeds. floor = max(expert bytes / "
              "read bandwidth, FLOPs / matmul rate), measured rates (meas.) and datasheet (ds.). vLLM: fused_moe, "
              "routed experts only, measured in another call (GPU_NOTES, 'The strongest peer'), so ±3% between "
              "machines applies to that column.")
    md.append("")
    hdr = "| model | T | path | contiguous µs | paged µs |"
    sep = "|---|---:|---|---:|---:|"
    for pl in placements:
        hdr += f" {pl} vs contig |"
        sep += "---:|"
    hdr += " floor meas. µs | paged / floor | paged / ds. floor |"
    sep += "---:|---:|---:|"
    if sustained:
        hdr += " paged / sust. floor |"
        sep += "---:|"
    hdr += " vLLM µs | paged / vLLM |"
    sep += "---:|---:|"
    md += [hdr, sep]
    for r in rows:
        line = (f"| {r['model']} | {r['tokens']} | {tile(r)} | "
                f"{r['contiguous_us']:.1f} ± {r['contiguous_sd_us']:.1f} | {r['paged_us']:.1f} |")
        for pl in placements:
            p = r["placements"].get(pl)
            line += f" {p['vs_contiguous_pct']:+.2f} ± {p['vs_contiguous_sd_pct']:.2f}% |" if p else " – |"
        vl = "–" if r["vllm_us"] is None else f"{r['vllm_us']:.1f}"
        rv = "–" if r["paged_over_vllm"] is None else f"{r['paged_over_vllm']:.3f} ± {r['paged_over_vllm_sd']:.3f}"
        line += (f" {r['floor_us']:.1f} ({r['floor_kind']}) | {r['paged_over_floor']:.3f} ± "
                 f"{r['paged_over_floor_sd']:.3f} | {r['paged_over_datasheet_floor']:.2f} |")
        if sustained:
            line += f" {r['paged_over_sustained_floor']:.3f} |"
        line += f" {vl} | {rv} |"
        md.append(line)
    md.append("")
    for pl in placements:
        sm = summary[pl]
        md.append(f"Paged ({pl}) vs contiguous: mean {sm['mean_pct']:+.2f}%, worst case mean at T ≥ 16 "
                  f"{sm['max_mean_pct_at_16_plus']:+.2f}%, worst single process × seed at T ≥ 16 "
                  f"{sm['max_single_pct_at_16_plus']:+.2f}%.  ")
    open(a.out_md, "w").write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
