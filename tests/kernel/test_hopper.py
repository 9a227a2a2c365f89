"""The Gluon Hopper kernel (kernel/hopper.py): sm_90 resources on any machine, correctness on an H200.

The resource tests compile for sm_90 without a GPU (Gluon does not run in the interpreter, but it
compiles on a CPU machine); the ``gpu`` tests need an sm_90 device.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernel import hopper, mla_verify_attention
from kernel.plan import HeadDims, PlanLayout
from tests.kernel.oracle import random_tree, reference

SHARED_LIMIT = 227 * 1024  # opt-in shared memory per block on sm_90

needs_gluon = pytest.mark.skipif(not hopper.HAVE_GLUON, reason="this Triton has no Gluon (triton.experimental.gluon)")
ON_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_sm90 = pytest.mark.skipif(not ON_SM90, reason="needs an sm_90 (Hopper) GPU")


def _ptxas_available() -> bool:
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return bool(get_ptxas(90).path)
    except Exception:
        return False


REPO = Path(__file__).resolve().parents[2]
_COMPILE = """
import json, sys
from kernel import hopper
out = []
for v in (*hopper.VARIANTS, *hopper.CANDIDATES):
    for causal in (False, True):
        for contiguous in (False, True):
            stats = hopper.resource_stats(hopper.compile_for_sm90(causal, v, contiguous))
            out.append(dict(stats, variant=v.describe(), causal=causal, contiguous=contiguous))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sm90_stats():
    """Compile stats of the dispatched variants, in a child process: this suite's conftest turns on
    Triton's interpreter on CPU machines, and Gluon compiles only outside it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _COMPILE], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@needs_gluon
@pytest.mark.skipif(not _ptxas_available(), reason="Triton's bundled ptxas is missing")
def test_compiles_for_sm90_without_spills(sm90_stats):
    """Every dispatched variant and every candidate under measurement, tree and causal, with and
    without the contiguous fast path. One known exception: the seesaw's tree-mask kernel with the
    fast path spills 16 bytes (its run's two scalars; both warpgroups already hold 255 registers)."""
    assert len(sm90_stats) == 4 * (len(hopper.VARIANTS) + len(hopper.CANDIDATES))
    for stats in sm90_stats:
        known = stats["variant"] == hopper.SEESAW_VARIANT.describe() and stats["contiguous"] and not stats["causal"]
        assert stats["n_spills"] <= (16 if known else 0), stats
        assert 0 < stats["shared_bytes"] <= SHARED_LIMIT, stats


def test_choose_variant_by_rows():
    assert hopper.choose_variant(16) == hopper.KEYS_AS_M_VARIANT
    assert hopper.choose_variant(17) == hopper.DEFAULT_VARIANT
    assert hopper.choose_variant(127) == hopper.DEFAULT_VARIANT
    assert hopper.choose_variant(128) == hopper.SEESAW_VARIANT
    assert hopper.choose_variant(1024) == hopper.SEESAW_VARIANT


def test_make_plan_uses_the_variant_tiles():
    plan = hopper.make_plan([1], [10000], 16, 132)
    assert (plan.config.block_m, plan.config.block_n, plan.config.keys_as_m) == (16, 64, True)
    plan = hopper.make_plan([8, 1], [10000, 300], 16, 132)
    assert (plan.config.block_m, plan.config.block_n, plan.config.keys_as_m) == (64, 64, False)


def test_supported_rejects_cpu_tensors():
    q = torch.zeros(1, 16, 576, dtype=torch.bfloat16)
    kv = torch.zeros(8, 576, dtype=torch.bfloat16)
    assert not hopper.supported(q, kv)


# ----------------------------------------------------------------------------------------------
# Dispatch from MLAVerifyWrapper / mla_verify_attention
# ----------------------------------------------------------------------------------------------

CPU = "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_not_available_for_cuda_without_a_cuda_device():
    """Asking for "cuda" where torch sees no CUDA device answers False instead of raising."""
    assert not hopper.available("cuda")
    assert not hopper.available(torch.device("cuda", 0))


def test_dispatch_chooses_triton_without_a_hopper_gpu():
    """On a CPU machine (Triton's interpreter) the wrapper plans and runs the Triton path."""
    from kernel import MLAVerifyWrapper

    assert not hopper.available(CPU)
    wrapper = MLAVerifyWrapper(CPU)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 64, generator=gen).to(torch.bfloat16)
    kv = torch.randn(40, 64, generator=gen).to(torch.bfloat16)
    qo_indptr = torch.tensor([0, 2], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 40], dtype=torch.int32)
    wrapper.plan(qo_indptr, kv_indptr, num_heads=2, head_dim=64, v_head_dim=32)
    assert wrapper.path == "triton"
    out = wrapper.run(q, kv, torch.arange(40, dtype=torch.int32))
    assert not torch.isnan(out).any()
    assert not wrapper.planned.config.keys_as_m


