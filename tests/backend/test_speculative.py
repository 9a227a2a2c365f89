"""Tree speculative decoding: token for token the plain greedy output, no leaked slots."""

from __future__ import annotations

import pytest
import torch

from serving.model.presets import random_model
from serving.speculation.drafters import LayerSkipDrafter, NgramDrafter, parse_speculate
from serving.speculation.tree import DraftTree, accept_greedy
from serving.stack import ServingConfig, build_engine

PROMPTS = [[1, 2, 3, 4, 5], [9, 9], [7, 8, 9] * 6, list(range(20, 61)), [3]]


@pytest.fixture(scope="module")
def model():
    return random_model("tiny", seed=3)


def run(model, spec, backend="reference", prompts=PROMPTS, max_new=24, slots=1024, pool_dtype=torch.float32):
    pool = model.new_pool(slots, pool_dtype)
    eng = build_engine(ServingConfig(backend=backend, speculate=spec, pool_slots=slots), model, pool).engine
    reqs = eng.generate(prompts, max_new)
    return eng, reqs


@pytest.mark.parametrize("spec", ["tree:4x4", "tree:1x6:layers=2", "tree:7x9", "ngram:4x4", "ngram:2x8:n=2", "ngram:1x1"])
def test_speculative_output_equals_plain_greedy(model, spec):
    _, plain = run(model, None)
    eng, spec_reqs = run(model, spec)
    for p, s in zip(plain, spec_reqs):
        assert p.error is None and s.error is None
        assert s.output == p.output
        assert len(s.output) == 24
    assert eng.pool.leaked_slots() == 0
    assert eng.pool.allocator.num_free == eng.pool.allocator.capacity
    assert eng.stats.steps < 23 * len(PROMPTS)


def test_drafts_are_accepted(model):
    eng, _ = run(model, "tree:4x4:layers=2")
    assert eng.stats.accepted_drafts > 0  # the drafter is the target's own first layers
    eng, _ = run(model, "ngram:4x4")
    assert eng.stats.accepted_drafts > 0


def test_speculation_with_the_kernel_backend_under_the_interpreter(model):
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9] * 3]
    _, plain = run(model, None, backend="reference", prompts=prompts, max_new=8, pool_dtype=torch.bfloat16)
    eng, spec = run(model, "tree:2x3", backend="kernel", prompts=prompts, max_new=8, pool_dtype=torch.bfloat16)
    assert [r.output for r in spec] == [r.output for r in plain]
    assert eng.stats.accepted_drafts > 0 and eng.pool.leaked_slots() == 0


def test_tree_mask_and_acceptance():
    tree = DraftTree.from_paths([[10, 11, 12], [10, 13], [20]])
    assert tree.tokens == [10, 11, 12, 13, 20] and tree.parents == [-1, 0, 1, 0, -1]
    assert tree.depths() == [1, 2, 3, 2, 1]
    mask = tree.verify_mask()
    assert mask[4].tolist() == [True, True, False, False, True, False]  # draft 13: root, 10, itself
    # rows: root, 10, 11, 12, 13, 20 -> the target's argmax after each
    accepted, emitted = accept_greedy(tree, [10, 13, 0, 0, 77, 0])
    assert accepted == [0, 3] and emitted == [10, 13, 77]
    accepted, emitted = accept_greedy(tree, [5, 0, 0, 0, 0, 0])
    assert accepted == [] and emitted == [5]
    assert len(DraftTree.from_paths([[i, i + 1] for i in range(100)])) == 63


def test_bad_tree_shapes_are_refused():
    with pytest.raises(ValueError, match="1 <= width \\* depth <= 63"):
        LayerSkipDrafter(8, 8)
    with pytest.raises(ValueError, match="got 'tree:4'"):
        parse_speculate("tree:4")
    with pytest.raises(ValueError, match="width x depth"):
        NgramDrafter(0, 3)


def test_scratch_exhaustion_falls_back_to_plain_decoding(model):
    """When the drafter cannot get scratch slots it drafts nothing; the output is unchanged."""
    _, plain = run(model, None, prompts=[[1, 2, 3]], max_new=6)
    eng, spec = run(model, "tree:4x4", prompts=[[1, 2, 3]], max_new=6, slots=12)
    assert spec[0].output == plain[0].output and eng.pool.leaked_slots() == 0


def _scan_continuations(history, width, depth, max_n, min_n=1):
    """Prompt lookup by a backwards scan of the whole history: the index's oracle."""
    found = []
    for n in range(min(max_n, len(history) - 1), min_n - 1, -1):
        suffix = history[-n:]
        for start in range(len(history) - n - 1, -1, -1):
            if history[start : start + n] == suffix:
                cont = history[start + n : start + n + depth]
                if cont and cont not in found:
                    found.append(cont)
                    if len(found) >= width:
                        return found
    return found


@pytest.mark.parametrize("seed", range(4))
def test_ngram_index_drafts_what_a_full_scan_finds_as_the_history_grows(seed):
    import random

    from serving.speculation.ngram_index import NgramIndexes

    rng = random.Random(seed)
    drafter = NgramDrafter(3, 4, max_n=3)
    prompts = {rid: [rng.randrange(6) for _ in range(rng.randrange(1, 40))] for rid in range(3)}
    outputs = {rid: [] for rid in prompts}
    indexes = NgramIndexes(1, 3)
    for _ in range(60):
        rid = rng.randrange(3)
        outputs[rid] += [rng.randrange(6) for _ in range(rng.randrange(1, 5))]  # a step's emitted tokens
        history = prompts[rid] + outputs[rid]
        want = _scan_continuations(history, 3, 4, 3)
        assert indexes.synced(rid, prompts[rid], outputs[rid]).continuations(3, 4) == want
        assert drafter.paths(history) == want
    # an id reused by another request: its index is rebuilt, not extended
    assert indexes.synced(0, [5, 4, 3, 5, 4], []).continuations(3, 4) == _scan_continuations([5, 4, 3, 5, 4], 3, 4, 3)


def test_ngram_indexes_of_finished_requests_are_dropped():
    from serving.speculation.ngram_index import NgramIndexes

    indexes = NgramIndexes(1, 2, idle_calls=10)
    indexes.synced(99, [1, 2, 1], [])
    for i in range(200):
        indexes.synced(1, [1, 2, 3], [i % 3])
    assert len(indexes) == 1
