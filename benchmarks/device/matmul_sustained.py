#!/usr/bin/env python3
"""The bf16 matmul rate behind the compute floor, in a short burst and sustained. torch_baseline.py times ten
8192³ products after three warm-ups (about 20 ms of work: the card may still be below its board power limit);
a layer benchmark runs for seconds, at the power limit, where the clock is lower. This script alternates, for
REPS rounds: the burst as torch_baseline.py measures it, then SECONDS of back-to-back products timed in batches
of ten (the rate over the second half), while nvidia-smi samples the SM clock and board power every 50 ms.
Prints each round and the mean ± sd over the rounds; --json writes them.
    python3 benchmarks/device/matmul_sustained.py [--reps 3] [--seconds 3] [--json FILE]
"""
import argparse
import json
import statistics
import subprocess
import time

import torch

from precision_alone import SAMPLER_QUERY, busy_lines, ms
from torch_baseline import matmul_tflops

N = 8192  # as torch_baseline.matmul_tflops
FLOP = 2 * N**3


def timed(a, b, count):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(count):
        a @ b
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / count  # ms per product


def sustained(a, b, seconds):
    smi = subprocess.Popen(["nvidia-smi", *SAMPLER_QUERY, "-lms", "50"], stdout=subprocess.PIPE, text=True)
    start = time.perf_counter()
    batches = []  # (seconds since start, ms per product)
    while time.perf_counter() - start < seconds:
        ms = timed(a, b, 10)
        batches.append((time.perf_counter() - start, ms))
    smi.terminate()
    samples = list(zip(*busy_lines(smi.communicate()[0].splitlines())))  # (MHz, W) at >= 90% use
    late = [ms for t, ms in batches if t >= seconds / 2]
    half = samples[len(samples) // 2:]
    return {"tflops": FLOP / (statistics.median(late) * 1e-3) / 1e12,
            "first_batch_tflops": FLOP / (batches[0][1] * 1e-3) / 1e12,
            "sm_mhz": statistics.median(s for s, _ in half) if half else None,
            "power_w": statistics.median(w for _, w in half) if half else None, "batches": len(batches)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    a = torch.rand(N, N, device="cuda", dtype=torch.bfloat16) - 0.5
    b = torch.rand(N, N, device="cuda", dtype=torch.bfloat16) - 0.5
    rounds = []
    for r in range(args.reps):
        time.sleep(2.0)  # let the card cool off the previous round's power draw
        x = {"burst_tflops": matmul_tflops()}
        x.update(sustained(a, b, args.seconds))
        rounds.append(x)
        print(f"round {r + 1}: burst {x['burst_tflops']:.0f} TFLOP/s; sustained {x['tflops']:.0f} TFLOP/s "
              f"(first batch {x['first_batch_tflops']:.0f}) at {x['sm_mhz']} MHz, {x['power_w']} W, "
              f"{x['batches']} batches", flush=True)
    burst, steady = ([x[k] for x in rounds] for k in ("burst_tflops", "tflops"))
    print(f"{torch.cuda.get_device_name()}: bf16 matmul {N}³ burst {ms(burst, 0)} TFLOP/s, sustained "
          f"{ms(steady, 0)} TFLOP/s over {len(rounds)} rounds")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "n": N,
                       "seconds": args.seconds, "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