def test_run_refuses_inputs_other_than_planned():
    """``plan`` fixes the path for the index dtype and row stride it is told; ``run`` launches
    only that, and refuses int64 indices or strided rows it was not planned for."""
    from kernel import MLAVerifyWrapper

    wrapper = MLAVerifyWrapper(CPU)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, 64, generator=gen).to(torch.bfloat16)
    kv = torch.randn(40, 64, generator=gen).to(torch.bfloat16)
    qo_indptr = torch.tensor([0, 2], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 40], dtype=torch.int32)
    wrapper.plan(qo_indptr, kv_indptr, num_heads=2, head_dim=64, v_head_dim=32)
    with pytest.raises(ValueError, match="kv_indices of torch.int32 as planned"):
        wrapper.run(q, kv, torch.arange(40, dtype=torch.int64))
    wide = torch.randn(40, 128, generator=gen).to(torch.bfloat16)[:, :64]
    with pytest.raises(ValueError, match="64 elements apart as planned"):
        wrapper.run(q, wide, torch.arange(40, dtype=torch.int32))
    wrapper.plan(qo_indptr, kv_indptr, num_heads=2, head_dim=64, v_head_dim=32, kv_index_dtype=torch.int64)
    assert wrapper.path == "triton" and not torch.isnan(wrapper.run(q, kv, torch.arange(40))).any()


def test_backend_hopper_raises_without_a_hopper_gpu():
    from kernel import MLAVerifyWrapper, mla_verify_attention

    with pytest.raises(ValueError, match="backend='hopper'"):
        MLAVerifyWrapper(CPU, backend="hopper")
    q = torch.zeros(1, 16, 576, dtype=torch.bfloat16)
    kv = torch.zeros(8, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="sm_90"):
        mla_verify_attention(q, kv, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 8], dtype=torch.int32),
                             torch.arange(8, dtype=torch.int32), backend="hopper")
    with pytest.raises(ValueError, match="backend"):
        MLAVerifyWrapper(CPU, backend="cuda")


def test_triton_config_for_a_hopper_plan_keeps_its_decomposition():
    """The Triton fallback over a Hopper plan keeps the plan's block sizes and work split; for the
    keys-as-M 16-row plan that is the Triton 16-row default, for the 64-row plan the Triton kernel
    launched with 64-row blocks (no longer the portable default, which is spill-free at 32 rows)."""
    from kernel.mla_verify import triton_config_for
    from kernel.plan import default_tile_config

    dims = HeadDims.of(576, 512)
    for rows in (16, 64, 128):
        cfg = hopper.tile_config(132, hopper.choose_variant(rows))
        fallback = triton_config_for(cfg)
        assert not fallback.keys_as_m and fallback.num_warps == 8
        assert (fallback.block_m, fallback.block_n, fallback.target_programs, fallback.min_chunk) == (
            cfg.block_m, cfg.block_n, cfg.target_programs, cfg.min_chunk)
        assert hopper.variant_of(cfg) == hopper.choose_variant(rows)
    small = hopper.tile_config(132, hopper.choose_variant(16))
    assert triton_config_for(small) == dataclasses.replace(default_tile_config(16, dims, 132, False), min_chunk=small.min_chunk)


# ----------------------------------------------------------------------------------------------
# GPU correctness (float64 reference, NaN-poisoned output with guard rows, determinism)
# ----------------------------------------------------------------------------------------------


