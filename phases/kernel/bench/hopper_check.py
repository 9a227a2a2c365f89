"""H200 check of the Hopper path (``kernel/hopper.py``): correctness vs float64 and determinism per
variant, then timings of every variant, the Triton path and the dispatched wrapper on the same inputs.

    OUT=dir python -m phases.kernel.bench.hopper_check

Every variant in ``kernel.hopper.VARIANTS`` (or those of VARIANTS and CANDIDATES that $VARIANTS
names, comma-separated; ``NAME@SCHEDULE``, e.g. ``BN64_S2@balanced``, plans that variant with that schedule of ``kernel.plan.plan_work``) is checked on seeded
inputs from ``phases.kernel.bench.cases`` (NaN-poisoned, guarded ``out``; float64 reference; a
second call must be bitwise equal); then the variants that passed are timed next to
``MLAVerifyWrapper(backend="triton")`` and the default ``MLAVerifyWrapper()`` (the dispatched
path, recorded as ``path``), with the bench's timing harness (``timing.graph_replay`` +
``timing.event_us``: CUDA-graph replay, median of 40, a read-only 256 MB pass before each
replay) and fractions of the same-run ceilings (``roofline``). A table is printed last. Each
stage runs in its own process with a timeout (total $BUDGET_S), so a hang is reported, not
fatal. With $CEILINGS_ONLY set the Triton path and the wrapper are not timed (the ceilings still
are): an A/B of variants within one device call; $BATCHES_ONLY keeps only the batched shapes. Per-stage JSON goes to $OUT. Results and method: phases/kernel/NOTES.md, "Hopper path".
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

OUT = os.environ.get("OUT", ".")
SM_SCALE = 1 / math.sqrt(192)
TIMING_REPS = 40


def log(*a):
    print(*a, flush=True)


def make_case(draft_lens, kv_lens, num_heads, tree, seed, pool_factor=1.0):
    """Inputs of ``mla_verify_attention`` for one batch (bf16, scattered int32 slots, random tree
    or causal), from the bench's ``Case`` / ``build_inputs``."""
    import torch

    from phases.kernel.bench.cases import Case, build_inputs

    case = Case(num_heads=num_heads, draft_lens=tuple(draft_lens), context_lens=tuple(kv_lens), tree=tree,
                sm_scale=SM_SCALE, seed=seed)
    return build_inputs(case, torch.device("cuda"), pool_factor=pool_factor)


def all_variants():
    """The variants the path uses, then the candidates under measurement."""
    from kernel.bench_api import hopper

    return (*hopper.VARIANTS, *hopper.CANDIDATES)


def variants():
    """The variant names $VARIANTS lists (default: the ones the path uses). A name may end in
    ``@SCHEDULE`` ("balanced", "waves"): that variant over plans of that schedule (``kernel.plan.plan_work``;
    default "uniform")."""
    from kernel.bench_api import hopper

    names = os.environ.get("VARIANTS")
    if names is None:
        return [v.describe() for v in hopper.VARIANTS]
    known = {v.describe() for v in all_variants()}
    return [n for n in names.split(",") if n.partition("@")[0] in known]


def resolve(name):
    """(variant, schedule) of a name from ``variants()``."""
    base, _, schedule = name.partition("@")
    return next(v for v in all_variants() if v.describe() == base), schedule or "uniform"


CASES = [
    ([1], [1], 16, False), ([1], [70000], 16, False), ([8], [4099], 16, True), ([8], [33333], 128, True),
    ([1, 8, 5], [1, 70001, 777], 16, True), ([8, 1, 3], [65, 12345, 64], 128, False),
    ([64], [2000], 16, True), ([8], [8], 128, True), ([3], [129], 16, False), ([1], [65537], 128, False),
    ([2], [40000], 16, True), ([1, 1, 1], [5, 100000, 3000], 16, False),
]


def _launch(plan, tensors, inputs, out, partials, variant, **kw):
    from kernel.bench_api import hopper, kv_rows

    hopper.run_split_and_combine(plan, tensors, inputs["q"], kv_rows(inputs["kv_cache"]), inputs["qo_indptr"],
                                 inputs["kv_indptr"], inputs["kv_indices"], inputs["tree_mask"], SM_SCALE, out,
                                 *partials, variant=variant, **kw)


