#!/usr/bin/env python3
"""Summarises one Nsight Compute report of paged_moe_bench (benchmarks/device/stall_profile.sh).

  stall_summary.py LABEL DETAILS_CSV SOURCE_CSV

DETAILS_CSV is `ncu -i R --page details --csv`: per kernel, the speed-of-light, warp-state, scheduler and
compute lines are printed. SOURCE_CSV is `ncu -i R --page source --csv --print-source sass`: per kernel, the
stall samples summed by SASS opcode and by stall reason, the regions (runs of SASS lines executed equally
often: a main loop's body, a barrier wait, an epilogue, a subroutine) that hold >= 1% of them, and the
instructions holding the most samples.
Column names differ between ncu versions: every column whose name holds "Sampling" or "stall" counts.
"""
import collections
import csv
import io
import sys

KEEP_SECTIONS = ("SpeedOfLight", "GPU Speed Of Light Throughput", "Warp State Statistics", "WarpStateStats",
                 "Scheduler Statistics", "SchedulerStats", "Compute Workload Analysis")


def number(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return None


def details(label, path):
    rows = list(csv.DictReader(open(path, errors="replace")))
    if not rows or "Metric Name" not in rows[0]:
        print(f"[{label}] details: nothing readable in {path}")
        print(open(path, errors="replace").read()[:2000])
        return
    kernels = collections.OrderedDict()
    for r in rows:
        kernels.setdefault((r.get("ID"), r.get("Kernel Name", "")[:110]), []).append(r)
    for (kid, name), rs in kernels.items():
        print(f"\n[{label}] kernel {kid}: {name}  grid {rs[0].get('Grid Size')} block {rs[0].get('Block Size')}")
        for r in rs:
            if any(s in r.get("Section Name", "") for s in KEEP_SECTIONS):
                print(f"  {r['Section Name'][:28]:28} {r['Metric Name'][:52]:52} {r['Metric Value']:>14} "
                      f"{r.get('Metric Unit', '')}")


def blocks(path):
    """Splits the source page into (title, header, rows) per kernel."""
    title, header, rows, out = "", None, [], []
    for line in open(path, errors="replace"):
        parsed = next(csv.reader(io.StringIO(line)), [])
        if not parsed:
            continue
        if parsed[0] in ("Address", "# Address") or "Source" in parsed[:3]:
            if header is not None:
                out.append((title, header, rows))
            header, rows = parsed, []
        elif header is not None and len(parsed) == len(header):
            rows.append(parsed)
        else:
            if header is not None:
                out.append((title, header, rows))
                header, rows = None, []
            title = line.strip()[:160]
    if header is not None:
        out.append((title, header, rows))
    return out


def source(label, path):
    found = blocks(path)
    if not found:
        print(f"[{label}] source: nothing readable in {path}")
        print(open(path, errors="replace").read()[:2000])
        return
    seen = set()
    for title, header, rows in found:
        if title in seen:  # (ncu prints a kernel's source page once per profiled launch)
            continue
        seen.add(title)
        src = next((i for i, h in enumerate(header) if h == "Source"), 1)
        stall_cols = [i for i, h in enumerate(header) if "Sampling" in h or "stall" in h.lower()]
        if not stall_cols:
            print(f"[{label}] {title}: no stall columns in {header[:12]}")
            continue
        main = next((i for i in stall_cols if "All Samples" in header[i]), stall_cols[0])
        total = sum(number(r[main]) or 0 for r in rows)
        print(f"\n[{label}] {title}\n  {len(rows)} SASS lines, {total:.0f} samples in '{header[main]}'")
        if total <= 0:
            continue
        by_op = collections.Counter()
        for r in rows:
            op = r[src].split()[0] if r[src].split() else "?"
            if op.startswith("@"):
                op = r[src].split()[1] if len(r[src].split()) > 1 else op
            by_op[op.split(".")[0]] += number(r[main]) or 0
        print("  by opcode: " + ", ".join(f"{op} {100 * v / total:.1f}%" for op, v in by_op.most_common(14)))
        reasons = {header[i]: sum(number(r[i]) or 0 for r in rows) for i in stall_cols if i != main}
        top_reasons = sorted(reasons.items(), key=lambda kv: -kv[1])[:12]
        if top_reasons:
            print("  by column: " + ", ".join(f"{k} {v:.0f}" for k, v in top_reasons if v > 0))
        # Regions: runs of consecutive SASS lines executed equally often (a loop body, a wait loop, an
        # epilogue), the ones holding >= 1% of the samples, with their opcodes and leading stall reasons.
        execd = next((i for i, h in enumerate(header) if h == "Instructions Executed"), None)
        reason_cols = [i for i in stall_cols if header[i].startswith("stall_") and "Not Issued" not in header[i]]
        if execd is not None:
            regions = []
            for n, r in enumerate(rows):
                key = round(number(r[execd]) or 0, -3)
                if not regions or regions[-1]["key"] != key:
                    regions.append({"key": key, "first": n, "samples": 0.0, "ops": collections.Counter(),
                                    "why": collections.Counter()})
                g = regions[-1]
                g["last"] = n
                g["samples"] += number(r[main]) or 0
                words = [w for w in r[src].split() if not w.startswith("@")]
                g["ops"][words[0].split(".")[0] if words else "?"] += 1
                for i in reason_cols:
                    g["why"][header[i][6:]] += number(r[i]) or 0
            print("  regions (SASS lines executed equally often) with >= 1% of the samples:")
            for g in regions:
                if g["samples"] >= 0.01 * total:
                    ops = ", ".join(f"{o} {c}" for o, c in g["ops"].most_common(5))
                    why = ", ".join(f"{w} {100 * v / g['samples']:.0f}%" for w, v in g["why"].most_common(3) if v > 0)
                    print(f"    lines {g['first']:5d}-{g['last']:5d} executed {g['key']:>11.0f}  "
                          f"{100 * g['samples'] / total:5.1f}%  [{ops}]  {why}")
        print("  instructions with the most samples:")
        for r in sorted(rows, key=lambda r: -(number(r[main]) or 0))[:28]:
            share = 100 * (number(r[main]) or 0) / total
            extra = ", ".join(f"{header[i][:30]} {r[i]}" for i in stall_cols
                              if i != main and (number(r[i]) or 0) >= 0.1 * (number(r[main]) or 1))
            print(f"    {share:5.1f}%  {r[0]:>8}  {r[src][:70]:70} {extra[:150]}")


def main():
    label, det, src = sys.argv[1:4]
    details(label, det)
    source(label, src)


if __name__ == "__main__":
    main()