def _inputs(draft_lens, kv_lens, num_heads, tree, seed, device="cuda"):
    gen = torch.Generator().manual_seed(seed)
    n, total = sum(draft_lens), sum(kv_lens)
    pool = total + 97
    q = (torch.randn(n, num_heads, 576, generator=gen) * 0.5).to(torch.bfloat16).to(device)
    kv = torch.randn(pool, 576, generator=gen).to(torch.bfloat16).to(device)
    kv_indices = torch.randperm(pool, generator=gen)[:total].to(torch.int32).to(device)
    qo_indptr = torch.tensor([0, *torch.tensor(draft_lens).cumsum(0).tolist()], dtype=torch.int32).to(device)
    kv_indptr = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32).to(device)
    masks = [random_tree(t, gen).to(device) for t in draft_lens] if tree else None
    flat = torch.cat([m.flatten() for m in masks]) if tree else None
    return q, kv, qo_indptr, kv_indptr, kv_indices, masks, flat


CASES = [
    ([1], [1], 16, False),
    ([1], [70000], 16, False),
    ([8], [4099], 16, True),
    ([8], [33333], 128, True),
    ([1, 8, 5], [1, 70001, 777], 16, True),
    ([8, 1, 3], [65, 12345, 64], 128, False),
    ([64], [2000], 16, True),
    ([3], [129], 16, False),
    ([1, 1, 1], [5, 100000, 3000], 16, False),
]


VARIANT_PARAMS = [pytest.param(None, id="chosen"), pytest.param(hopper.DEFAULT_VARIANT, id="two_warpgroups"),
                  pytest.param(hopper.SEESAW_VARIANT, id="seesaw"),
                  *[pytest.param(v, id=v.describe()) for v in hopper.CANDIDATES]]


@pytest.mark.gpu
@needs_gluon
@needs_sm90
def test_the_wrapper_plans_batches_with_the_waves_schedule():
    """A serving batch (B=64, H=128, 4k) on the Hopper path: one program per 64-row block, no merge
    (the uniform chunk makes twice the programs, half of them one-tile slivers)."""
    from kernel import MLAVerifyWrapper

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    qo = torch.arange(0, 65, dtype=torch.int32)
    kv = torch.arange(0, 65 * 4096, 4096, dtype=torch.int32)
    plan = MLAVerifyWrapper("cuda").plan(qo, kv, 128)
    waves = hopper.make_plan([1] * 64, [4096] * 64, 128, sms, schedule="waves")
    uniform = hopper.make_plan([1] * 64, [4096] * 64, 128, sms, schedule="uniform")
    assert hopper.default_schedule(64) == "waves" and hopper.default_schedule(1) == "uniform"
    assert plan.num_work == waves.num_work == 128 < uniform.num_work
    assert not plan.needs_combine


@pytest.mark.gpu
@needs_gluon
@needs_sm90
@pytest.mark.parametrize("variant", VARIANT_PARAMS)
@pytest.mark.parametrize("draft_lens,kv_lens,num_heads,tree", CASES)
def test_matches_float64_reference(draft_lens, kv_lens, num_heads, tree, variant):
    q, kv, qo_indptr, kv_indptr, kv_indices, masks, flat = _inputs(draft_lens, kv_lens, num_heads, tree, seed=sum(kv_lens))
    assert hopper.supported(q, kv, kv_indices=kv_indices)
    scale = 1.0 / math.sqrt(192)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    plan = hopper.make_plan(draft_lens, kv_lens, num_heads, sms, variant)
    tensors = hopper.plan_tensors(plan, q.device)
    partial_o, partial_lse = hopper.allocate_workspace(plan.num_work, q.device)
    _check_guarded_twice(
        lambda out: hopper.run_split_and_combine(plan, tensors, q, kv, qo_indptr, kv_indptr, kv_indices, flat, scale,
                                                 out, partial_o, partial_lse, variant=variant),
        q.shape[0], num_heads, reference(q, kv, qo_indptr, kv_indptr, kv_indices, masks, scale, 512),
    )


def _check_guarded_twice(call, n: int, h: int, ref: torch.Tensor) -> None:
    """``call(out)`` into a NaN-poisoned out [n, h, 512] inside a NaN buffer, twice: every element
    written, nothing outside out, identical bits, within 1e-2 of ``ref`` (float64)."""
    guarded = torch.full(((n + 2) * h * 512,), float("nan"), dtype=torch.bfloat16, device=ref.device)
    out = guarded[h * 512 : (n + 1) * h * 512].view(n, h, 512)
    call(out)
    first = out.clone()
    out.fill_(float("nan"))
    call(out)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), "rows left unwritten"
    assert torch.isnan(guarded[: h * 512]).all() and torch.isnan(guarded[(n + 1) * h * 512 :]).all(), "wrote outside out"
    assert torch.equal(first, out), "not deterministic"
    err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    assert err < 1e-2, err