def stage_correct(names):
    """Every case for each variant in ``names``; a status file per variant."""
    import torch

    from kernel.bench_api import hopper
    from kernel.reference import mla_verify_reference

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    refs = {}
    for name in names:
        v, schedule = resolve(name)
        ok_v = True
        for i, (T, L, H, tree) in enumerate(CASES):
            if v.keys_as_m and max(T) * H > 64 * v.block_m:
                continue  # keys-as-M targets few rows; skip the widest cases to save time
            inputs = make_case(T, L, H, tree, seed=100 + i)
            N = inputs["q"].shape[0]
            if i not in refs:
                refs[i] = mla_verify_reference(**inputs, compute_dtype=torch.float64, out_dtype=torch.float64)
            ref = refs[i]
            plan = hopper.make_plan(T, L, H, sms, v, schedule=schedule)
            tensors = hopper.plan_tensors(plan, "cuda")
            partials = hopper.allocate_workspace(plan.num_work, "cuda", v.block_m)
            big = torch.full(((N + 2) * H * 512,), float("nan"), dtype=torch.bfloat16, device="cuda")
            out = big[H * 512 : (N + 1) * H * 512].view(N, H, 512)
            _launch(plan, tensors, inputs, out, partials, v)
            torch.cuda.synchronize()
            first = out.clone()
            out.fill_(float("nan"))
            _launch(plan, tensors, inputs, out, partials, v)
            torch.cuda.synchronize()
            err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
            nan = bool(torch.isnan(out).any())
            margins = bool(torch.isnan(big[: H * 512]).all() and torch.isnan(big[(N + 1) * H * 512 :]).all())
            det = torch.equal(first, out)
            ok = err < 1e-2 and not nan and margins and det
            ok_v &= ok
            log(f"{name} T={T} L={L} H={H} tree={tree} work={plan.num_work} rel_err={err:.2e} nan={nan} "
                f"margins_ok={margins} deterministic={det} {'OK' if ok else 'FAIL'}")
        log(f"{name}: {'CORRECT' if ok_v else 'INCORRECT'}")
        with open(os.path.join(OUT, f"correct_{name}.json"), "w") as f:
            json.dump({"variant": name, "correct": ok_v}, f)


def bench(fn, flush):
    """Median µs of the CUDA-graph replay of ``fn`` (eager where capture fails), ``flush`` before each."""
    from phases.common.kernel_timing import event_us, graph_replay

    try:
        run = graph_replay(fn)
    except Exception as e:  # pragma: no cover - reported, then timed eagerly
        log("graph capture failed:", repr(e)[:200])
        run = fn
    return event_us(run, flush, reps=TIMING_REPS, warmup=3)


BATCH_SHAPES = [
    ([1] * 64, [4096] * 64, 16, False), ([1] * 16, [16384] * 16, 128, False),
    ([1] * 16, [4096] * 16, 128, False), ([1] * 64, [4096] * 64, 128, False), ([1] * 64, [16384] * 64, 128, False),
    ([8] * 8, [1024, 4096, 16384, 65536, 131072, 2048, 8192, 32768], 16, True),
]
SHAPES = BATCH_SHAPES if os.environ.get("BATCHES_ONLY") else [
    ([t], [l], h, t > 1) for (h, t) in [(16, 1), (8, 8), (128, 1), (16, 8), (128, 8)] for l in (16384, 65536, 131072)
] + BATCH_SHAPES
WRAPPER_STAGES = ("triton", "auto")  # MLAVerifyWrapper(backend=...): the Triton path, the dispatched path


def shape_name(T, L, H):
    return f"B={len(T)} T={T[0] if len(set(T)) == 1 else 'rag'} H={H} L={L[0] if len(set(L)) == 1 else 'rag'}"


def stage_bench(names):
    """names == ["triton"]: ceilings + the Triton path; ["auto"]: the dispatched wrapper; else one
    Hopper variant (with its PDL timing where the plan has a combine)."""
    import torch

    from kernel import MLAVerifyWrapper
    from kernel.bench_api import hopper
    from phases.common.kernel_timing import l2_flushes
    from phases.common.roofline import measure_ceilings

    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    flush = l2_flushes(device)["read"]  # read-only pass over 256 MB
    res = {}
    which = names[0]
    if which == "triton":
        ceilings = measure_ceilings(device)
        res["bw"], res["peak"] = ceilings.copy_bw_bytes_per_s, ceilings.bf16_flops_per_s
        log(f"copy {res['bw'] / 1e12:.2f} TB/s  mm {res['peak'] / 1e12:.0f} TFLOP/s")
    elif which not in WRAPPER_STAGES:
        v, schedule = resolve(which)
    for i, (T, L, H, tree) in enumerate(SHAPES):
        if which == "triton" and os.environ.get("CEILINGS_ONLY"):
            break
        inputs = make_case(T, L, H, tree, seed=7 + i)
        q = inputs["q"]
        out = torch.empty(q.shape[0], H, 512, dtype=torch.bfloat16, device="cuda")
        name = shape_name(T, L, H)
        ref_path = os.path.join(OUT, f"triton_out_{i}.pt")
        if which in WRAPPER_STAGES:
            w = MLAVerifyWrapper(device, backend=which)
            w.plan(inputs["qo_indptr"], inputs["kv_indptr"], H)
            args = (q, inputs["kv_cache"], inputs["kv_indices"], inputs["tree_mask"], SM_SCALE)
            r = {"us": bench(lambda: w.run(*args, out=out), flush), "path": w.path}
            if which == "triton":
                torch.save(out.cpu(), ref_path)
        else:
            plan = hopper.make_plan(T, L, H, sms, v, schedule=schedule)
            tensors = hopper.plan_tensors(plan, device)
            partials = hopper.allocate_workspace(plan.num_work, device, v.block_m)
            r = {"us": bench(lambda: _launch(plan, tensors, inputs, out, partials, v), flush), "work": plan.num_work}
        torch.cuda.synchronize()
        if which != "triton" and os.path.exists(ref_path):
            o2 = torch.load(ref_path).cuda().float()
            r["agree"] = ((out.float() - o2).abs().max() / o2.abs().max()).item()
        res[name] = r
        log(which, name, json.dumps(r))
        del inputs, q, out
    with open(os.path.join(OUT, f"bench_{which}.json"), "w") as f:
        json.dump(res, f)


