"""kernel.reference against an independent brute-force loop (float64, tiny sizes)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.reference import (
    causal_tree_mask,
    mla_verify_reference,
    tree_mask_from_parents,
)


def brute_force(q, kv_rows, draft_lens, slot_lists, masks, sm_scale, v_head_dim):
    """Scalar loops, float64: q [N, H, D]; kv_rows [S, D]; slot_lists[b]: list of L_b slots;
    masks[b]: bool [T_b, T_b] or None (causal). Returns float64 [N, H, DV]."""
    num_heads = q.shape[1]
    out = torch.zeros(q.shape[0], num_heads, v_head_dim, dtype=torch.float64)
    token = 0
    for num_draft, slots, mask in zip(draft_lens, slot_lists, masks):
        context_len = len(slots)
        prefix = context_len - num_draft
        for t in range(num_draft):
            for h in range(num_heads):
                scores = []
                for j, slot in enumerate(slots):
                    if j < prefix:
                        visible = True
                    else:
                        u = j - prefix
                        visible = (u <= t) if mask is None else bool(mask[t][u])
                    if visible:
                        dot = sum(float(q[token + t, h, d]) * float(kv_rows[slot, d]) for d in range(q.shape[2]))
                        scores.append((sm_scale * dot, slot))
                top = max(s for s, _ in scores)
                weights = [(math.exp(s - top), slot) for s, slot in scores]
                total = sum(w for w, _ in weights)
                for w, slot in weights:
                    for d in range(v_head_dim):
                        out[token + t, h, d] += w / total * float(kv_rows[slot, d])
        token += num_draft
    return out


def make_problem(draft_lens, context_lens, parents=None, *, head_dim=8, num_heads=2, seed=0, index_dtype=torch.int32):
    """Random float64 inputs with scattered slots; parents[b] (list or None) per request."""
    generator = torch.Generator().manual_seed(seed)
    num_slots = sum(context_lens) + 5
    kv_rows = torch.randn(num_slots, head_dim, generator=generator, dtype=torch.float64)
    q = torch.randn(sum(draft_lens), num_heads, head_dim, generator=generator, dtype=torch.float64)
    perm = torch.randperm(num_slots, generator=generator)[: sum(context_lens)]
    slot_lists, start = [], 0
    for context_len in context_lens:
        slot_lists.append(perm[start : start + context_len].tolist())
        start += context_len
    masks = [None] * len(draft_lens) if parents is None else [tree_mask_from_parents(p) for p in parents]
    tree_mask = None if parents is None else torch.cat([m.reshape(-1) for m in masks])
    inputs = {
        "q": q,
        "kv_cache": kv_rows,
        "qo_indptr": torch.tensor([0, *torch.tensor(draft_lens).cumsum(0).tolist()], dtype=torch.int32),
        "kv_indptr": torch.tensor([0, *torch.tensor(context_lens).cumsum(0).tolist()], dtype=torch.int32),
        "kv_indices": perm.to(index_dtype),
        "tree_mask": tree_mask,
    }
    return inputs, slot_lists, masks


@pytest.mark.parametrize(
    ("draft_lens", "context_lens", "parents"),
    [
        ((1,), (1,), None),  # decode, a single key
        ((1,), (7,), None),
        ((3,), (3,), None),  # no prefix at all
        ((4,), (9,), None),  # causal chain
        ((4,), (9,), [[-1, 0, 0, 1]]),  # a branching tree
        ((5,), (6,), [[-1, -1, 0, 1, 3]]),  # two roots hanging off the prefix
        ((2, 1, 3), (5, 1, 8), [[-1, 0], [-1], [-1, 0, 0]]),  # ragged batch with trees
        ((2, 1, 3), (2, 4, 3), None),  # ragged batch, causal, L == T
    ],
)
@pytest.mark.parametrize("sm_scale", [None, 0.3])
def test_matches_brute_force(draft_lens, context_lens, parents, sm_scale):
    inputs, slot_lists, masks = make_problem(draft_lens, context_lens, parents)
    v_head_dim = 4
    got = mla_verify_reference(**inputs, sm_scale=sm_scale, v_head_dim=v_head_dim, compute_dtype=torch.float64)
    scale = 1 / math.sqrt(8) if sm_scale is None else sm_scale
    expected = brute_force(inputs["q"], inputs["kv_cache"], draft_lens, slot_lists, masks, scale, v_head_dim)
    assert got.shape == (sum(draft_lens), 2, v_head_dim)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_single_visible_key_returns_its_values():
    inputs, slot_lists, _ = make_problem((1,), (1,))
    got = mla_verify_reference(**inputs, v_head_dim=8, compute_dtype=torch.float64)
    torch.testing.assert_close(got[0, 0], inputs["kv_cache"][slot_lists[0][0]])


def test_layouts_and_mask_dtypes_agree():
    inputs, _, _ = make_problem((3, 2), (10, 4), [[-1, 0, 0], [-1, -1]], index_dtype=torch.int64)
    base = mla_verify_reference(**inputs, v_head_dim=4, compute_dtype=torch.float64)
    as_3d = {**inputs, "kv_cache": inputs["kv_cache"].unsqueeze(1)}
    as_u8 = {**inputs, "tree_mask": inputs["tree_mask"].to(torch.uint8)}
    as_i32 = {**inputs, "kv_indices": inputs["kv_indices"].to(torch.int32)}
    for variant in (as_3d, as_u8, as_i32):
        assert torch.equal(mla_verify_reference(**variant, v_head_dim=4, compute_dtype=torch.float64), base)


def test_causal_default_equals_explicit_causal_mask():
    inputs, _, _ = make_problem((4, 3), (6, 3))
    explicit = torch.cat([causal_tree_mask(4).reshape(-1), causal_tree_mask(3).reshape(-1)])
    implicit = mla_verify_reference(**inputs, v_head_dim=4, compute_dtype=torch.float64)
    masked = mla_verify_reference(**{**inputs, "tree_mask": explicit}, v_head_dim=4, compute_dtype=torch.float64)
    assert torch.equal(implicit, masked)


def test_tree_mask_changes_the_answer():
    inputs, _, _ = make_problem((4,), (6,), [[-1, -1, -1, -1]])  # every draft sees only itself
    tree = mla_verify_reference(**inputs, v_head_dim=4, compute_dtype=torch.float64)
    causal = mla_verify_reference(**{**inputs, "tree_mask": None}, v_head_dim=4, compute_dtype=torch.float64)
    assert torch.equal(tree[0], causal[0])  # draft 0 sees the same keys either way
    assert not torch.allclose(tree[1:], causal[1:])


def test_head_chunking_does_not_change_the_result():
    inputs, _, _ = make_problem((3,), (40,), [[-1, 0, 1]], num_heads=7)
    whole = mla_verify_reference(**inputs, v_head_dim=4, compute_dtype=torch.float64)
    one_head_at_a_time = mla_verify_reference(**inputs, v_head_dim=4, compute_dtype=torch.float64, chunk_bytes=1)
    torch.testing.assert_close(one_head_at_a_time, whole, rtol=1e-13, atol=1e-14)


def test_low_precision_inputs_and_out_dtype():
    inputs, _, _ = make_problem((2,), (12,))
    low = {**inputs, "q": inputs["q"].to(torch.bfloat16), "kv_cache": inputs["kv_cache"].to(torch.bfloat16)}
    default_out = mla_verify_reference(**low, v_head_dim=4)
    assert default_out.dtype == torch.bfloat16
    fp32 = mla_verify_reference(**low, v_head_dim=4, out_dtype=torch.float32)
    fp64 = mla_verify_reference(**low, v_head_dim=4, compute_dtype=torch.float64, out_dtype=torch.float64)
    assert fp32.dtype == torch.float32
    torch.testing.assert_close(fp32.double(), fp64, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kv_indptr": torch.tensor([0, 1], dtype=torch.int32)}, "T_b <= L_b"),  # L < T
        ({"v_head_dim": 9}, "v_head_dim"),
        ({"tree_mask": torch.ones(3, dtype=torch.bool)}, "tree_mask"),
    ],
)
def test_rejects_inconsistent_inputs(change, message):
    inputs, _, _ = make_problem((2,), (5,))
    inputs.setdefault("v_head_dim", 4)
    with pytest.raises(ValueError, match=message):
        mla_verify_reference(**{**inputs, **change})


def test_tree_mask_from_parents_example():
    #   prefix -> 0 -> 1 -> 3
    #             0 -> 2
    #   prefix -> 4
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 0, 1, 0, 0],
            [1, 1, 0, 1, 0],
            [0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(tree_mask_from_parents([-1, 0, 0, 1, -1]), expected)
    assert torch.equal(tree_mask_from_parents(torch.tensor([-1, 0, 0, 1, -1])), expected)


def test_causal_mask_is_a_chain():
    assert torch.equal(causal_tree_mask(4), tree_mask_from_parents([-1, 0, 1, 2]))
    assert torch.equal(causal_tree_mask(1), torch.ones(1, 1, dtype=torch.bool))


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-1, 2, 0], [-2]])
def test_tree_mask_rejects_non_topological_parents(parents):
    with pytest.raises(ValueError, match="topological"):
        tree_mask_from_parents(parents)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=24))
def test_tree_mask_is_ancestor_closure(draws):
    parents = [-1 if t == 0 else draw % (t + 1) - 1 for t, draw in enumerate(draws)]
    mask = tree_mask_from_parents(parents)
    for t, parent in enumerate(parents):
        assert mask[t, t]
        assert not mask[t, t + 1 :].any()  # only earlier drafts are ancestors
        expected_row = torch.zeros(len(parents), dtype=torch.bool)
        expected_row[t] = True
        if parent >= 0:
            expected_row |= mask[parent]
        assert torch.equal(mask[t], expected_row)
