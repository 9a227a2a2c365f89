"""Where the Hopper path's fixed cost goes: split kernel alone, combine alone, launch floors.

For the dispatched variant of a few (H, T) shapes at several contexts (B=1, bf16, scattered
int32 slots, causal), each captured in a CUDA graph and replayed (median of 50, a read-only
256 MB pass before each replay, as the benchmark's ``fixed_cost.md`` rows are timed):

- ``full_us``: split + combine (``run_split_and_combine``, what the wrapper launches);
- ``split_us``: the split kernel alone (the same plan with its combine switched off);
- ``combine_us``: the combine kernel alone, over the partials the split left;
- ``empty_us`` / ``two_empty_us``: one and two dependent launches of an empty kernel (the floor
  of a graph replay and of one more launch in stream order).

The same split for the benchmark's batches (``--batches``: B=16 and B=64 decode rows with 128 heads,
the ragged B=8 batch) under each of ``--schedules`` (``kernel.plan.plan_work``), with the plan's
work items, longest item (tiles) and ``program_makespan``.

Usage (sm_90): ``python -m phases.kernel.bench.hopper_fixed_cost [--out DIR] [--batches] [--schedules uniform,waves]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from kernel.bench_api import hopper, kv_rows, launch_combine, program_makespan
from phases.common.kernel_timing import event_us, graph_replay, l2_flushes
from phases.kernel.bench.cases import PRODUCTION_SM_SCALE, Case, build_inputs

SHAPES = ((16, 1), (8, 8), (16, 8))
CONTEXTS = (4096, 16384, 65536, 131072)
RAGGED = (1024, 2011, 4093, 8209, 16411, 32771, 65539, 131072)  # phases.kernel.bench.shapes.BATCH8_CONTEXTS
BATCHES = (  # (label, draft lengths, context lengths, heads)
    ("B=16 H=128 4k", (1,) * 16, (4096,) * 16, 128), ("B=16 H=128 16k", (1,) * 16, (16384,) * 16, 128),
    ("B=64 H=128 4k", (1,) * 64, (4096,) * 64, 128), ("B=64 H=128 16k", (1,) * 64, (16384,) * 64, 128),
    ("ragged B=8 T=8 H=16", (8,) * 8, RAGGED, 16), ("B=1 T=8 H=16 64k", (8,), (65536,), 16),
)
SM_SCALE = PRODUCTION_SM_SCALE


@triton.jit
def _empty_kernel(x_ptr):
    tl.store(x_ptr, 1)


def measure(num_heads: int, num_draft: int, context: int, flush, sms: int) -> dict:
    row = measure_batch(f"H={num_heads} T={num_draft}", (num_draft,), (context,), num_heads, flush, sms, "uniform")
    row["context"] = context
    return row


def measure_batch(label: str, drafts, contexts, num_heads: int, flush, sms: int, schedule: str) -> dict:
    """full / split / combine µs of the dispatched variant over ``schedule``'s plan of the batch."""
    case = Case(num_heads=num_heads, draft_lens=tuple(drafts), context_lens=tuple(contexts), tree=False,
                sm_scale=SM_SCALE, seed=11)
    inputs = build_inputs(case, torch.device("cuda"))
    variant = hopper.choose_variant(num_heads * max(drafts))
    plan = hopper.make_plan(list(drafts), list(contexts), num_heads, sms, variant, schedule=schedule)
    tensors = hopper.plan_tensors(plan, "cuda")
    partial_o, partial_lse = hopper.allocate_workspace(plan.num_work, torch.device("cuda"), variant.block_m)
    out = torch.empty(sum(drafts), num_heads, hopper.V_HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    kv = kv_rows(inputs["kv_cache"])

    def launch(p):
        return lambda: hopper.run_split_and_combine(
            p, tensors, inputs["q"], kv, inputs["qo_indptr"], inputs["kv_indptr"], inputs["kv_indices"], None,
            SM_SCALE, out, partial_o, partial_lse, variant=variant)

    full = graph_replay(launch(plan))
    split = graph_replay(launch(dataclasses.replace(plan, needs_combine=False)))
    item_tiles = -(-(plan.work_kv_end - plan.work_kv_start) // hopper.BLOCK_N)
    row = {"shape": label, "schedule": schedule, "variant": variant.describe(), "work_items": plan.num_work,
           "tiles_per_item": int(item_tiles.max()), "makespan_tiles": program_makespan(item_tiles, sms),
           "full_us": event_us(full, flush), "split_us": event_us(split, flush)}
    if plan.needs_combine:
        split()
        combine = lambda: launch_combine(out, partial_o, partial_lse, tensors, inputs["qo_indptr"], num_heads,  # noqa: E731
                                         plan.num_row_blocks, variant.block_m, hopper.V_HEAD_DIM, *hopper.combine_shape(plan))
        row["combine_us"] = event_us(graph_replay(combine), flush)
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--batches", action="store_true", help="the batches, not the B=1 sweep")
    ap.add_argument("--schedules", default="uniform,balanced,waves", help="comma-separated, with --batches")
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    flush = l2_flushes(device)["read"]
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    x = torch.zeros(1, dtype=torch.int32, device=device)
    one = graph_replay(lambda: _empty_kernel[(1,)](x))
    two = graph_replay(lambda: (_empty_kernel[(1,)](x), _empty_kernel[(1,)](x)))
    floors = {"empty_us": event_us(one, flush), "two_empty_us": event_us(two, flush)}
    if args.batches:
        rows = [measure_batch(label, t, c, h, flush, sms, schedule) for label, t, c, h in BATCHES
                for schedule in args.schedules.split(",")]
    else:
        rows = [measure(h, t, c, flush, sms) for h, t in SHAPES for c in CONTEXTS]
    print(f"empty kernel, graph replay: {floors['empty_us']:.1f} µs; two dependent: {floors['two_empty_us']:.1f} µs")
    print("| shape | context | schedule | variant | work items | tiles/item | makespan | full µs | split µs | combine µs | full - split |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        comb = r.get("combine_us")
        print(f"| {r['shape']} | {r.get('context', '-')} | {r['schedule']} | {r['variant']} | {r['work_items']} | "
              f"{r['tiles_per_item']} | {r['makespan_tiles']:.0f} | "
              f"{r['full_us']:.1f} | {r['split_us']:.1f} | {'-' if comb is None else f'{comb:.1f}'} | "
              f"{r['full_us'] - r['split_us']:.1f} |")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "hopper_fixed_cost.json").write_text(json.dumps({"floors": floors, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
