"""The case profiles cover what they claim, and build_inputs makes well-formed inputs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from kernel.reference import causal_tree_mask
from phases.kernel.bench.cases import (
    FULL_DRAFTS,
    FULL_HEADS,
    FULL_MAX_CONTEXT,
    FULL_MAX_TOTAL_KV,
    FULL_SPECIAL_CONTEXTS,
    Case,
    build_inputs,
    full_cases,
    interpret_cases,
)

FULL = full_cases(seed=0)
INTERPRET = interpret_cases(seed=0)


def all_values(cases, field):
    return {value for case in cases for value in getattr(case, field)}


def test_full_profile_size_and_budget():
    assert len(FULL) >= 320
    assert max(case.total_kv for case in FULL) <= FULL_MAX_TOTAL_KV
    assert max(max(case.context_lens) for case in FULL) <= FULL_MAX_CONTEXT
    assert len({case.describe() for case in FULL}) == len(FULL)  # seeds make every case distinct


def test_full_profile_covers_the_listed_shapes():
    assert {case.num_heads for case in FULL} >= set(FULL_HEADS)
    assert all_values(FULL, "draft_lens") >= set(FULL_DRAFTS)
    contexts = all_values(FULL, "context_lens")
    assert contexts >= set(FULL_SPECIAL_CONTEXTS)
    assert max(contexts) >= 150_000
    assert any(t == ctx for case in FULL for t, ctx in zip(case.draft_lens, case.context_lens))
    for num_draft in FULL_DRAFTS:  # L == T (no prefix) for every draft length
        assert any(case.draft_lens == (num_draft,) and case.context_lens == (num_draft,) for case in FULL)
    batch_sizes = {case.batch_size for case in FULL}
    assert 32 in batch_sizes and len(batch_sizes) >= 6
    assert any(len(set(case.context_lens)) > 1 and len(set(case.draft_lens)) > 1 for case in FULL)


def test_full_profile_covers_layouts_dtypes_and_dims():
    assert {case.dtype for case in FULL} == {"bf16", "fp16"}
    assert {case.tree for case in FULL} == {True, False}
    assert {case.scattered for case in FULL} == {True, False}
    assert {case.index_dtype for case in FULL} == {"int32", "int64"}
    assert {case.kv_3d for case in FULL} == {True, False}
    assert {case.sm_scale is None for case in FULL} == {True, False}
    dims = {(case.head_dim, case.v_head_dim) for case in FULL}
    assert (576, 512) in dims and len(dims) >= 4
    assert sum(case.head_dim == 576 for case in FULL) > 0.8 * len(FULL)
    assert any(case.tree and case.scattered and case.dtype == "fp16" and max(case.draft_lens) >= 16 for case in FULL)


def test_interpret_profile_is_tiny_and_varied():
    assert 24 <= len(INTERPRET) <= 40
    for case in INTERPRET:
        assert case.head_dim in (32, 48, 64) and case.v_head_dim in (16, 32)
        assert case.num_heads in (1, 3, 4) and set(case.draft_lens) <= {1, 2, 3, 5}
        assert max(case.context_lens) <= 80 and case.batch_size <= 3
    assert {case.dtype for case in INTERPRET} == {"bf16", "fp16"}
    assert {case.tree for case in INTERPRET} == {True, False}
    assert {case.scattered for case in INTERPRET} == {True, False}
    assert {case.index_dtype for case in INTERPRET} == {"int32", "int64"}
    assert 1 in all_values(INTERPRET, "context_lens")
    assert any(case.batch_size > 1 for case in INTERPRET)


def test_profiles_are_seeded():
    assert full_cases(seed=0) == FULL
    assert full_cases(seed=1) != FULL
    assert interpret_cases(seed=0) == INTERPRET


def check_well_formed(case: Case, inputs: dict) -> None:
    """Index ranges, distinct slots, indptrs, mask validity, data not degenerate."""
    q, kv_cache = inputs["q"], inputs["kv_cache"]
    num_slots = kv_cache.shape[0]
    assert q.shape == (sum(case.draft_lens), case.num_heads, case.head_dim)
    assert kv_cache.shape[-1] == case.head_dim and kv_cache.dim() == (3 if case.kv_3d else 2)
    assert q.dtype == kv_cache.dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[case.dtype]
    assert inputs["qo_indptr"].dtype == inputs["kv_indptr"].dtype == torch.int32
    assert inputs["qo_indptr"].tolist() == [0, *itertools_accumulate(case.draft_lens)]
    assert inputs["kv_indptr"].tolist() == [0, *itertools_accumulate(case.context_lens)]
    indices = inputs["kv_indices"]
    assert indices.dtype == {"int32": torch.int32, "int64": torch.int64}[case.index_dtype]
    assert indices.numel() == case.total_kv
    assert int(indices.min()) >= 0 and int(indices.max()) < num_slots
    assert int(torch.bincount(indices.long(), minlength=num_slots).max()) == 1  # no slot shared at all
    assert num_slots > case.total_kv  # the pool is larger than needed
    bounds = inputs["kv_indptr"].tolist()
    if not case.scattered:
        for start, end in zip(bounds[:-1], bounds[1:]):
            run = indices[start:end].long()
            assert torch.equal(run, torch.arange(int(run[0]), int(run[0]) + end - start))
    assert inputs["v_head_dim"] == case.v_head_dim and inputs["sm_scale"] == case.sm_scale
    assert bool(q.float().abs().sum() > 0)
    assert bool((kv_cache.reshape(-1)[:65536] != 0).float().mean() > 0.99)  # random rows, not zeros
    if not case.tree:
        assert inputs["tree_mask"] is None
        return
    mask = inputs["tree_mask"]
    assert mask.dtype == (torch.uint8 if case.mask_uint8 else torch.bool)
    assert mask.numel() == sum(t * t for t in case.draft_lens)
    offset = 0
    for num_draft in case.draft_lens:
        block = mask[offset : offset + num_draft * num_draft].bool().view(num_draft, num_draft)
        offset += num_draft * num_draft
        check_tree(block)


def check_tree(block: torch.Tensor) -> None:
    """A [T, T] block is a draft-tree mask: diagonal set, only earlier drafts visible, and each row
    is its parent's row (the latest earlier draft it sees) plus itself."""
    num_draft = block.shape[0]
    assert block.diagonal().all()
    assert not block.triu(diagonal=1).any()
    positions = torch.arange(num_draft).expand(num_draft, num_draft)
    parent = torch.where(block.tril(diagonal=-1), positions, -1).max(dim=1).values  # [T]; -1: prefix
    inherited = block[parent.clamp_min(0)] & (parent >= 0)[:, None]
    assert torch.equal(block, inherited | torch.eye(num_draft, dtype=torch.bool))


