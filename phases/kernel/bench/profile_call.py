"""One dispatched Hopper call of a benchmark shape, repeated, for a kernel profiler to attach to.

The plan, variant and merge shape are the path's own (``hopper.choose_variant``, ``make_plan``,
``combine_shape``); a 256 MB read runs before each call, as in the benchmark. It prints the
plan's work items and merge shape, then launches the call ``--calls`` times. Nsight Compute on
sm_90, counters of the third split kernel, clocks left as they are::

    ncu --clock-control none -k regex:mla_verify_hopper --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio \\
        python -m phases.kernel.bench.profile_call 16 1 128 16384

Arguments: batch size B, draft tokens T per request, heads H, context L (keys per request).
Counters measured this way: phases/kernel/NOTES.md, "Where the seesaw's cycles go".
"""

from __future__ import annotations

import argparse

import torch

from kernel.bench_api import hopper
from phases.kernel.bench.hopper_check import _launch, make_case


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("batch", "draft_tokens", "heads", "context"):
        p.add_argument(name, type=int)
    p.add_argument("--calls", type=int, default=4)
    a = p.parse_args(argv)
    if not hopper.available("cuda"):
        raise SystemExit("Expected an sm_90 GPU with Gluon (the Hopper path), got none")
    T, L = [a.draft_tokens] * a.batch, [a.context] * a.batch
    inputs = make_case(T, L, a.heads, a.draft_tokens > 1, seed=7)
    variant = hopper.choose_variant(a.draft_tokens * a.heads)
    plan = hopper.make_plan(T, L, a.heads, torch.cuda.get_device_properties(0).multi_processor_count, variant)
    tensors = hopper.plan_tensors(plan, "cuda")
    partials = hopper.allocate_workspace(plan.num_work, "cuda", variant.block_m)
    out = torch.empty(inputs["q"].shape[0], a.heads, hopper.V_HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"{variant.describe()}: {plan.num_work} work items over {plan.num_row_blocks} row blocks, "
          f"merge {hopper.combine_shape(plan) if plan.needs_combine else 'none'}", flush=True)
    for _ in range(a.calls):
        flush.sum()
        _launch(plan, tensors, inputs, out, partials, variant)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