@pytest.mark.gpu
@needs_gluon
@needs_sm90
def test_one_call_form():
    q, kv, qo_indptr, kv_indptr, kv_indices, masks, flat = _inputs([4, 2], [5000, 700], 16, True, seed=3)
    out = mla_verify_attention(q, kv, qo_indptr, kv_indptr, kv_indices, flat, 1.0 / math.sqrt(192), backend="hopper")
    ref = reference(q, kv, qo_indptr, kv_indptr, kv_indices, masks, 1.0 / math.sqrt(192), 512)
    assert ((out.double() - ref).abs().max() / ref.abs().max()).item() < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["triton", pytest.param("hopper", marks=[needs_gluon, needs_sm90])])
@pytest.mark.parametrize("draft_lens,kv_lens,num_heads,tree", CASES)
def test_wrapper_backends_match_float64_reference(draft_lens, kv_lens, num_heads, tree, backend):
    """Each backend through MLAVerifyWrapper: float64 reference, NaN-poisoned out inside a NaN
    buffer (guard rows untouched), bitwise-identical second run."""
    from kernel import MLAVerifyWrapper

    q, kv, qo_indptr, kv_indptr, kv_indices, masks, flat = _inputs(draft_lens, kv_lens, num_heads, tree, seed=len(kv_lens))
    scale = 1.0 / math.sqrt(192)
    wrapper = MLAVerifyWrapper(q.device, backend=backend)
    wrapper.plan(qo_indptr, kv_indptr, num_heads)
    assert wrapper.path == backend
    _check_guarded_twice(lambda out: wrapper.run(q, kv, kv_indices, flat, scale, out), q.shape[0], num_heads,
                         reference(q, kv, qo_indptr, kv_indptr, kv_indices, masks, scale, 512))


@pytest.mark.gpu
@needs_gluon
@needs_sm90
def test_auto_dispatches_hopper_and_plans_triton_for_int64_indices():
    from kernel import MLAVerifyWrapper

    q, kv, qo_indptr, kv_indptr, kv_indices, masks, flat = _inputs([4, 2], [5000, 700], 16, True, seed=5)
    scale = 1.0 / math.sqrt(192)
    ref = reference(q, kv, qo_indptr, kv_indptr, kv_indices, masks, scale, 512)
    wrapper = MLAVerifyWrapper(q.device)
    for indices, path in ((kv_indices, "hopper"), (kv_indices.long(), "triton")):
        wrapper.plan(qo_indptr, kv_indptr, 16, kv_index_dtype=indices.dtype)
        assert wrapper.path == path
        out = wrapper.run(q, kv, indices, flat, scale)
        assert ((out.double() - ref).abs().max() / ref.abs().max()).item() < 1e-2
    forced = MLAVerifyWrapper(q.device, backend="hopper")
    with pytest.raises(ValueError, match="int32 slots"):
        forced.plan(qo_indptr, kv_indptr, 16, kv_index_dtype=torch.int64)
    fp16 = MLAVerifyWrapper(q.device)
    fp16.plan(qo_indptr, kv_indptr, 16, dtype=torch.float16)
    assert fp16.path == "triton"