def table(names):
    from phases.common.roofline import (
        Ceilings,
        mla_verify_bytes,
        mla_verify_flops,
        roofline_time,
    )

    with open(os.path.join(OUT, "bench_triton.json")) as f:
        base = json.load(f)
    ceilings = Ceilings(base["bw"], base["peak"])
    got = {}
    for n in names:
        path = os.path.join(OUT, f"bench_{n}.json")
        if os.path.exists(path):
            with open(path) as f:
                got[n] = json.load(f)
    log(f"\ncopy {ceilings.copy_bw_bytes_per_s / 1e12:.2f} TB/s, bf16 mm {ceilings.bf16_flops_per_s / 1e12:.0f} "
        "TFLOP/s (same run); fraction = roofline / measured;")
    log(f"CUDA-graph replay median of {TIMING_REPS}, read-only 256 MB pass before each replay")
    log("| shape | roof µs | triton µs (frac) | " + " | ".join(f"{n} µs (frac)" for n in got) + " |")
    log("|---" * (3 + len(got)) + "|")
    for T, L, H, tree in SHAPES:
        name = shape_name(T, L, H)
        roof = roofline_time(mla_verify_bytes(L, T, H), mla_verify_flops(L, T, H), ceilings) * 1e6
        triton_cell = f"{base[name]['us']:.1f} ({roof / base[name]['us']:.2f})" if name in base else "-"
        cells = " | ".join(
            f"{g[name]['us']:.1f} ({roof / g[name]['us']:.2f})" + (f" {g[name]['path']}" if "path" in g[name] else "")
            if name in g else "-" for g in got.values()
        )
        log(f"| {name} | {roof:.1f} | {triton_cell} | {cells} |")


def main() -> int:
    if len(sys.argv) > 1:
        {"correct": stage_correct, "bench": stage_bench}[sys.argv[1]](sys.argv[2].split(","))
        return 0
    t_start = time.time()
    budget = int(os.environ.get("BUDGET_S", 330))
    names = variants()

    def stage(args, limit):
        limit = min(limit, budget - (time.time() - t_start))
        if limit < 5:
            log(f"== {args}: skipped, out of time")
            return
        t0 = time.time()
        try:
            r = subprocess.run([sys.executable, "-m", "phases.kernel.bench.hopper_check", *args], timeout=limit)
            log(f"== {args}: rc={r.returncode} in {time.time() - t0:.0f}s")
        except subprocess.TimeoutExpired:
            log(f"== {args}: TIMEOUT after {limit:.0f}s")

    os.makedirs(OUT, exist_ok=True)
    for n in names:
        stage(["correct", n], int(os.environ.get("T_CORRECT", 60)))
    passed = []
    for n in names:
        path = os.path.join(OUT, f"correct_{n}.json")
        if os.path.exists(path):
            with open(path) as f:
                if json.load(f)["correct"]:
                    passed.append(n)
    stage(["bench", "triton"], int(os.environ.get("T_TRITON", 90)))
    if not os.environ.get("CEILINGS_ONLY"):
        stage(["bench", "auto"], int(os.environ.get("T_TRITON", 90)))
    for n in passed:
        stage(["bench", n], int(os.environ.get("T_VARIANT", 45)))
    if os.path.exists(os.path.join(OUT, "bench_triton.json")):
        table(["auto", *passed])
    return 0


if __name__ == "__main__":
    sys.exit(main())
