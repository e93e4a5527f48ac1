"""Peer for the paged MoE kernel: vLLM's Triton fused-MoE layer (bf16, routed experts only) on the same GPU,
timed like torch_baseline.py (CUDA-graph replays of one layer call per rotating input set, CUDA events, medians).

    benchmarks/device/vllm_peer_fetch.sh      # once, where PyPI is reachable: pinned vLLM wheel -> .peer/
    python3 benchmarks/device/vllm_peer.py --json out.json [--models qwen15,qwen3,mixtral] [--tokens 1,16,...]
                                           [--sets 8] [--repeats 3] [--torch-silu] [--config-device NAME]
                                           [--check-tokens 3,64,1024]
    python3 benchmarks/device/vllm_peer.py --check-source   # no GPU, torch or triton needed

Provenance: the kernel is vLLM's `fused_moe_kernel` (Apache-2.0, .peer/LICENSE), loaded at run time from
.peer/fused_moe.py as extracted from the pinned wheel (.peer/VERSION: vLLM 0.26.0 and the wheel's sha256), not
vendored: the @triton.jit functions are cut out of the file with `ast` and executed without importing vllm.
The tuned configs are vLLM's (.peer/configs/E=..,N=..,device_name=NVIDIA_H200.json, none for E=60,N=1408:
there vLLM's get_default_config rule, copied below from 0.26.0, applies).
Around the kernel, vLLM 0.26.0's TritonExperts.apply / fused_experts_impl for bf16: config for M = tokens
(the JSON entry whose key is nearest M), `_prepare_expert_assignment` (the naive one-block-per-slot path when
tokens*k*4 <= E, else moe_align_block_size), W13 call, silu_and_mul, W2 call with the routed weights, moe_sum.
vLLM's CUDA ops are re-implemented here: moe_align_block_size in Triton (same outputs and buffer sizes; one
kernel below 1024 slots, else a memset and three kernels, where vLLM launches one kernel for <1024 slots and
E <= 64, else a memset and two), silu_and_mul as one Triton kernel with vLLM's rounding (bf16(silu(g)) * u;
--torch-silu: F.silu(g) * u, two kernels), moe_sum as torch .sum(1), and the router (vLLM: one topk_softmax
kernel) as torch softmax / topk / renormalise.
Times per layer call: total = router + layer; layer = vLLM's fused_experts (align + 2 kernels + silu + sum,
routing given: what torch_baseline.py and paged_moe_bench time); experts = the same with the align precomputed.
"""
import argparse
import ast
import builtins
import json
import re
import statistics
import textwrap
from pathlib import Path

try:
    import torch
    import torch.nn.functional as F
    import triton
    import triton.language as tl
except ImportError:  # --check-source needs neither
    torch = triton = tl = None

PEER = Path(__file__).resolve().parents[2] / ".peer"
SOURCE = PEER / "fused_moe.py"
KERNEL = "fused_moe_kernel"
MODELS = {  # name, E, k, H, F, renormalise the top-k weights (config norm_topk_prob; Mixtral always)
    "qwen15": ("qwen1.5-moe-a2.7b", 60, 4, 2048, 1408, False),
    "qwen3": ("qwen3-30b-a3b", 128, 8, 2048, 768, True),
    "mixtral": ("mixtral-8x7b", 8, 2, 4096, 14336, True),
}


def extract(path=SOURCE):
    """fused_moe_kernel and the @triton.jit functions it calls (transitively), as AST nodes in file order, and
    the module-level names they read that neither they, tl/triton/torch nor builtins provide."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_jit = lambda d: re.fullmatch(r"(triton\.)?jit(\(.*\))?", ast.unparse(d), re.S) is not None  # noqa: E731
    jit = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and any(map(is_jit, n.decorator_list))}
    if KERNEL not in jit:
        raise SystemExit(f"{path}: no @triton.jit {KERNEL} (this vLLM version moved or renamed it)")
    need, todo, free = set(), [KERNEL], set()
    while todo:
        fn = jit[todo.pop()]
        need.add(fn.name)
        local = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local:
                if n.id in jit:
                    if n.id not in need and n.id not in todo:
                        todo.append(n.id)
                elif n.id not in ("tl", "triton", "torch") and not hasattr(builtins, n.id):
                    free.add(n.id)
    return [n for n in tree.body if getattr(n, "name", None) in need], free


def params(fn):
    """(name, annotation, has default) of a FunctionDef's parameters."""
    a = fn.args.args
    first_default = len(a) - len(fn.args.defaults)
    return [(p.arg, ast.unparse(p.annotation) if p.annotation else "", i >= first_default) for i, p in enumerate(a)]