def itertools_accumulate(lengths):
    total, sums = 0, []
    for length in lengths:
        total += length
        sums.append(total)
    return sums


@pytest.mark.parametrize("index", range(len(INTERPRET)))
def test_interpret_inputs_are_well_formed(index):
    case = INTERPRET[index]
    check_well_formed(case, build_inputs(case, "cpu"))


@pytest.mark.slow
def test_full_inputs_are_well_formed():
    """Every full case's structure, with the head dim shrunk so the CPU can build them quickly."""
    for case in FULL:
        small = dataclasses.replace(case, head_dim=16, v_head_dim=16, num_heads=min(case.num_heads, 3))
        check_well_formed(small, build_inputs(small, "cpu"))


def test_full_cases_at_production_dims_build():
    case = next(c for c in FULL if c.head_dim == 576 and c.tree and 127 <= c.total_kv <= 5000)
    check_well_formed(case, build_inputs(case, "cpu"))


def test_trees_are_random_not_chains():
    case = Case(num_heads=1, draft_lens=(16,) * 8, context_lens=(40,) * 8, head_dim=16, v_head_dim=16, seed=3)
    mask = build_inputs(case, "cpu")["tree_mask"].view(8, 16, 16)
    chains = sum(torch.equal(block, causal_tree_mask(16)) for block in mask)
    assert chains == 0
    roots = (mask.sum(dim=2) == 1).sum()  # drafts that see only themselves: children of the prefix
    assert roots >= 8


def test_build_inputs_is_deterministic():
    case = INTERPRET[20]
    first, second = build_inputs(case, "cpu"), build_inputs(case, "cpu")
    for name, value in first.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, second[name]), name
        else:
            assert value == second[name]


def test_softmax_is_spread_at_production_dims():
    case = Case(num_heads=16, draft_lens=(1,), context_lens=(4097,), seed=11)
    inputs = build_inputs(case, "cpu")
    rows = inputs["kv_cache"][inputs["kv_indices"].long()].float()  # [L, D]
    scores = inputs["sm_scale"] * torch.einsum("hd,ld->hl", inputs["q"][0].float(), rows)
    assert float(torch.softmax(scores, dim=-1).max()) < 0.05
    assert 0.3 < float(scores.std()) < 3.0
    assert math.isclose(inputs["sm_scale"], 1 / math.sqrt(192))


@pytest.mark.parametrize(
    "fields",
    [
        {"draft_lens": (2,), "context_lens": (1,)},
        {"draft_lens": (1, 2), "context_lens": (5,)},
        {"draft_lens": (1,), "context_lens": (5,), "dtype": "fp8"},
        {"draft_lens": (1,), "context_lens": (5,), "v_head_dim": 600},
    ],
)
def test_case_rejects_impossible_shapes(fields):
    with pytest.raises(ValueError):
        Case(num_heads=1, **fields)
