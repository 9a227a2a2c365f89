"""Sampling through the engine: every drafter, chain and tree, samples what plain sampling
samples; a seeded request draws the same tokens alone, in a batch and from a bucket's static
buffers; greedy requests in a sampled batch keep their greedy tokens.

Statistical design (``tests.backend.chisquare``, ALPHA = 1e-3, fixed seeds): a tiny random model
with its MTP module and a 16-token vocabulary, top-k 3 at temperature 1, so the first three
tokens after one prompt fall in at most 27 cells whose exact probabilities come from the
model's own prefill logits (13 contexts). Each drafter decodes ``REQUESTS`` = 500 seeded
requests of that prompt in one batch. The acceptance rule's power against a 2% bias is
``test_rejection``'s (60000 sequences of a toy model); here, where every draw costs a prefill,
the test checks the engine's plumbing (positions, seeds, the MTP module fed the sampled tokens,
trees cut to the pool) with power against gross bugs: the planted acceptance without the ratio
test moves the distribution by total variation 0.3 or more and is rejected.
"""

from __future__ import annotations

import pytest
import torch

import serving.speculation.rejection as rejection
from serving.kv.batch import StepBatch, StepEntry
from serving.model.presets import random_model
from serving.sampling import SamplingParams
from serving.stack import ServingConfig, build_engine
from tests.backend.chisquare import chi_square, reference_probs

VOCAB, TOP_K, REQUESTS = 16, 3, 500
PROMPT = list(range(VOCAB)) * 2  # every token once before: the n-gram drafter proposes after any of them
PARAMS = SamplingParams(temperature=1.0, top_k=TOP_K)
DRAFTERS = ["ngram:1x3", "ngram:2x2", "tree:1x3", "tree:2x2", "mtp:1x3", "mtp:2x2"]


@pytest.fixture(scope="module")
def model():
    return random_model("tiny", seed=3, vocab_size=VOCAB, num_nextn_predict_layers=1)


def engine_for(model, spec=None, **config):
    config = dict(dict(backend="reference", pool_slots=REQUESTS * 48 + 256, max_requests=REQUESTS, max_context=80), **config)
    return build_engine(ServingConfig(speculate=spec, **config), model).engine


def prefix_logits(engine, prefixes: list[list[int]]) -> torch.Tensor:
    """float32 [len(prefixes), V]: the model's logits after each prefix (a prefill, released after)."""
    out = []
    for tokens in prefixes:
        rid = engine.add_request(tokens, 1).req_id
        engine.pool.table.add(rid)
        slots = engine.pool.alloc(len(tokens))
        step = StepBatch("extend", [StepEntry(engine.pool.table.row(rid), 0, slots, tokens, list(range(len(tokens))))],
                         logits_rows=[len(tokens) - 1])
        out.append(engine.runner.extend(step)[0])
        engine.pool.table.append(rid, slots)
        engine.pool.release_request(rid)
    return torch.stack(out)


@pytest.fixture(scope="module")
def plain_joint(model):
    """float64 [V, V, V]: the exact distribution of plain sampling's first three tokens."""
    engine = engine_for(model)

    def probs(prefixes):
        return reference_probs(prefix_logits(engine, prefixes), PARAMS.temperature, PARAMS.top_k)

    joint = torch.zeros(VOCAB, VOCAB, VOCAB, dtype=torch.float64)
    first = probs([PROMPT])[0]
    for a in first.nonzero().flatten().tolist():
        second = probs([PROMPT + [a]])[0]
        bs = second.nonzero().flatten().tolist()
        third = probs([PROMPT + [a, b] for b in bs])
        for b, row in zip(bs, third):
            joint[a, b] = first[a] * second[b] * row
    return joint


def sampled_first_tokens(engine) -> torch.Tensor:
    reqs = engine.generate([PROMPT] * REQUESTS, 3, [SamplingParams(temperature=1.0, top_k=TOP_K, seed=1000 + i) for i in range(REQUESTS)])
    assert all(r.error is None and len(r.output) == 3 for r in reqs)
    assert engine.pool.leaked_slots() == 0
    return torch.tensor([r.output for r in reqs])


