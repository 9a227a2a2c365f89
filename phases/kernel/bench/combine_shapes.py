"""Which (splits per load, columns per program, warps) the combine kernel should take, per plan shape.

For the plans of a few benchmark shapes (B=1 sweep rows, 128-head decode batches, the ragged batch),
``_mla_verify_combine_kernel`` alone over random partials, timed under CUDA-graph replay (median of
50) with L2 flushed before each replay (``cold``) and without (``warm``: the partials are in L2, as
right after the split kernel), for each candidate shape; every shape's output is checked against
the current rule's (``hopper.combine_shape``) first.

Usage (sm_90): ``python -m phases.kernel.bench.combine_shapes [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from kernel.bench_api import hopper, launch_combine
from phases.common.kernel_timing import event_us, graph_replay, l2_flushes

RAGGED = (1024, 2011, 4093, 8209, 16411, 32771, 65539, 131072)
PLANS = (  # (label, draft lengths, context lengths, heads)
    ("B=16 H=128 4k", (1,) * 16, (4096,) * 16, 128), ("B=16 H=128 16k", (1,) * 16, (16384,) * 16, 128),
    ("ragged B=8 T=8 H=16", (8,) * 8, RAGGED, 16), ("B=1 T=8 H=16 64k", (8,), (65536,), 16),
    ("B=1 T=8 H=128 64k", (8,), (65536,), 128), ("B=1 T=1 H=16 64k", (1,), (65536,), 16),
    ("B=1 T=8 H=8 16k", (8,), (16384,), 8), ("B=1 T=1 H=16 16k", (1,), (16384,), 16),
)
SHAPES = ((32, 128, 4), (256, 32, 4), (2, 512, 4), (4, 512, 4), (8, 512, 4), (4, 256, 4), (8, 256, 4),
          (16, 128, 4), (64, 128, 4), (64, 64, 4), (16, 512, 8), (32, 256, 8))


def launch(out, po, plse, tensors, qo_indptr, heads, row_blocks, bm, shape):
    splits, cols, warps = shape
    launch_combine(out, po, plse, tensors, qo_indptr, heads, row_blocks, bm, 512, splits, cols, num_warps=warps)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    flush = l2_flushes(device)["read"]
    gen = torch.Generator(device=device).manual_seed(5)
    rows = []
    for label, drafts, contexts, heads in PLANS:
        plan = hopper.make_plan(list(drafts), list(contexts), heads, sms)
        bm = plan.config.block_m
        tensors = hopper.plan_tensors(plan, device)
        po = torch.randn(plan.num_work, bm, 512, generator=gen, device=device)
        plse = torch.randn(plan.num_work, bm, generator=gen, device=device) * 4
        qo_indptr = torch.tensor([0, *torch.tensor(drafts).cumsum(0).tolist()], dtype=torch.int32, device=device)
        out = torch.empty(sum(drafts), heads, 512, dtype=torch.bfloat16, device=device)
        current = hopper.combine_shape(plan) + (4,)
        launch(out, po, plse, tensors, qo_indptr, heads, plan.num_row_blocks, bm, current)
        expected = out.float().clone()
        for shape in SHAPES:
            out.fill_(float("nan"))
            launch(out, po, plse, tensors, qo_indptr, heads, plan.num_row_blocks, bm, shape)
            err = (out.float() - expected).abs().max().item()
            run = graph_replay(lambda s=shape: launch(out, po, plse, tensors, qo_indptr, heads, plan.num_row_blocks,
                                                        bm, s))
            rows.append({"plan": label, "row_blocks": plan.num_row_blocks, "block_m": bm, "max_nsplit": plan.max_nsplit,
                         "shape": list(shape), "current": shape == current, "max_abs_diff": err,
                         "cold_us": event_us(run, flush), "warm_us": event_us(run, lambda: None)})
    print("| plan | row blocks x rows | max splits | splits/load, cols, warps | cold µs | warm µs | max diff |")
    print("|---|---|---:|---|---:|---:|---:|")
    for r in rows:
        mark = " (current)" if r["current"] else ""
        print(f"| {r['plan']} | {r['row_blocks']} x {r['block_m']} | {r['max_nsplit']} | {tuple(r['shape'])}{mark} | "
              f"{r['cold_us']:.1f} | {r['warm_us']:.1f} | {r['max_abs_diff']:.1e} |")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "combine_shapes.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
