"""External baseline for the paged MoE kernel: the same layer through PyTorch's grouped-GEMM pipeline (gather,
torch._grouped_mm for W1|W3, SiLU*mul, torch._grouped_mm for W2, weighted index_add_), timed like the kernel
(CUDA events, median per call over rotating input sets), plus the measured bf16 matmul rate for the floor.

    python3 torch_baseline.py --json out.json [--models qwen15,qwen3,mixtral] [--tokens 1,3,...] [--sets 8]

`--models ""` measures only the matmul rate.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

MODELS = {  # name, E, k, H, F
    "qwen15": ("qwen1.5-moe-a2.7b", 60, 4, 2048, 1408),
    "qwen3": ("qwen3-30b-a3b", 128, 8, 2048, 768),
    "mixtral": ("mixtral-8x7b", 8, 2, 4096, 14336),
}


def matmul_tflops():
    n = 8192
    a = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) - 0.5
    b = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) - 0.5
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return 2 * n**3 / (statistics.median(times) * 1e-3) / 1e12


def moe_layer(x, ids, w, w13, w2, num_experts):
    """out[t] = sum_j w[t,j] * W2_e (silu(W1_e x) * W3_e x); w13 is [E, 2F, H], w2 is [E, H, F]."""
    t, k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    token = order // k
    xs = x[token]
    h = torch._grouped_mm(xs, w13.transpose(-2, -1), offs=offs)
    f = h.shape[1] // 2
    a = F.silu(h[:, :f]) * h[:, f:]
    y = torch._grouped_mm(a, w2.transpose(-2, -1), offs=offs)
    y = y.float() * w.reshape(-1)[order, None]
    out = torch.zeros(t, x.shape[1], dtype=torch.float32, device=x.device)
    out.index_add_(0, token, y)
    return out.to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="torch_baseline.json")
    ap.add_argument("--models", default="qwen15,qwen3,mixtral")
    ap.add_argument("--tokens", default="1,3,16,33,64,256,1024,4096,16384")
    ap.add_argument("--sets", type=int, default=8)
    args = ap.parse_args()
    torch.manual_seed(0)
    result = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "matmul_tflops": matmul_tflops(),
              "cases": []}
    print(f"bf16 matmul 8192^3: {result['matmul_tflops']:.0f} TFLOP/s", flush=True)
    for key in filter(None, args.models.split(",")):
        name, E, k, H, Fd = MODELS[key]
        w13 = (torch.rand(E, 2 * Fd, H, device="cuda", dtype=torch.bfloat16) - 0.5) * (3.4 / H**0.5)
        w2 = (torch.rand(E, H, Fd, device="cuda", dtype=torch.bfloat16) - 0.5) * (3.4 / Fd**0.5)
        for T in [int(v) for v in args.tokens.split(",")]:
            sets = []
            for _ in range(args.sets):
                x = torch.rand(T, H, device="cuda", dtype=torch.bfloat16) - 0.5
                ids = torch.argsort(torch.rand(T, E, device="cuda"), dim=1)[:, :k].to(torch.int64).contiguous()
                w = torch.rand(T, k, device="cuda") + 0.05
                w = (w / w.sum(1, keepdim=True)).contiguous()
                sets.append((x, ids, w))

            def call_all():
                for x, ids, w in sets:
                    moe_layer(x, ids, w, w13, w2, E)

            for _ in range(3):
                call_all()
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            call_all()
            e.record()
            e.synchronize()
            once = s.elapsed_time(e)
            reps = max(5, min(101, int(300.0 / max(once, 1e-3))))
            eager = []
            for _ in range(reps):
                s.record()
                call_all()
                e.record()
                e.synchronize()
                eager.append(s.elapsed_time(e) * 1000.0 / args.sets)
            graph_us = None
            try:  # the same calls captured in a CUDA graph (no host syncs in the pipeline)
                g = torch.cuda.CUDAGraph()
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    call_all()
                torch.cuda.current_stream().wait_stream(stream)
                with torch.cuda.graph(g):
                    call_all()
                for _ in range(3):
                    g.replay()
                times = []
                for _ in range(reps):
                    s.record()
                    g.replay()
                    e.record()
                    e.synchronize()
                    times.append(s.elapsed_time(e) * 1000.0 / args.sets)
                graph_us = statistics.median(times)
                del g
            except Exception as ex:  # noqa: BLE001 - report, keep the eager number
                print(f"  graph capture failed: {ex}", flush=True)
            case = {"model": name, "tokens": T, "torch_us": statistics.median(eager), "torch_graph_us": graph_us}
            result["cases"].append(case)
            print(f"{key:8s} T={T:<6d} torch eager {case['torch_us']:9.1f} us  graph "
                  f"{graph_us if graph_us is None else round(graph_us, 1)} us", flush=True)
            del sets
        del w13, w2
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
