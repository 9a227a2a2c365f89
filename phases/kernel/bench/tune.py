"""Sweep tile configurations of the split kernel on a GPU and print a table.

    python -m phases.kernel.bench.tune [--contexts 65536,131072] [--shapes 16x1,128x8] [--all-configs] [--out DIR]
    python -m phases.kernel.bench.tune --fixed-cost
    python -m phases.kernel.bench.tune --configs BM64_BN64_w8_s2,BM32_BN32_w8_s2 [--shapes ...] [--contexts ...]
    python -m phases.kernel.bench.tune --compile-only [--block-m 32,64] [--block-n 16,32,64]
                                       [--warps 4,8] [--stages 1,2,3] [--out DIR]

For every (H, T) shape and context it checks each configuration against the fp32 oracle, then
times it three ways: eager planned ``run`` (``do_bench`` median, L2 zeroed between reps), the
split kernel alone, and the planned ``run`` replayed from a CUDA graph; the fraction is the
same-run roofline (``phases.common.roofline``) over the graph time. The defaults in
``kernel.plan.default_tile_config`` come from here (see ``phases/kernel/NOTES.md``).

``--compile-only`` needs no GPU: it compiles the split kernel for sm_90 (tree mask and causal,
bf16, D=576/DV=512) for every combination of the given block sizes, warps and stages through the
build gate's ``phases.kernel.build.triton_sm90_stats`` and prints registers, spill bytes, shared
memory and the tensor-core instruction (wgmma or mma.sync) per configuration; configurations
over the 227 KB of shared memory an sm_90 block can have are marked, not launchable.
``--configs BM64_BN64_w8_s2,...`` times exactly those configurations (after the default) on a GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
from pathlib import Path

import torch

from kernel import MLAVerifyWrapper, TileConfig
from kernel.bench_api import PlanLayout, Workspace, make_plan, run_plan, upload_plan
from kernel.reference import mla_verify_reference
from phases.common.kernel_timing import bench_us, event_us, graph_replay, l2_flushes
from phases.common.roofline import (
    measure_ceilings,
    mla_verify_bytes,
    mla_verify_flops,
    roofline_time,
)
from phases.kernel.bench.cases import PRODUCTION_SM_SCALE, Case, build_inputs
from phases.kernel.bench.shapes import HEAD_DIM, V_HEAD_DIM


def candidate_configs(rows: int, sms: int) -> list[TileConfig]:
    """Configurations worth timing for ``rows`` = H*T packed rows."""
    small = [TileConfig(block_m=16, block_n=bn, num_warps=w, num_stages=st, target_programs=sms)
             for bn, w, st in ((64, 8, 3), (64, 8, 4), (32, 8, 4), (32, 8, 6), (16, 4, 6))]
    large = [TileConfig(block_m=64, block_n=64, num_warps=8, num_stages=2, target_programs=sms)]
    return small + (large if rows > 16 else [])


SM90_MAX_SHARED = 227 * 1024  # bytes of shared memory one sm_90 thread block may use


def parse_config(name: str, sms: int) -> TileConfig:
    """``BM64_BN64_w8_s2`` (``TileConfig.describe``) as a ``TileConfig`` with ``sms`` programs."""
    m = re.fullmatch(r"BM(\d+)_BN(\d+)_w(\d+)_s(\d+)", name)
    if not m:
        raise ValueError(f"Expected a configuration like BM64_BN64_w8_s2, got {name!r}")
    bm, bn, w, st = (int(x) for x in m.groups())
    return TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=st, target_programs=sms)


def compile_sweep(block_ms=(32, 64), block_ns=(16, 32, 64), warps=(4, 8), stages=(1, 2, 3),
                  stats=None) -> list[dict]:
    """One row per configuration: ``config`` and, for ``tree`` and ``causal``, ``regs``, ``spills``
    (ptxas spill store + load bytes), ``shared`` (bytes) and ``mma``; ``fits``: both within
    ``SM90_MAX_SHARED``. ``stats(config, causal)`` defaults to ``build.triton_sm90_stats``."""
    if stats is None:
        from phases.kernel.build import triton_sm90_stats as stats
    rows = []
    for bm, bn, w, st in itertools.product(block_ms, block_ns, warps, stages):
        cfg = TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=st, target_programs=1)
        row = {"config": cfg.describe()}
        for name, causal in (("tree", False), ("causal", True)):
            s = stats(cfg, causal)
            row[name] = {"regs": s["n_regs"], "spills": s["n_spills"], "shared": s["shared_bytes"], "mma": s["mma"]}
        row["fits"] = all(row[k]["shared"] <= SM90_MAX_SHARED for k in ("tree", "causal"))
        rows.append(row)
    return rows


def compile_table(rows: list[dict]) -> str:
    """``compile_sweep``'s rows as a markdown table (spills in bytes, tree / causal)."""
    lines = ["| config | regs tree / causal | spill bytes tree / causal | shared bytes tree / causal | mma "
             "| fits 227 KB |",
             "|---|---:|---:|---:|---|---|"]
    for r in rows:
        t, c = r["tree"], r["causal"]
        mma = t["mma"] if t["mma"] == c["mma"] else f"{t['mma']} / {c['mma']}"
        lines.append(f"| {r['config']} | {t['regs']} / {c['regs']} | {t['spills']} / {c['spills']} | "
                     f"{t['shared']} / {c['shared']} | {mma} | {'yes' if r['fits'] else 'no'} |")
    return "\n".join(lines) + "\n"