def test_combine_shape_launches_about_a_thousand_programs_outside_graphs():
    """Each plan takes the shape measured fastest for it (NOTES, "The combine's shape"): 16 or 64 rows
    with ~128 splits take every split in one load over 32 columns; 128 rows of 64 splits (64, 64);
    1024 or more rows of few splits whole rows, 8 splits a load; a graph's shape follows its layout's
    rows: the wide one up to GRAPH_WIDE_MAX_ROWS, the narrow one past them, whatever the plan."""
    assert hopper.combine_shape(hopper.make_plan([1], [65536], 16, 132)) == hopper.COMBINE_WIDE
    assert hopper.combine_shape(hopper.make_plan([8], [65536], 8, 132)) == hopper.COMBINE_WIDE
    assert hopper.combine_shape(hopper.make_plan([8], [65536], 16, 132)) == (64, 64)  # 2 blocks x 64 splits
    assert hopper.combine_shape(hopper.make_plan([8], [65536], 32, 132)) == hopper.COMBINE_NARROW
    assert hopper.combine_shape(hopper.make_plan([8], [65536], 128, 132)) == (8, 512)  # 16 blocks x 9 splits
    assert hopper.combine_shape(hopper.make_plan([1] * 16, [4096] * 16, 128, 132)) == (8, 512)
    one = hopper.make_plan([1], [65536], 16, 132)
    assert hopper.combine_shape(one, PlanLayout(1, 132, 1)) == hopper.COMBINE_WIDE  # a B=1 decode bucket: 16 rows
    assert hopper.combine_shape(one, PlanLayout(4, 132, 4)) == hopper.COMBINE_WIDE  # 64 rows
    assert hopper.combine_shape(one, PlanLayout(8, 132, 8)) == hopper.COMBINE_NARROW  # 128 rows
    many = hopper.make_plan([1] * 16, [4096] * 16, 128, 132)
    assert hopper.combine_shape(many, PlanLayout(1, 132, 1)) == hopper.COMBINE_WIDE  # the layout decides
    for shape in hopper.COMBINE_SHAPES:  # a load's [splits, columns] tile: at most 64 fp32 per thread of 4 warps
        assert shape[0] * shape[1] <= 64 * 128 and hopper.V_HEAD_DIM % shape[1] == 0


@pytest.mark.parametrize("draft,context,heads", [(1, 65536, 16), (8, 65536, 16), (1, 3000, 16)])
def test_hopper_combine_merges_random_partials_in_every_shape(draft, context, heads):
    """The combine over a Hopper plan's partials (plain Triton: it runs in the CPU interpreter)
    against a float64 merge of random partials, in every shape ``combine_shape`` chooses from, over
    plans of 128 splits of one row block, two row blocks of 64 splits and 24 splits of 3000 keys."""
    from kernel.triton_kernels import launch_combine

    plan = hopper.make_plan([draft], [context], heads, 132)
    assert plan.needs_combine
    gen = torch.Generator().manual_seed(context + draft)
    bm = plan.config.block_m
    partial_o = torch.randn(plan.num_work, bm, 512, generator=gen)
    partial_lse = torch.randn(plan.num_work, bm, generator=gen) * 4
    tensors = hopper.plan_tensors(plan, "cpu")
    qo_indptr = torch.tensor([0, draft], dtype=torch.int32)
    want = torch.zeros(draft * heads, 512, dtype=torch.float64)
    for i in range(plan.num_row_blocks):
        w = plan.mb_work_start[i] + plan.mb_stride[i] * torch.arange(int(plan.mb_nsplit[i]))
        rows = plan.mb_mblk[i] * bm + torch.arange(bm)
        real = rows < draft * heads
        weight = torch.softmax(partial_lse[w].double() * math.log(2), dim=0)  # exp2 weights, normalized
        merged = (weight[:, :, None] * partial_o[w].double()).sum(0)
        want[rows[real]] = merged[real]
    for shape in hopper.COMBINE_SHAPES:
        out = torch.full((draft, heads, 512), float("nan"), dtype=torch.bfloat16)
        launch_combine(out, partial_o.reshape(-1), partial_lse.reshape(-1), tensors, qo_indptr, heads,
                       plan.num_row_blocks, bm, 512, *shape)
        got = out.reshape(draft * heads, 512).double()
        assert not torch.isnan(got).any()
        assert ((got - want).abs().max() / want.abs().max()).item() < 1e-2, shape


# ----------------------------------------------------------------------------------------------
# Few packed rows with several drafts, and trees whose drafts hang off the prefix
# ----------------------------------------------------------------------------------------------
# The cases above send only T=1 batches to the keys-as-M kernel (<= 16 packed rows): a bug that made
# the first draft visible to every draft passed them and failed 2 of the verify gate's 146 Hopper
# cases. These cover up to 16 packed rows with T >= 2 (so every row block mixes drafts), trees whose
# drafts are children of the prefix (siblings must not see each other), and short prefixes, where
# one wrongly visible key moves the output by O(1) instead of O(1 / context).
# tests/kernel/planted_bugs.py plants that bug in a copy of the tree (phases/kernel/NOTES.md).

SMALL_ROW_SHAPES = [(8, 2), (4, 4), (1, 16), (2, 8)]  # (H, T): 16 packed rows each
PREFIXES = [0, 5, 130, 4000]  # keys before the drafts: none, inside the first tile, past a split, many splits


