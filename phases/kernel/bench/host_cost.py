"""Where the host time of a call goes: graph replay vs eager planned ``run`` vs the one-call API.

For a few B=1 shapes (bf16, scattered int32 slots) this times, back to back without an L2
flush (the point is the host, not DRAM):

- ``replay_us``: the planned ``run`` captured in a CUDA graph and replayed;
- ``eager_us``: the planned ``run`` launched eagerly (host launch cost included);
- ``call_us``: the one-call ``mla_verify_attention`` eagerly (host planning included), device
  indptrs; ``call_host_us``: the same with host (CPU) indptrs;
- ``plan_us``: ``MLAVerifyWrapper.plan`` alone, host wall time;
- ``run_host_us``: host wall time to issue one eager ``run`` (no sync);

and writes cProfile listings of the eager ``run`` and the one-call API, so a change to the host
path can be judged by the functions it removes. The benchmark gate reports the same three
times with an L2 flush; this is the tool for looking inside them.

Usage (CUDA): ``python -m phases.kernel.bench.host_cost [--out DIR]``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch

from kernel import MLAVerifyWrapper, mla_verify_attention
from phases.common.kernel_timing import graph_replay
from phases.kernel.bench.cases import PRODUCTION_SM_SCALE, Case, build_inputs

SHAPES = ((16, 1, 16384, False), (16, 1, 65536, False), (128, 1, 16384, False), (16, 8, 16384, True))
SM_SCALE = PRODUCTION_SM_SCALE


def per_call_us(fn, reps: int = 200) -> float:
    """Mean µs per call of ``reps`` back-to-back calls between two CUDA events."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def host_us(fn, reps: int = 200) -> float:
    """Mean host wall µs to issue one call (the device may still be busy afterwards)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6 / reps


def profile_text(fn, reps: int, limit: int = 30) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(limit)
    return buf.getvalue()


def measure(num_heads: int, num_draft: int, context: int, tree: bool, out_dir: Path | None) -> dict:
    case = Case(num_heads=num_heads, draft_lens=(num_draft,), context_lens=(context,), tree=tree, sm_scale=SM_SCALE, seed=3)
    inputs = build_inputs(case, torch.device("cuda"))
    q, kv, idx, mask = inputs["q"], inputs["kv_cache"], inputs["kv_indices"], inputs["tree_mask"]
    qo, kvp = inputs["qo_indptr"], inputs["kv_indptr"]
    out = torch.empty(q.shape[0], num_heads, 512, dtype=q.dtype, device=q.device)
    wrapper = MLAVerifyWrapper(q.device)
    wrapper.plan(qo, kvp, num_heads)
    run = lambda: wrapper.run(q, kv, idx, mask, SM_SCALE, out)  # noqa: E731
    call = lambda: mla_verify_attention(q, kv, qo, kvp, idx, mask, SM_SCALE, out=out)  # noqa: E731
    qo_host, kvp_host = qo.cpu(), kvp.cpu()
    call_host = lambda: mla_verify_attention(q, kv, qo_host, kvp_host, idx, mask, SM_SCALE, out=out)  # noqa: E731
    plan_dev = lambda: wrapper.plan(qo, kvp, num_heads)  # noqa: E731
    plan_host = lambda: wrapper.plan(qo_host, kvp_host, num_heads)  # noqa: E731
    row = {
        "shape": f"H={num_heads} T={num_draft} L={context}" + (" tree" if tree else ""),
        "path": None,
        "replay_us": per_call_us(graph_replay(run)),
        "eager_us": per_call_us(run),
        "call_us": per_call_us(call, reps=100),
        "call_host_us": per_call_us(call_host, reps=100),
        "run_host_us": host_us(run),
        "plan_dev_us": host_us(plan_dev, reps=100),
        "plan_host_us": host_us(plan_host, reps=100),
    }
    wrapper.plan(qo, kvp, num_heads)
    run()
    row["path"] = wrapper.path
    if out_dir is not None:
        tag = row["shape"].replace(" ", "_").replace("=", "")
        (out_dir / f"profile_run_{tag}.txt").write_text(profile_text(run, 300))
        (out_dir / f"profile_call_{tag}.txt").write_text(profile_text(call_host, 100))
        (out_dir / f"profile_plan_{tag}.txt").write_text(profile_text(plan_dev, 100))
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for host_cost.json and the cProfile listings")
    args = ap.parse_args(argv)
    out_dir = Path(args.out) if args.out else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    rows = [measure(*shape, out_dir) for shape in SHAPES]
    keys = ["replay_us", "eager_us", "call_us", "call_host_us", "run_host_us", "plan_dev_us", "plan_host_us"]
    print("| shape | path | " + " | ".join(keys) + " |\n|---|---|" + "---:|" * len(keys))
    for r in rows:
        print(f"| {r['shape']} | {r['path']} | " + " | ".join(f"{r[k]:.1f}" for k in keys) + " |")
    if out_dir:
        (out_dir / "host_cost.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