def split_only(inputs: dict, config: TileConfig | None, out: torch.Tensor):
    """``(fn, compiled)``: the split kernel alone (no combine) for ``inputs``, planned once."""
    q = inputs["q"]
    plan = make_plan(inputs["qo_indptr"], inputs["kv_indptr"], q.shape[1], HEAD_DIM, V_HEAD_DIM, q.device, config)
    layout = PlanLayout.exact(plan)
    meta = layout.views(upload_plan(plan, layout, q.device))
    workspace = Workspace.allocate(max(1, plan.num_work), plan.config, plan.dims, q.device)
    args = (plan, meta, q, inputs["kv_cache"], inputs["kv_indices"], inputs["tree_mask"], inputs["sm_scale"], out,
            workspace)
    compiled = run_plan(*args, combine=False)
    return (lambda: run_plan(*args, combine=False)), compiled


def planned(inputs: dict, config: TileConfig | None, out: torch.Tensor):
    """The eager planned call ``wrapper.run(out=)`` for ``inputs`` with ``config`` (None: the default)."""
    q = inputs["q"]
    wrapper = MLAVerifyWrapper(q.device)
    wrapper.plan(inputs["qo_indptr"], inputs["kv_indptr"], q.shape[1], HEAD_DIM, V_HEAD_DIM, config, q.dtype)
    args = (q, inputs["kv_cache"], inputs["kv_indices"], inputs["tree_mask"], inputs["sm_scale"])
    return lambda: wrapper.run(*args, out=out)


def sweep_case(num_heads: int, num_draft: int, context: int, seed: int = 0) -> Case:
    """B=1, bf16, D=576/DV=512, random tree, scattered slots: the benchmark's sweep rows."""
    return Case(num_heads=num_heads, draft_lens=(num_draft,), context_lens=(context,),
                sm_scale=PRODUCTION_SM_SCALE, seed=seed)


