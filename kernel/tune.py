"""Sweep tile configurations of the split kernel on a GPU and print a table.

    python -m kernel.tune [--contexts 65536,131072] [--shapes 16x1,128x8] [--out DIR]

For every (H, T) shape and context it checks the default configuration against the fp32
oracle, then times each candidate configuration (median of ``do_bench``, L2 flushed) and
reports the fraction of the roofline ``max(bytes / copy_bw, flops / bf16_peak)`` with both
ceilings measured in the same run. The chosen defaults in ``kernel.plan`` come from here.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import triton

from kernel.mla_verify import MLAVerifyWrapper, Workspace, make_plan, run_plan
from kernel.plan import TileConfig
from kernel.reference import mla_verify_reference, tree_mask_from_parents


def ceilings(device: torch.device) -> tuple[float, float]:
    """(copy bytes/s counting read + write, bf16 matmul FLOP/s), both medians on random data."""
    src = torch.randn(256 * 1024 * 1024, device=device)  # 1 GiB fp32
    dst = torch.empty_like(src)
    t = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median") * 1e-3
    bw = 2 * src.numel() * 4 / t
    del src, dst
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    t = triton.testing.do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median") * 1e-3
    return bw, 2 * 8192**3 / t


def candidate_configs(rows: int, sms: int) -> list[TileConfig]:
    """Configurations worth timing for ``rows`` = H*T packed rows."""
    small = [TileConfig(block_m=16, block_n=bn, num_warps=w, num_stages=st, target_programs=sms)
             for bn, w, st in ((64, 8, 3), (64, 8, 4), (32, 8, 4), (32, 8, 6), (16, 4, 6))]
    large = [TileConfig(block_m=64, block_n=64, num_warps=8, num_stages=2, target_programs=sms)]
    return small + (large if rows > 16 else [])


def graph_ms(fn) -> float:
    """Median ms of ``fn`` replayed from a CUDA graph (no host launch overhead; L2 flushed by do_bench)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=10, rep=60, return_mode="median")


def split_only_ms(case: dict, cfg: TileConfig | None, out: torch.Tensor) -> tuple[float, object]:
    """Median ms of the split kernel alone (no combine), and its compiled kernel."""
    q, kv = case["q"], case["kv_cache"]
    plan = make_plan(case["qo_indptr"], case["kv_indptr"], q.shape[1], 576, 512, q.device, cfg)
    tensors = plan.to_device(q.device)
    ws = Workspace.allocate(max(1, plan.num_work), plan.config, plan.dims, q.device)
    args = (plan, tensors, q, kv, case["qo_indptr"], case["kv_indptr"], case["kv_indices"], case["tree_mask"],
            case["sm_scale"], out, ws)
    compiled = run_plan(*args, combine=False)
    return triton.testing.do_bench(lambda: run_plan(*args, combine=False), warmup=10, rep=60, return_mode="median"), compiled


def make_case(h: int, t: int, context: int, device, seed: int = 0, scattered: bool = True):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    pool = int(context * 1.25) + 64
    q = (torch.randn(t, h, 576, generator=gen) * 0.5).to(device=device, dtype=torch.bfloat16)
    kv = torch.randn(pool, 576, device=device, dtype=torch.bfloat16)
    slots = torch.randperm(pool, generator=gen)[:context] if scattered else torch.arange(context)
    parents = [-1] + [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(1, t)]
    mask = tree_mask_from_parents(parents)
    return dict(
        q=q, kv_cache=kv,
        qo_indptr=torch.tensor([0, t], dtype=torch.int32, device=device),
        kv_indptr=torch.tensor([0, context], dtype=torch.int32, device=device),
        kv_indices=slots.to(device=device, dtype=torch.int32),
        tree_mask=mask.flatten().to(device), sm_scale=1 / math.sqrt(192),
    )