def load_kernel(path=SOURCE):
    nodes, free = extract(path)
    if free:
        raise SystemExit(f"{path}: {KERNEL} reads module-level names this loader does not provide: {sorted(free)}")
    for n in nodes:  # triton.jit is applied once below (0.26.0 decorates fused_moe_kernel twice)
        n.decorator_list = []
    ns = {"triton": triton, "tl": tl, "torch": torch, "__name__": "vllm_peer_fused_moe"}
    # compiled under the real file name with the file's line numbers: triton.jit reads the source back via inspect
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), ns)
    for n in nodes:
        ns[n.name] = triton.jit(ns[n.name])
    return ns[KERNEL], params(next(n for n in nodes if n.name == KERNEL))


def peer_version():
    f = PEER / "VERSION"
    return dict(line.split("=", 1) for line in f.read_text().split()) if f.exists() else {}


def default_config(M, E):
    """vLLM 0.26.0 get_default_config, the bf16/fp16 branch on CUDA."""
    return {"BLOCK_SIZE_M": 16 if M <= 32 else 32 if M <= 96 else 64 if M <= 512 else 128,
            "BLOCK_SIZE_N": 64 if M <= 64 else 128, "BLOCK_SIZE_K": 128 if M <= 64 else 64,
            "GROUP_SIZE_M": 16 if M // max(E, 1) > 128 else 1, "SPLIT_K": 1,
            "num_warps": 4 if M <= 128 else 8, "num_stages": 4 if M <= 32 else 3}


def moe_config(E, Fd, M, config_device=None):
    """vLLM's try_get_optimal_moe_config for bf16: get_moe_configs(E, N=w2.shape[2], dtype=None) by the file name
    get_config_file_name gives (any H200 variant -> NVIDIA_H200), the entry whose key is nearest M.
    config_device (--config-device): the device name whose configs to load instead of this GPU's."""
    dev = config_device
    if dev is None:
        dev = re.sub(r"[\s/]+", "_", torch.cuda.get_device_name())
        dev = "NVIDIA_H200" if "H200" in dev.split("_") else dev
    path = PEER / "configs" / f"E={E},N={Fd},device_name={dev}.json"
    if not path.exists():
        return default_config(M, E), "default"
    table = json.loads(path.read_text())
    table.pop("triton_version", None)
    table = {int(key): v for key, v in table.items()}
    return dict(table[min(table.keys(), key=lambda x: abs(x - M))]), path.name


