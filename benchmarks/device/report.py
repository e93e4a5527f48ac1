"""Merges the kernel benchmark and the PyTorch baseline into docs/results/paged_moe_h200.{json,md}.

    python3 report.py --bench bench.json --torch torch.json --out-json X.json --out-md X.md [--commit C] [--date D]
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--torch", required=True)
    ap.add_argument("--out-json", required=True)
    ap.add_argument("--out-md", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--date", default="unknown")
    ap.add_argument("--command", default="bash benchmarks/device/run.sh")
    a = ap.parse_args()
    bench = json.load(open(a.bench))
    try:
        torch = json.load(open(a.torch))
    except (OSError, ValueError):
        torch = {"cases": [], "matmul_tflops": None, "torch": "unavailable"}
    tflops = torch.get("matmul_tflops") or 790.0
    tmap = {(c["model"], c["tokens"]): c for c in torch["cases"]}
    rows = []
    for c in bench["cases"]:
        mem_us = c["expert_bytes"] / (bench["copy_gbs"] * 1e9) * 1e6
        cmp_us = c["flops"] / (tflops * 1e12) * 1e6
        floor = max(mem_us, cmp_us)
        t = tmap.get((c["model"], c["tokens"]), {})
        row = dict(c)
        row.update(floor_us=floor, floor_memory_us=mem_us, floor_compute_us=cmp_us,
                   paged_over_contiguous_pct=100.0 * (c["paged_us"] - c["contiguous_us"]) / c["contiguous_us"],
                   paged_over_floor=c["paged_us"] / floor, torch_us=t.get("torch_us"),
                   torch_graph_us=t.get("torch_graph_us"))
        rows.append(row)
    over = [r["paged_over_contiguous_pct"] for r in rows]
    summary = {
        "mean_paged_over_contiguous_pct": sum(over) / len(over),
        "max_paged_over_contiguous_pct_at_16_plus": max(r["paged_over_contiguous_pct"] for r in rows if r["tokens"] >= 16),
        "max_abs_paged_minus_contiguous_us_at_1": max(r["paged_us"] - r["contiguous_us"] for r in rows if r["tokens"] == 1),
    }
    out = {"gpu": bench["gpu"], "date": a.date, "commit": a.commit, "command": a.command,
           "copy_gbs": bench["copy_gbs"], "matmul_tflops": tflops, "torch": torch.get("torch"),
           "rotating_sets": bench["sets"], "grouped_variant": bench.get("variant", "pair"),
           "placement": bench.get("placement", "shuffled"), "summary": summary, "cases": rows}
    json.dump(out, open(a.out_json, "w"), indent=1)

    md = []
    md.append(f"GPU: {bench['gpu']}; date {a.date}; commit {a.commit}; torch {torch.get('torch')}.  ")
    md.append(f"Measured in the same call: device copy {bench['copy_gbs']:.0f} GB/s (read+write), bf16 matmul "
              f"{tflops:.0f} TFLOP/s (8192^3, torch).  ")
    md.append(f"Command: `{a.command}`.  ")
    md.append(f"Grouped GEMM variant: {bench.get('variant', 'pair')}; paged placement: "
              f"{bench.get('placement', 'shuffled')}.  ")
    md.append("Times are CUDA-event medians per layer call (µs): kernel = CUDA-graph replays of "
              f"{bench['sets']} calls on rotating input sets; torch = eager (and CUDA graph) over the same number "
              "of sets. floor = max(distinct active expert bytes / copy bandwidth, FLOPs / matmul rate).")
    md.append("")
    md.append("| model | T | path | paged µs | contiguous µs | paged vs contig | floor µs | paged / floor | torch eager µs | torch graph µs | best torch / paged |")
    md.append("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    def us(v):
        return "–" if v is None else f"{v:.1f}"

    for r in rows:
        kind = "mem" if r["floor_memory_us"] >= r["floor_compute_us"] else "math"
        best_torch = min(v for v in (r["torch_us"], r["torch_graph_us"], float("inf")) if v is not None)
        speedup = "–" if best_torch == float("inf") else f"{best_torch / r['paged_us']:.2f}×"
        md.append(f"| {r['model']} | {r['tokens']} | {r['path']}/{r['tile_tokens']} | {r['paged_us']:.1f} | "
                  f"{r['contiguous_us']:.1f} | {r['paged_over_contiguous_pct']:+.2f}% | {r['floor_us']:.1f} ({kind}) | "
                  f"{r['paged_over_floor']:.2f}× | {us(r['torch_us'])} | {us(r['torch_graph_us'])} | {speedup} |")
    md.append("")
    md.append(f"Paged vs contiguous: mean {summary['mean_paged_over_contiguous_pct']:+.2f}%, worst at T ≥ 16 "
              f"{summary['max_paged_over_contiguous_pct_at_16_plus']:+.2f}%, worst absolute at T = 1 "
              f"{summary['max_abs_paged_minus_contiguous_us_at_1']:+.2f} µs.")
    open(a.out_md, "w").write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