def _parents(tree: str, t: int, seed: int) -> list[int]:
    """Draft parents of a ``tree`` kind (-1: a child of the prefix, i.e. of the last accepted token)."""
    import random

    if tree == "siblings":  # every draft hangs off the prefix: each sees only itself
        return [-1] * t
    if tree == "two_roots":  # two drafts off the prefix, the rest alternate under them
        return [-1, -1, *[i % 2 for i in range(2, t)]][:t]
    rng = random.Random(seed)
    return [rng.randint(-1, i - 1) for i in range(t)]


def _tree_inputs(draft_lens, prefix_lens, num_heads, tree, seed, device):
    """Inputs with ``tree``-kind masks (None: causal), each request's context = its prefix + drafts.
    Returns (q, kv, qo_indptr, kv_indptr, kv_indices, masks, flat_mask)."""
    from kernel.reference import tree_mask_from_parents

    kv_lens = [p + t for p, t in zip(prefix_lens, draft_lens)]
    q, kv, qo_indptr, kv_indptr, kv_indices, _, _ = _inputs(draft_lens, kv_lens, num_heads, False, seed, device)
    if tree == "causal":
        return q, kv, qo_indptr, kv_indptr, kv_indices, None, None
    masks = [tree_mask_from_parents(_parents(tree, t, seed + b)).to(device) for b, t in enumerate(draft_lens)]
    return q, kv, qo_indptr, kv_indptr, kv_indices, masks, torch.cat([m.flatten() for m in masks])


SMALL_ROW_CASES = [
    pytest.param(h, t, tree, prefix, id=f"H{h}_T{t}_{tree}_prefix{prefix}")
    for h, t in SMALL_ROW_SHAPES for tree in ("siblings", "two_roots", "random", "causal") for prefix in PREFIXES
]


@pytest.mark.gpu
@needs_gluon
@needs_sm90
@pytest.mark.parametrize("variant", VARIANT_PARAMS)
@pytest.mark.parametrize("num_heads,draft,tree,prefix", SMALL_ROW_CASES)
def test_small_row_plans_with_drafts_off_the_prefix(num_heads, draft, tree, prefix, variant):
    """Up to 16 packed rows, T >= 2 (keys-as-M when chosen; every 64-row variant too), against
    float64, NaN-poisoned out."""
    q, kv, qo_indptr, kv_indptr, kv_indices, masks, flat = _tree_inputs([draft], [prefix], num_heads, tree,
                                                                        seed=prefix + draft, device="cuda")
    scale = 1.0 / math.sqrt(192)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    plan = hopper.make_plan([draft], [prefix + draft], num_heads, sms, variant)
    assert plan.config.keys_as_m == (variant is None)
    tensors = hopper.plan_tensors(plan, q.device)
    partial_o, partial_lse = hopper.allocate_workspace(plan.num_work, q.device)
    _check_guarded_twice(
        lambda out: hopper.run_split_and_combine(plan, tensors, q, kv, qo_indptr, kv_indptr, kv_indices, flat, scale,
                                                 out, partial_o, partial_lse, variant=variant),
        q.shape[0], num_heads, reference(q, kv, qo_indptr, kv_indptr, kv_indices, masks, scale, 512),
    )


RAGGED_SMALL_ROWS = [  # (H, T_b, prefix_b): every request <= 16 packed rows, mixed T, short and long prefixes
    (2, [8, 1, 5, 2], [0, 300, 7, 4000]),
    (4, [4, 4, 1, 3], [3, 0, 129, 64]),
    (1, [16, 9, 2], [61, 0, 1000]),
    (16, [1, 1, 1], [0, 5, 20000]),
]