def joint_test(tokens: torch.Tensor, joint: torch.Tensor):
    cells = tokens[:, 0] * VOCAB * VOCAB + tokens[:, 1] * VOCAB + tokens[:, 2]
    return chi_square(torch.bincount(cells, minlength=VOCAB**3), joint)


def test_the_reference_has_the_cells_of_top_k(plain_joint):
    assert abs(float(plain_joint.sum()) - 1) < 1e-9 and int((plain_joint > 0).sum()) == TOP_K**3


def test_plain_sampling_through_the_engine_follows_the_model(model, plain_joint):
    test = joint_test(sampled_first_tokens(engine_for(model)), plain_joint)
    assert not test.rejects, test


@pytest.mark.parametrize("spec", DRAFTERS)
def test_every_drafter_samples_what_plain_sampling_samples(model, plain_joint, spec):
    engine = engine_for(model, spec)
    test = joint_test(sampled_first_tokens(engine), plain_joint)
    assert not test.rejects, test
    assert engine.stats.accepted_drafts > 0  # the drafts were tried, and some kept


def test_accepting_without_the_ratio_test_is_caught(model, plain_joint, monkeypatch):
    monkeypatch.setattr(rejection, "acceptance_probability", lambda p, mass, repeat: torch.ones_like(p))
    assert joint_test(sampled_first_tokens(engine_for(model, "mtp:2x2")), plain_joint).rejects


@pytest.mark.parametrize("spec", [None, "mtp:2x2", "tree:2x2"])
def test_a_seeded_request_draws_alike_alone_and_in_any_batch(model, spec):
    """Alone, and beside other requests (seeded otherwise, greedy, unseeded) in either order."""
    mine = SamplingParams(temperature=0.9, top_p=0.9, seed=42)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7]]
    alone = engine_for(model, spec).generate([prompts[0]], 12, mine)[0].output
    batch = engine_for(model, spec).generate(prompts, 12, [mine, SamplingParams(), SamplingParams(temperature=1.0)])
    assert batch[0].output == alone
    again = engine_for(model, spec).generate(prompts[::-1], 12, [SamplingParams(temperature=0.5, seed=7), SamplingParams(), mine])
    assert again[2].output == alone
    greedy = engine_for(model, spec).generate([prompts[1]], 12)[0].output
    assert batch[1].output == greedy and again[1].output == greedy  # greedy in a sampled batch: greedy's tokens


def test_static_buffers_draw_what_eager_steps_draw(model):
    """A bucket's static buffers (the CPU stand-in of a replayed CUDA graph: the same packed
    fields, padding and re-planning, kernel backend) against eager steps, MTP tree."""
    kernel = dict(backend="kernel", pool_slots=512, max_requests=4, cuda_graphs=True, capture_graphs=False,
                  graph_batch_sizes=(4,), sampling=True)
    static = engine_for(model, "mtp:2x2", **kernel)
    eager = engine_for(model, "mtp:2x2", **dict(kernel, cuda_graphs=False))
    prompts, params = [[3, 1, 4, 1, 5], [9, 2, 6]], [SamplingParams(temperature=0.9, top_p=0.9, seed=42), SamplingParams()]
    got, want = static.generate(prompts, 6, params), eager.generate(prompts, 6, params)
    assert static.runner.graphs.replays > 0 and static.runner.graphs.eager_steps == 0
    assert [r.output for r in got] == [r.output for r in want]


def test_unseeded_requests_get_distinct_seeds_from_the_engine_seed(model):
    engine = engine_for(model, seed=5)
    reqs = [engine.add_request([1, 2], 4, SamplingParams(temperature=1.0)) for _ in range(3)]
    seeds = [r.sampling.seed for r in reqs]
    assert len(set(seeds)) == 3 and all(0 <= s < 2**63 for s in seeds)
    again = engine_for(model, seed=5)
    assert seeds == [again.add_request([1, 2], 4, SamplingParams(temperature=1.0)).sampling.seed for _ in range(3)]