if triton is not None:  # moe_align_block_size: expert histogram, padded ranges, scatter of the slots
    @triton.jit
    def _expert_counts(ids_ptr, lo, n, E, NB: tl.constexpr, C: tl.constexpr):
        """Slots per expert among ids[lo:lo+C] (those past n land in bin E and are dropped)."""
        offs = lo + tl.arange(0, C)
        counts = tl.histogram(tl.load(ids_ptr + offs, mask=offs < n, other=E), NB)
        return tl.where(tl.arange(0, NB) < E, counts, 0)

    @triton.jit
    def _pad_offsets(counts, BM, expert_ids_ptr, post_ptr, CB: tl.constexpr):
        """Each expert's slot range padded to BM: writes num_tokens_post_padded and the expert of every M-block
        (how many experts' ranges end at or before it), returns the ranges' starts."""
        padded = (counts + BM - 1) // BM * BM
        end = tl.cumsum(padded, 0)
        total = tl.sum(padded, 0)
        tl.store(post_ptr, total)
        for b0 in range(0, total // BM, CB):
            b = b0 + tl.arange(0, CB)
            tl.store(expert_ids_ptr + b, tl.sum((end[None, :] <= (b * BM)[:, None]).to(tl.int32), 1),
                     mask=b < total // BM)
        return end - padded

    @triton.jit
    def _scatter(ids_ptr, lo, n, cursor_ptr, sorted_ptr, C: tl.constexpr):
        """Each slot of ids[lo:lo+C] takes the next place of its expert's range (atomics: the order within an
        expert is arbitrary, as in vLLM's CUDA kernel)."""
        offs = lo + tl.arange(0, C)
        e = tl.load(ids_ptr + offs, mask=offs < n, other=0)
        dest = tl.atomic_add(cursor_ptr + e, tl.full((C,), 1, tl.int32), mask=offs < n)
        tl.store(sorted_ptr + dest, offs, mask=offs < n)

    @triton.jit
    def _fill(sorted_ptr, lo, n_sorted, n, C: tl.constexpr):
        offs = lo + tl.arange(0, C)
        tl.store(sorted_ptr + offs, tl.zeros((C,), tl.int32) + n, mask=offs < n_sorted)  # n: the padding id

    @triton.jit
    def _align_small(ids_ptr, n, sorted_ptr, n_sorted, expert_ids_ptr, post_ptr, cursor_ptr, E, BM,
                     NB: tl.constexpr, C: tl.constexpr):
        """n <= C slots in one program (as vLLM's small-batch kernel)."""
        start = _pad_offsets(_expert_counts(ids_ptr, 0, n, E, NB, C), BM, expert_ids_ptr, post_ptr, 64)
        tl.store(cursor_ptr + tl.arange(0, NB), start)
        for f0 in range(0, n_sorted, C):
            _fill(sorted_ptr, f0, n_sorted, n, C)
        tl.debug_barrier()  # the cursors and the padding land before the scatter
        _scatter(ids_ptr, 0, n, cursor_ptr, sorted_ptr, C)

    @triton.jit
    def _align_count(ids_ptr, n, counts_ptr, sorted_ptr, n_sorted, E, NB: tl.constexpr, C: tl.constexpr):
        _fill(sorted_ptr, tl.program_id(0) * C, n_sorted, n, C)
        if tl.program_id(0) * C < n:
            tl.atomic_add(counts_ptr + tl.arange(0, NB), _expert_counts(ids_ptr, tl.program_id(0) * C, n, E, NB, C),
                          mask=tl.arange(0, NB) < E)

    @triton.jit
    def _align_offsets(counts_ptr, cursor_ptr, expert_ids_ptr, post_ptr, E, BM, NB: tl.constexpr):
        bins = tl.arange(0, NB)
        start = _pad_offsets(tl.load(counts_ptr + bins, mask=bins < E, other=0), BM, expert_ids_ptr, post_ptr, 64)
        tl.store(cursor_ptr + bins, start, mask=bins < E)

    @triton.jit
    def _align_scatter(ids_ptr, n, cursor_ptr, sorted_ptr, C: tl.constexpr):
        _scatter(ids_ptr, tl.program_id(0) * C, n, cursor_ptr, sorted_ptr, C)

    @triton.jit
    def _silu_mul(h_ptr, out_ptr, Fd, BLOCK: tl.constexpr):
        """vLLM's silu_and_mul: out = bf16(silu(g)) * u over h = [g | u] rows."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        g = tl.load(h_ptr + row * 2 * Fd + cols, mask=cols < Fd).to(tl.float32)
        u = tl.load(h_ptr + row * 2 * Fd + Fd + cols, mask=cols < Fd).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + row * Fd + cols, (s * u).to(out_ptr.dtype.element_ty), mask=cols < Fd)


def moe_align_block_size(ids, bm, E):
    """vLLM's moe_align_block_size outputs and sizes, no host sync (graph-capturable)."""
    n = ids.numel()
    n_sorted = n + E * (bm - 1)
    if n < E:
        n_sorted = min(n * bm, n_sorted)
    dev, i32 = ids.device, torch.int32
    sorted_ids = torch.empty(n_sorted, dtype=i32, device=dev)
    expert_ids = torch.empty(triton.cdiv(n_sorted, bm), dtype=i32, device=dev)
    post = torch.empty(1, dtype=i32, device=dev)
    nb, flat = triton.next_power_of_2(E + 1), ids.view(-1)  # bin E: the slots past n
    cursor = torch.empty(nb, dtype=i32, device=dev)
    if n < 1024:  # one kernel (vLLM: one where E <= 64, else a memset and two)
        _align_small[(1,)](flat, n, sorted_ids, n_sorted, expert_ids, post, cursor, E, bm, NB=nb, C=1024)
    else:  # a memset and three kernels (vLLM: a memset and two)
        counts = torch.zeros(nb, dtype=i32, device=dev)
        _align_count[(triton.cdiv(n_sorted, 1024),)](flat, n, counts, sorted_ids, n_sorted, E, NB=nb, C=1024)
        _align_offsets[(1,)](counts, cursor, expert_ids, post, E, bm, NB=nb)
        _align_scatter[(triton.cdiv(n, 1024),)](flat, n, cursor, sorted_ids, C=1024)
    return sorted_ids, expert_ids, post


def prepare(ids, cfg, E):
    """vLLM's _prepare_expert_assignment (no expert map)."""
    if ids.numel() * 4 <= E:  # naive_block_assignment: one M-block per (token, expert) slot, no sort
        return None, ids.view(-1), torch.full((1,), ids.numel() * cfg["BLOCK_SIZE_M"], dtype=torch.int32,
                                              device=ids.device)
    return moe_align_block_size(ids, cfg["BLOCK_SIZE_M"], E)


def invoke(kernel, sig, A, B, C, topk_w, prep, mul_routed, top_k, cfg):
    """vLLM's invoke_fused_moe_triton_kernel for bf16 (no scales, no bias, SWAP_AB off), arguments by name."""
    sorted_ids, expert_ids, post = prep
    bm = cfg["BLOCK_SIZE_M"]
    if sorted_ids is not None:
        EM = sorted_ids.size(0)
        if A.size(0) < bm:  # vLLM's small-batch bound on the grid
            EM = min(EM, A.size(0) * top_k * bm)
    else:
        EM = A.size(0) * top_k * bm
    meta = dict(cfg, SPLIT_K=1)
    args = dict(
        a_ptr=A, b_ptr=B, c_ptr=C, b_bias_ptr=None, a_scale_ptr=None, b_scale_ptr=None, topk_weights_ptr=topk_w,
        sorted_token_ids_ptr=sorted_ids, expert_ids_ptr=expert_ids, num_tokens_post_padded_ptr=post,
        N=B.size(1), K=B.size(2), EM=EM, num_valid_tokens=A.size(0) * top_k,
        stride_am=A.stride(0), stride_ak=A.stride(1), stride_be=B.stride(0), stride_bk=B.stride(2),
        stride_bn=B.stride(1), stride_cm=C.stride(1), stride_cn=C.stride(2), stride_asm=0, stride_ask=0,
        stride_bse=0, stride_bsk=0, stride_bsn=0, stride_bbe=0, stride_bbn=0, group_n=0, group_k=0,
        naive_block_assignment=sorted_ids is None, MUL_ROUTED_WEIGHT=mul_routed, top_k=top_k,
        compute_type=tl.bfloat16, use_fp8_w8a8=False, use_int8_w8a8=False, use_int8_w8a16=False,
        per_channel_quant=False, HAS_BIAS=False, SWAP_AB=False, **meta)
    names = {p for p, _, _ in sig}
    missing = [p for p, _, has_default in sig if p not in args and not has_default]
    # another version's kernel may lack a parameter: drop it only where ours is the neutral (disabled) value
    extra = [a for a in args if a not in names and a not in cfg and a != "SPLIT_K"]
    bad = [a for a in extra if not (args[a] is None or args[a] is False or (type(args[a]) is int and args[a] == 0))]
    if missing or bad:
        raise SystemExit(f"{KERNEL} signature differs from vLLM 0.26.0's: missing {missing}, unknown {bad}")
    for a in extra:
        del args[a]
    grid = (triton.cdiv(EM, bm) * triton.cdiv(B.size(1), cfg["BLOCK_SIZE_N"]),)
    kernel[grid](**args)


def experts(kernel, sig, x, w13, w2, topk_w, ids, cfg, prep, torch_silu=False):
    """TritonExperts.apply: W13 -> silu_and_mul -> W2 * routed weight -> moe_sum (cache1/cache3 share memory)."""
    T, H = x.shape
    k, N = ids.size(1), w13.size(1)
    cache13 = torch.empty(T * k * max(N, H), dtype=x.dtype, device=x.device)
    c1, c3 = cache13[: T * k * N].view(T, k, N), cache13[: T * k * H].view(T, k, H)
    invoke(kernel, sig, x, w13, c1, None, prep, False, k, cfg)
    h = c1.view(-1, N)
    if torch_silu:
        act = F.silu(h[:, : N // 2]) * h[:, N // 2:]
    else:
        act = torch.empty(T * k, N // 2, dtype=x.dtype, device=x.device)
        _silu_mul[(T * k, triton.cdiv(N // 2, 1024))](h, act, N // 2, BLOCK=1024)
    invoke(kernel, sig, act, w2, c3, topk_w, prep, True, 1, cfg)
    return c3.sum(1)


def route(logits, k, renorm):
    """Softmax over the experts, top-k, (renormalised) weights in fp32, int32 ids: vLLM's fused_topk."""
    w, ids = torch.topk(torch.softmax(logits, -1, dtype=torch.float32), k, dim=-1)
    return (w / w.sum(-1, keepdim=True) if renorm else w).contiguous(), ids.to(torch.int32)


def reference(x, w13, w2, topk_w, ids):
    """fp32: out[t] = sum_j w[t,j] * W2_e (silu(W1_e x) * W3_e x)."""
    out, xf, f = torch.zeros(x.shape, dtype=torch.float32, device=x.device), x.float(), w2.size(2)
    for e in range(w13.size(0)):
        t, j = (ids == e).nonzero(as_tuple=True)
        if t.numel():
            h = xf[t] @ w13[e].float().T
            out.index_add_(0, t, topk_w[t, j, None] * ((F.silu(h[:, :f]) * h[:, f:]) @ w2[e].float().T))
    return out


def capture(fn):
    """fn (one layer call per input set) run eagerly on a side stream (compiling the kernels), then captured."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def replay_us(graphs, calls, repeats):
    """Per graph: the median µs per call over its replays in each of `repeats` rounds (the graphs take turns
    round by round), and the median of the rounds."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once(g):
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        return s.elapsed_time(e)

    reps = {}
    for v, g in graphs.items():
        for _ in range(3):  # warm-up
            once(g)
        reps[v] = max(5, min(101, int(100.0 / max(once(g), 1e-3))))  # about 0.1 s per graph and round
    rounds = {v: [] for v in graphs}
    for _ in range(repeats):
        for v, g in graphs.items():
            rounds[v].append(statistics.median(once(g) * 1000.0 / calls for _ in range(reps[v])))
    return {v: (statistics.median(r), r) for v, r in rounds.items()}


def check_source():
    """No GPU: what load_kernel would exec, and the signature the launch is matched against."""
    print(f"{SOURCE}: {peer_version() or 'no .peer/VERSION'}")
    nodes, free = extract()
    for n in nodes:
        sig = [f"{p}{': ' + a if a else ''}{'=...' if d else ''}" for p, a, d in params(n)]
        print(f"@triton.jit def {n.name}  (line {n.lineno}, {len(sig)} parameters)")
        print(textwrap.fill(", ".join(sig), 116, initial_indent="    ", subsequent_indent="    "))
    print(f"module-level names read but not provided: {sorted(free) or 'none'}")
    print("tuned configs:", ", ".join(sorted(p.name for p in (PEER / "configs").glob("*.json"))) or "none")


def run_model(key, kernel, sig, args, result):
    """Check one model against the fp32 reference, then time it at every token count; False on a failed check."""
    name, E, k, H, Fd, renorm = MODELS[key]
    w13 = torch.randn(E, 2 * Fd, H, device="cuda", dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(E, H, Fd, device="cuda", dtype=torch.bfloat16) * 0.02
    randn = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16)  # noqa: E731

    def layer(x, tw, ids, cfg, prep=None):  # vLLM's fused_experts; prep: the expert assignment, if precomputed
        prep = prepare(ids, cfg, E) if prep is None else prep
        return experts(kernel, sig, x, w13, w2, tw, ids, cfg, prep, args.torch_silu)

    ok = True
    for T in [int(v) for v in args.check_tokens.split(",") if v]:
        x, (tw, ids) = randn(T, H), route(randn(T, E), k, renorm)
        y, ref = layer(x, tw, ids, moe_config(E, Fd, T, args.config_device)[0]).float(), reference(x, w13, w2, tw, ids)
        rel = ((y - ref).norm() / ref.norm()).item()
        ok &= rel < 1e-2
        result["check"].append({"model": name, "tokens": T, "rel_l2": rel})
        print(f"check {key:8s} T={T:<5d} rel L2 {rel:.2e} {'ok' if rel < 1e-2 else 'FAILED'}", flush=True)
    for T in [int(v) for v in args.tokens.split(",") if v]:
        cfg, source = moe_config(E, Fd, T, args.config_device)
        sets = [(x, lg, *route(lg, k, renorm)) for x, lg in ((randn(T, H), randn(T, E)) for _ in range(args.sets))]
        preps = [prepare(ids, cfg, E) for _, _, _, ids in sets]
        variants = {  # each: one layer call per input set
            "total": lambda: [layer(x, *route(lg, k, renorm), cfg) for x, lg, _, _ in sets],
            "layer": lambda: [layer(x, tw, ids, cfg) for x, _, tw, ids in sets],
            "experts": lambda: [layer(x, tw, ids, cfg, p) for (x, _, tw, ids), p in zip(sets, preps)]}
        case = {"model": name, "tokens": T, "config": cfg, "config_source": source,
                "naive_block_assignment": T * k * 4 <= E}
        graphs = {v: capture(fn) for v, fn in variants.items()}
        for v, (median, rounds) in replay_us(graphs, args.sets, args.repeats).items():
            case[f"{v}_us"], case[f"{v}_rounds_us"] = median, rounds
        result["cases"].append(case)
        tile = (f"M{cfg['BLOCK_SIZE_M']} N{cfg['BLOCK_SIZE_N']} K{cfg['BLOCK_SIZE_K']} G{cfg['GROUP_SIZE_M']} "
                f"w{cfg.get('num_warps', 4)} s{cfg.get('num_stages', 3)}" + (" naive" if T * k * 4 <= E else ""))
        print(f"{key:8s} {T:6d}  {tile:31s} {'default' if source == 'default' else 'json':7s} "
              + "".join(f"{case[v + '_us']:10.1f}" for v in variants), flush=True)
        del sets, preps, graphs
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default="vllm_peer.json")
    ap.add_argument("--models", default="qwen15,qwen3,mixtral")
    ap.add_argument("--tokens", default="1,16,64,1024,4096,16384")
    ap.add_argument("--check-tokens", default="3,64,1024", help="token counts checked against the fp32 reference")
    ap.add_argument("--sets", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--torch-silu", action="store_true", help="F.silu(g) * u (two kernels) for silu_and_mul")
    ap.add_argument("--check-source", action="store_true", help="only parse .peer/fused_moe.py and print")
    ap.add_argument("--config-device", default=None,
                    help="load the tuned configs of this device name (e.g. NVIDIA_H200) instead of this GPU's: "
                         "on an H100, where vLLM 0.26.0 ships no bf16 configs for these shapes, the H200's are the "
                         "stronger peer")
    args = ap.parse_args()
    if args.check_source:
        return check_source()
    kernel, sig = load_kernel()
    torch.manual_seed(0)
    result = {"vllm": peer_version(), "gpu": torch.cuda.get_device_name(), "config_device": args.config_device,
              "torch": torch.__version__,
              "triton": triton.__version__, "silu": "torch" if args.torch_silu else "triton", "sets": args.sets,
              "repeats": args.repeats, "check": [], "cases": []}
    print(f"vLLM {result['vllm'].get('version')} {KERNEL} on {result['gpu']}, torch {torch.__version__}, "
          f"triton {triton.__version__}", flush=True)
    print(f"{'model':8s} {'T':>6s}  {'config':31s} {'source':7s} {'total us':>10s}{'layer us':>10s}{'experts us':>11s}")
    ok = True
    for key in filter(None, args.models.split(",")):
        ok &= run_model(key, kernel, sig, args, result)
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    if not ok:
        raise SystemExit("vllm_peer: the Triton layer disagrees with the fp32 reference (rel L2 >= 1e-2)")


if __name__ == "__main__":
    main()