@pytest.mark.gpu
@needs_gluon
@needs_sm90
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph_workspace"])
@pytest.mark.parametrize("tree", ["siblings", "two_roots", "random", "causal"])
@pytest.mark.parametrize("num_heads,drafts,prefixes", RAGGED_SMALL_ROWS)
def test_small_row_ragged_batches_through_the_wrapper(num_heads, drafts, prefixes, tree, graph):
    """The public dispatch (MLAVerifyWrapper(backend="hopper"), as the verify gate calls it) on
    ragged batches of <= 16 packed rows per request, eager and with a CUDA-graph workspace (fixed
    grids); float64 reference, NaN-poisoned out inside a NaN buffer, bitwise rerun."""
    from kernel import MLAVerifyWrapper

    q, kv, qo_indptr, kv_indptr, kv_indices, masks, flat = _tree_inputs(drafts, prefixes, num_heads, tree,
                                                                        seed=sum(prefixes), device="cuda")
    scale = 1.0 / math.sqrt(192)
    if graph:
        workspace = MLAVerifyWrapper("cuda", backend="hopper").allocate_workspace(
            max_batch=len(drafts) + 1, max_draft=max(drafts), num_heads=num_heads, use_cuda_graph=True)
        wrapper = MLAVerifyWrapper("cuda", workspace=workspace, use_cuda_graph=True, backend="hopper")
    else:
        wrapper = MLAVerifyWrapper("cuda", backend="hopper")
    plan = wrapper.plan(qo_indptr.cpu(), kv_indptr.cpu(), num_heads)
    assert plan.config.keys_as_m and wrapper.path == "hopper"
    _check_guarded_twice(lambda out: wrapper.run(q, kv, kv_indices, flat, scale, out), q.shape[0], num_heads,
                         reference(q, kv, qo_indptr, kv_indptr, kv_indices, masks, scale, 512))


@pytest.mark.parametrize("num_heads,draft", SMALL_ROW_SHAPES)
def test_small_row_cases_would_catch_a_first_draft_always_visible(num_heads, draft):
    """The GPU cases above can fail: with draft 0 made visible to every draft (the planted bug),
    the float64 answer of each siblings / two-roots case with a short prefix moves by more than twice
    the 1e-2 tolerance (CPU only: two references, no kernel)."""
    for tree in ("siblings", "two_roots"):
        for prefix in (0, 5, 130):
            q, kv, qo_indptr, kv_indptr, kv_indices, masks, _ = _tree_inputs([draft], [prefix], num_heads, tree,
                                                                          seed=prefix + draft, device="cpu")
            planted = [m.clone() for m in masks]
            for m in planted:
                m[:, 0] = True
            right = reference(q, kv, qo_indptr, kv_indptr, kv_indices, masks, 1 / math.sqrt(192), 512)
            wrong = reference(q, kv, qo_indptr, kv_indptr, kv_indices, planted, 1 / math.sqrt(192), 512)
            err = ((wrong - right).abs().max() / right.abs().max()).item()
            assert err > 2e-2, (tree, prefix, err)  # twice the GPU tests' 1e-2 tolerance


@needs_gluon
def test_planted_first_draft_bug_applies_to_a_copy_and_compiles(tmp_path):
    """The bug the small-row GPU tests must catch plants into a copy of the tree (one line changed,
    the repository untouched) and still compiles for sm_90, so a device run of the copy measures it."""
    from tests.kernel.planted_bugs import BUGS, plant

    bug = BUGS["first_draft_visible"]
    diff = plant("first_draft_visible", REPO, tmp_path / "copy")
    assert [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")] == [
        "-" + " " * 12 + bug.old, "+" + " " * 12 + bug.new]
    assert bug.old in (REPO / bug.path).read_text() and not (tmp_path / "copy" / ".git").exists()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("from kernel import hopper, hopper_gluon; hopper.compile_for_sm90(False, hopper.KEYS_AS_M_VARIANT); "
            "print(hopper_gluon.__file__)")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "copy", env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert Path(run.stdout.strip().splitlines()[-1]).resolve() == (tmp_path / "copy" / bug.path).resolve()


def test_hopper_check_names_variants_candidates_and_schedules(monkeypatch):
    """$VARIANTS picks dispatched variants and candidates by name; NAME@balanced plans with the balanced
    schedule; unknown names are dropped (the check script times each name next to the others)."""
    from phases.kernel.bench import hopper_check

    monkeypatch.delenv("VARIANTS", raising=False)
    assert hopper_check.variants() == [v.describe() for v in hopper.VARIANTS]
    names = ["BN64_S2", "BN64_S2@balanced", *[v.describe() for v in hopper.CANDIDATES], "no_such_variant"]
    monkeypatch.setenv("VARIANTS", ",".join(names))
    assert hopper_check.variants() == names[:-1]
    assert hopper_check.resolve("BN64_S2@balanced") == (hopper.DEFAULT_VARIANT, "balanced")
    assert [hopper_check.resolve(n)[0] for n in names[2:-1]] == list(hopper.CANDIDATES)
