"""The kernel's contiguous fast path: requests told their leading run of consecutive slots
read it without index loads, bitwise as the gather path does; the plan metadata. (The Gluon
kernels' fast path compiles for sm_90: tests/kernel/test_hopper.py.)"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from kernel import MLAVerifyWrapper, mla_verify_attention
from kernel.plan import PlanLayout, contiguous_runs, with_contiguity
from phases.kernel.bench.cases import (
    build_inputs,
    fast_path_args,
    fast_path_cases,
    interpret_cases,
)

interpreting_or_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="the kernel needs a GPU or TRITON_INTERPRET=1 set before it is imported",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@interpreting_or_gpu
@pytest.mark.parametrize("index", range(8))
def test_the_fast_path_is_bitwise_the_gather_path(index):
    case = fast_path_cases(0, interpret=True)[index]
    inputs = build_inputs(case, DEVICE)
    args = fast_path_args(inputs)
    assert args["kv_contig"].max() > 0
    gathered = mla_verify_attention(**inputs, backend="triton")
    fast = mla_verify_attention(**inputs, backend="triton", **args)
    assert torch.equal(gathered, fast)


@interpreting_or_gpu
def test_contiguous_tiles_read_no_index():
    """Slot indices of a whole-tile contiguous prefix poisoned: the output does not change."""
    case = next(c for c in interpret_cases(0) if not c.scattered and c.batch_size > 1 and max(c.context_lens) > 40)
    inputs = build_inputs(case, DEVICE)
    expect = mla_verify_attention(**inputs, backend="triton")
    kv_start, _ = contiguous_runs(inputs["kv_indptr"].cpu().numpy(), inputs["kv_indices"].cpu().numpy())
    block_n = 16  # the interpreter's tiles: runs a whole number of tiles long have no index load at all
    contig = np.array([(length - t) // block_n * block_n for length, t in zip(case.context_lens, case.draft_lens)])
    assert contig.max() > 0
    poisoned = inputs["kv_indices"].clone()
    for b, start in enumerate(inputs["kv_indptr"][:-1].tolist()):
        poisoned[start : start + contig[b]] = inputs["kv_cache"].shape[0] + 10_000_000  # far outside the pool
    fast = mla_verify_attention(**dict(inputs, kv_indices=poisoned), backend="triton", kv_start=kv_start, kv_contig=contig)
    assert torch.equal(expect, fast)


@interpreting_or_gpu
def test_graph_plans_refresh_the_fast_path_metadata():
    """Under use_cuda_graph the fixed metadata holds kv_start / kv_contig; a plan without a run
    (all -1) turns it off in place, and both give the gather path's bits."""
    case = next(c for c in interpret_cases(0) if not c.scattered and c.batch_size > 1)
    inputs = build_inputs(case, DEVICE)
    expect = mla_verify_attention(**inputs, backend="triton")
    args = fast_path_args(inputs)
    ws = MLAVerifyWrapper(DEVICE).allocate_workspace(max_batch=4, max_draft=8, num_heads=case.num_heads,
                                                     head_dim=case.head_dim, v_head_dim=case.v_head_dim,
                                                     use_cuda_graph=True)
    wrapper = MLAVerifyWrapper(DEVICE, workspace=ws, use_cuda_graph=True, backend="triton")
    run = lambda: wrapper.run(inputs["q"], inputs["kv_cache"], inputs["kv_indices"], inputs["tree_mask"],  # noqa: E731
                              inputs["sm_scale"])
    plan_args = (inputs["qo_indptr"], inputs["kv_indptr"], case.num_heads, case.head_dim, case.v_head_dim)
    wrapper.plan(*plan_args, dtype=inputs["q"].dtype, **args)
    assert torch.equal(run(), expect)
    views = ws.layout.views(ws.metadata)
    assert views["kv_contig"][: case.batch_size].tolist() == args["kv_contig"].tolist()
    wrapper.plan(*plan_args, dtype=inputs["q"].dtype, kv_start=[-1] * case.batch_size)
    assert views["kv_contig"][: case.batch_size].tolist() == [0] * case.batch_size
    assert torch.equal(run(), expect)