def fixed_cost_study(dev: torch.device, contexts=(4096, 16384, 65536, 131072)) -> None:
    """Where the fixed per-call cost goes at (16,1): L2 flush by zeroing (dirty lines, as
    ``do_bench`` does) vs by reading, and the split kernel with and without the combine."""
    scratch = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device=dev)
    sink = torch.empty((), dtype=torch.int64, device=dev)

    def timed(fn, flush) -> float:
        start = [torch.cuda.Event(enable_timing=True) for _ in range(50)]
        end = [torch.cuda.Event(enable_timing=True) for _ in range(50)]
        for _ in range(5):
            fn()
        for i in range(50):
            flush()
            start[i].record()
            fn()
            end[i].record()
        torch.cuda.synchronize()
        return sorted(s.elapsed_time(e) for s, e in zip(start, end))[25] * 1e3

    flushes = {"zero": lambda: scratch.zero_(), "read": lambda: torch.sum(scratch, dim=0, out=sink)}
    for context in contexts:
        case = make_case(16, 1, context, dev)
        out = torch.empty(1, 16, 512, device=dev, dtype=torch.bfloat16)
        wrapper = MLAVerifyWrapper(dev)
        plan = wrapper.plan(case["qo_indptr"], case["kv_indptr"], 16, 576, 512)
        run_args = {k: case[k] for k in ("q", "kv_cache", "kv_indices", "tree_mask", "sm_scale")}
        full = lambda: wrapper.run(**run_args, out=out)
        split = lambda: run_plan(plan, wrapper._tensors, case["q"], case["kv_cache"], case["qo_indptr"],
                                 case["kv_indptr"], case["kv_indices"], case["tree_mask"], case["sm_scale"],
                                 out, wrapper._workspace, combine=False)
        row = {f"{name}-{flush}": timed(fn, flushes[flush]) for name, fn in (("full", full), ("split", split))
               for flush in flushes}
        print(f"fixed-cost (16,1) {context:>7}: " + "  ".join(f"{k} {v:6.1f} us" for k, v in row.items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="65536,131072")
    ap.add_argument("--shapes", default="16x1,128x1,8x8,16x8,64x8,128x8,16x32,64x32")
    ap.add_argument("--out", default=None)
    ap.add_argument("--all-configs", action="store_true", help="time every candidate, not just the default")
    ap.add_argument("--fixed-cost", action="store_true", help="only the (16,1) fixed-cost study")
    args = ap.parse_args()
    dev = torch.device("cuda")
    if args.fixed_cost:
        fixed_cost_study(dev)
        return
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    bw, peak = ceilings(dev)
    print(f"copy {bw / 1e12:.2f} TB/s  bf16 {peak / 1e12:.0f} TFLOP/s  SMs {sms}", flush=True)
    rows = []
    for context in [int(c) for c in args.contexts.split(",")]:
        for shape in args.shapes.split(","):
            h, t = (int(x) for x in shape.split("x"))
            case = make_case(h, t, context, dev)
            nbytes = context * 576 * 2 + t * h * (576 + 512) * 2
            flops = 2 * t * h * context * (576 + 512)
            roof = max(nbytes / bw, flops / peak)
            ref = mla_verify_reference(**{k: v for k, v in case.items()}, v_head_dim=512)
            out = torch.empty(t, h, 512, device=dev, dtype=torch.bfloat16)
            configs = [None] + (candidate_configs(h * t, sms) if args.all_configs else [])
            for cfg in configs:
                wrapper = MLAVerifyWrapper(dev)
                run_args = {k: case[k] for k in ("q", "kv_cache", "kv_indices", "tree_mask", "sm_scale")}
                fn = lambda: wrapper.run(**run_args, out=out)
                try:
                    wrapper.plan(case["qo_indptr"], case["kv_indptr"], h, 576, 512, cfg)
                    fn()
                    err = float((out.double() - ref.double()).norm() / ref.double().norm())
                    ms = triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")
                    split_ms, compiled = split_only_ms(case, cfg, out)
                    g_ms = graph_ms(fn)
                except Exception as exc:  # out of shared memory etc.: record and go on
                    rows.append(dict(context=context, h=h, t=t, config=str(cfg), error=repr(exc)[:200]))
                    print(f"{context:>7} ({h},{t}) {cfg.describe() if cfg else 'default'}: {repr(exc)[:120]}", flush=True)
                    continue
                frac = roof / (ms * 1e-3)
                g_frac = roof / (g_ms * 1e-3)
                name = cfg.describe() + f"_tp{cfg.target_programs}" if cfg else "default"
                regs, spills = getattr(compiled, "n_regs", -1), getattr(compiled, "n_spills", -1)
                rows.append(dict(context=context, h=h, t=t, config=name, us=ms * 1e3, split_us=split_ms * 1e3,
                                 graph_us=g_ms * 1e3, graph_frac=g_frac,
                                 frac=frac, rel_err=err, kv_TBps=context * 1152 / (ms * 1e-3) / 1e12,
                                 regs=regs, spills=spills))
                print(f"{context:>7} ({h:>3},{t:>2}) {name:<26} {ms * 1e3:8.1f} us (split {split_ms * 1e3:7.1f},"
                      f" graph {g_ms * 1e3:7.1f}) frac {frac:5.2f} graph-frac {g_frac:5.2f} kv {context * 1152 / (ms * 1e-3) / 1e12:5.2f} TB/s err {err:.1e}"
                      f" regs {regs} spills {spills}", flush=True)
            del case, ref
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "tune.json").write_text(json.dumps(dict(copy_bw=bw, bf16_peak=peak, rows=rows), indent=1))


if __name__ == "__main__":
    main()