def fixed_cost_study(device: torch.device, contexts=(4096, 16384, 65536, 131072)) -> None:
    """Where the fixed per-call cost goes at (16,1): L2 flush by zeroing (dirty lines, as
    ``do_bench`` does) vs by reading, and the split kernel with and without the combine."""
    flushes = l2_flushes(device)
    for context in contexts:
        inputs = build_inputs(sweep_case(16, 1, context), device)
        out = torch.empty(1, 16, V_HEAD_DIM, device=device, dtype=torch.bfloat16)
        split, _ = split_only(inputs, None, out)
        calls = {"full": planned(inputs, None, out), "split": split}
        row = {f"{name}-{flush}": event_us(fn, flushes[flush]) for name, fn in calls.items() for flush in flushes}
        print(f"fixed-cost (16,1) {context:>7}: " + "  ".join(f"{k} {v:6.1f} us" for k, v in row.items()), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="65536,131072")
    ap.add_argument("--shapes", default="16x1,128x1,8x8,16x8,64x8,128x8,16x32,64x32")
    ap.add_argument("--out", default=None)
    ap.add_argument("--all-configs", action="store_true", help="time every candidate, not just the default")
    ap.add_argument("--fixed-cost", action="store_true", help="only the (16,1) fixed-cost study")
    ap.add_argument("--configs", default=None, help="time these configurations (BM64_BN64_w8_s2,...) after the default")
    ap.add_argument("--compile-only", action="store_true", help="no GPU: compile for sm_90 and print resources")
    ap.add_argument("--block-m", default="32,64")
    ap.add_argument("--block-n", default="16,32,64")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="1,2,3")
    args = ap.parse_args(argv)
    if args.compile_only:
        ints = lambda text: tuple(int(x) for x in text.split(","))  # noqa: E731
        rows = compile_sweep(ints(args.block_m), ints(args.block_n), ints(args.warps), ints(args.stages))
        print(compile_table(rows), flush=True)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            Path(args.out, "compile.json").write_text(json.dumps(rows, indent=1))
        return
    device = torch.device("cuda")
    if args.fixed_cost:
        fixed_cost_study(device)
        return
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    ceilings = measure_ceilings(device)
    print(f"copy {ceilings.copy_bw_bytes_per_s / 1e12:.2f} TB/s  bf16 {ceilings.bf16_flops_per_s / 1e12:.0f} TFLOP/s"
          f"  SMs {sms}", flush=True)
    rows = []
    for context in [int(c) for c in args.contexts.split(",")]:
        for shape in args.shapes.split(","):
            h, t = (int(x) for x in shape.split("x"))
            inputs = build_inputs(sweep_case(h, t, context), device)
            roof = roofline_time(mla_verify_bytes([context], [t], h), mla_verify_flops([context], [t], h), ceilings)
            ref = mla_verify_reference(**inputs, compute_dtype=torch.float32, out_dtype=torch.float32)
            out = torch.empty(t, h, V_HEAD_DIM, device=device, dtype=torch.bfloat16)
            extra = candidate_configs(h * t, sms) if args.all_configs else []
            if args.configs:
                extra = [parse_config(name, sms) for name in args.configs.split(",")]
            for cfg in [None] + extra:
                name = cfg.describe() + f"_tp{cfg.target_programs}" if cfg else "default"
                try:
                    fn = planned(inputs, cfg, out)
                    fn()
                    err = float((out.double() - ref.double()).norm() / ref.double().norm())
                    eager_us = bench_us(fn, warmup_ms=10, rep_ms=60)
                    split_fn, compiled = split_only(inputs, cfg, out)
                    split_us = bench_us(split_fn, warmup_ms=10, rep_ms=60)
                    graph_us = bench_us(graph_replay(fn), warmup_ms=10, rep_ms=60)
                except Exception as exc:  # out of shared memory etc.: record and go on
                    rows.append(dict(context=context, h=h, t=t, config=name, error=repr(exc)[:200]))
                    print(f"{context:>7} ({h},{t}) {name}: {repr(exc)[:120]}", flush=True)
                    continue
                regs, spills = getattr(compiled, "n_regs", -1), getattr(compiled, "n_spills", -1)
                frac = roof / (graph_us * 1e-6)
                rows.append(dict(context=context, h=h, t=t, config=name, eager_us=eager_us, split_us=split_us,
                                 graph_us=graph_us, frac=frac, rel_err=err, regs=regs, spills=spills))
                print(f"{context:>7} ({h:>3},{t:>2}) {name:<26} graph {graph_us:8.1f} us (eager {eager_us:7.1f},"
                      f" split {split_us:7.1f}) frac {frac:5.2f} err {err:.1e} regs {regs} spills {spills}", flush=True)
            del inputs, ref
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        payload = dict(copy_bw=ceilings.copy_bw_bytes_per_s, bf16_peak=ceilings.bf16_flops_per_s, rows=rows)
        Path(args.out, "tune.json").write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