def test_plan_metadata_and_its_checks():
    from kernel.plan import HeadDims, TileConfig, plan_work

    config = TileConfig(block_m=16, block_n=16, num_warps=1, num_stages=1, target_programs=4, min_chunk=16)
    plan = plan_work([2, 1, 3], [40, 9, 30], 4, HeadDims.of(64, 32), config)
    layout = PlanLayout(4, 32, 16)
    plain = layout.pack(plan)
    views = layout.views(torch.from_numpy(plain))
    assert views["kv_start"].tolist() == [0] * 4 and views["kv_contig"].tolist() == [0] * 4
    with_contiguity(plan, [100, -1, 7])  # default count: each prefix
    assert plan.kv_contig.tolist() == [38, 0, 27] and plan.kv_start.tolist() == [100, -1, 7]
    packed = layout.pack(plan)
    views = layout.views(torch.from_numpy(packed))
    assert views["kv_start"].tolist()[:3] == [100, -1, 7] and views["kv_contig"].tolist()[:3] == [38, 0, 27]
    names = [n for n in layout.sizes() if not n.startswith("kv_")]
    base = PlanLayout(4, 32, 16).views(torch.from_numpy(plain))
    for name in names:  # every other array where it was
        assert torch.equal(views[name], base[name])
    for start, contig, message in (([1, 2], None, "batch's 3"), ([1, 2, 3], [41, 0, 0], "kv_contig"),
                                   ([-1, 2, 3], [5, 0, 0], "kv_start"), ([1, 2, 3], [-1, 0, 0], "kv_contig")):
        with pytest.raises(ValueError, match=message):
            with_contiguity(plan, start, contig)
    assert [r.tolist() for r in contiguous_runs([0, 4, 4, 7], [5, 6, 7, 1, 9, 10, 2])] == [[5, -1, 9], [3, 0, 2]]


def test_fast_path_cases_stay_within_their_profiles_and_build_distinct_slots():
    from phases.kernel.bench.cases import PROFILES, full_cases

    tiny = fast_path_cases(0, interpret=True)
    assert len(PROFILES["interpret"](0)) == len(interpret_cases(0)) + len(tiny) <= 40
    for case in tiny:
        assert case.head_dim in (32, 48, 64) and case.num_heads in (1, 3, 4) and max(case.context_lens) <= 80
    full = fast_path_cases(0, interpret=False)
    assert len(PROFILES["full"](0)) == len(full_cases(0)) + len(full)
    assert {c.scattered for c in full} == {True, False} and {c.tree for c in full} == {True, False}
    assert all(c.head_dim == 576 and max(c.context_lens) <= 70_000 for c in full)
    assert len({c.describe() for c in tiny + full}) == len(tiny) + len(full)
    for case in tiny + [c for c in full if c.total_kv < 20_000][:3]:
        inputs = build_inputs(case, "cpu")
        slots = inputs["kv_indices"].long()
        assert len(set(slots.tolist())) == slots.numel() and int(slots.max()) < inputs["kv_cache"].shape[0]
        runs = fast_path_args(inputs)["kv_contig"]
        if not case.scattered:
            assert runs.tolist() == list(case.context_lens)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                    reason="needs an sm_90 (Hopper) GPU")
@pytest.mark.parametrize("heads, drafts, scattered", [(16, (1, 1), False), (16, (4, 2), True), (16, (8, 3), True),
                                                      (128, (8,), True)])
def test_the_hopper_fast_path_is_bitwise_the_gather_path(heads, drafts, scattered):
    """Every Gluon split kernel (16 packed rows: keys as M; 64: two warpgroups behind a producer;
    128 and 1024: the seesaw), with each request's leading run read as start + position."""
    from phases.kernel.bench.cases import Case

    case = Case(num_heads=heads, draft_lens=drafts, context_lens=tuple(4099 + 977 * b for b in range(len(drafts))),
                scattered=scattered, fast_path=True, seed=7)
    inputs = build_inputs(case, "cuda")
    args = fast_path_args(inputs)
    runs = args["kv_contig"].tolist()
    assert runs == list(case.context_lens) if not scattered else 128 < min(runs) and max(runs) < min(case.context_lens)
    gathered = mla_verify_attention(**inputs, backend="hopper")
    fast = mla_verify_attention(**inputs, backend="hopper", **args)
    assert torch.equal(gathered.view(torch.int16), fast.view(torch.int16))
