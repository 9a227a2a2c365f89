"""Greedy acceptance on the device against the host oracle ``tree.accept_greedy``, and the
accepted slots written to the slot table."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.kv.batch import PackedStep, StepBatch, StepEntry, StepLayout
from serving.speculation.accept import (
    bf16_resolution,
    greedy_accept,
    row_outputs,
    write_accepted_slots,
)
from serving.speculation.tree import DraftTree, accept_greedy

VOCAB = 4  # few tokens: matches, near-misses and equal siblings all happen often


def random_tree(rng: random.Random, size: int, distinct_siblings: bool) -> DraftTree:
    tree = DraftTree()
    for t in range(size):
        parent = rng.randrange(-1, t)
        used = {tok for tok, p in zip(tree.tokens, tree.parents) if p == parent}
        choices = [v for v in range(VOCAB) if v not in used] if distinct_siblings else list(range(VOCAB))
        if not choices:
            break
        tree.tokens.append(rng.choice(choices))
        tree.parents.append(parent)
    return tree


def device_accept(trees, preds, width=None, batch=None):
    entries = [StepEntry(0, 0, list(range(1, len(t) + 2)), [0] + t.tokens, list(range(len(t) + 1)),
                         [-1] + [0 if p < 0 else p + 1 for p in t.parents]) for t in trees]
    step = StepBatch("verify", entries)
    exact = StepLayout.exact(step)
    layout = StepLayout(batch or exact.batch, exact.tokens + 3, exact.tails + 3, exact.mask + 5, width or exact.width, exact.kv)
    packed = PackedStep.allocate(layout, pin=False)
    packed.fill(step)
    fields = packed.views(packed.host.clone())
    pred = torch.tensor(sum(preds, []) + [1, 2, 3], dtype=torch.int64)  # rows past the step: padding
    return greedy_accept(pred, fields, layout.width), fields, layout


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 4), distinct=st.booleans(), pad=st.integers(0, 3))
def test_device_acceptance_equals_the_host_oracle(seed, batch, distinct, pad):
    rng = random.Random(seed)
    trees = [random_tree(rng, rng.randrange(0, 9), distinct) for _ in range(batch)]
    preds = [[rng.randrange(VOCAB) for _ in range(len(t) + 1)] for t in trees]
    width = max(len(t) for t in trees) + 1 + pad
    out, _, _ = device_accept(trees, preds, width=width, batch=batch + (pad > 1))
    for b, (tree, pred) in enumerate(zip(trees, preds)):
        accepted, emitted = accept_greedy(tree, pred)
        n = int(out["n_accepted"][b])
        assert n == len(accepted)
        assert out["order"][b, : n + 1].tolist() == [0] + [t + 1 for t in accepted]
        assert [tree.tokens[c - 1] for c in out["order"][b, 1 : n + 1].tolist()] + [int(out["bonus"][b])] == emitted


def test_planted_bug_is_caught():
    """Accepting a draft that matches although its parent was rejected changes the result:
    the chain 2 -> 3 where the target wants 1 after the root must accept nothing."""
    tree = DraftTree([2, 3], [-1, 0])
    out, _, _ = device_accept([tree], [[1, 3, 0]])
    assert int(out["n_accepted"][0]) == 0 and int(out["bonus"][0]) == 1


def test_accepted_slots_reach_the_table_and_padding_stays_zero():
    table = torch.zeros(3, 8, dtype=torch.int32)
    tree = DraftTree([5, 6, 7], [-1, 0, -1])  # root -> 5 -> 6, root -> 7
    entries = [StepEntry(2, 3, [40, 41, 42, 43], [9, 5, 6, 7], [3, 4, 5, 4], [-1, 0, 1, 0])]
    step = StepBatch("verify", entries)
    layout = StepLayout(2, 8, 8, 20, 4, 16)
    packed = PackedStep.allocate(layout, pin=False)
    packed.fill(step)
    fields = packed.views(packed.host.clone())
    pred = torch.tensor([5, 6, 1, 0, 0, 0, 0, 0])  # after root: 5 (accept), after 5: 6 (accept), after 6: 1
    out = greedy_accept(pred, fields, 4)
    assert int(out["n_accepted"][0]) == 2 and int(out["bonus"][0]) == 1
    write_accepted_slots(table, fields, out["order"], out["n_accepted"], 4)
    assert table[2, 3:6].tolist() == [40, 41, 42] and table[2, 6:].eq(0).all() and table[2, :3].eq(0).all()
    assert table[0].eq(0).all() and table[1].eq(0).all()
    assert accept_greedy(tree, [5, 6, 1, 0]) == ([0, 1], [5, 6, 1])


def test_row_outputs_take_the_first_maximum_and_flag_near_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 1.0, 0.0, 1.999]])
    out = row_outputs(logits, topk=2)
    assert out["pred"].tolist() == [1, 0]
    assert out["near_tie"].tolist() == [True, True] and out["gap"][0] == 0
    assert out["topk"][1].tolist() == [0, 3]
    assert float(bf16_resolution(torch.tensor(2.0))) == pytest.approx(2 ** -6)


def test_adjacent_bf16_logits_are_a_near_tie_and_two_ulps_are_not():
    """bf16 logits are bf16 numbers: values closer than an ulp before rounding come out one ulp
    apart at most, so one ulp is a near tie; two ulps are a real choice."""
    top = 5.0  # bf16 ulp 2^-5 in [4, 8)
    logits = torch.tensor([[top, top - 2 ** -5, 0.0], [top, top - 2 ** -4, 0.0]], dtype=torch.bfloat16)
    out = row_outputs(logits, topk=0)
    assert out["gap"].float().tolist() == [2 ** -5, 2 ** -4]
    assert out["near_tie"].tolist() == [True, False]
