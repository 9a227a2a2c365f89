"""Drafts that stay on the device: a verify step takes pending tokens (``StepBatch.device_tokens``)
into its input rows on the device and reads them back with its results, and the MTP drafter's
launched chain step hands its drafts over that way."""

from __future__ import annotations

import pytest
import torch

from serving.kv.batch import StepBatch, StepEntry
from serving.model.presets import random_model
from serving.speculation.drafters import DraftStep
from serving.speculation.tree import DraftTree, pending, pending_row
from serving.stack import ServingConfig, build_engine

PROMPTS = [[1, 2, 3, 4, 5], [9, 9], [7, 8, 9] * 6, list(range(20, 61)), [3]]
MAX_NEW = 16


@pytest.fixture(scope="module")
def model():
    return random_model("tiny", seed=3, num_nextn_predict_layers=1)


def test_pending_ids_name_source_rows():
    assert [pending_row(pending(r)) for r in range(5)] == list(range(5))
    assert all(pending(r) < 0 for r in range(5))
    with pytest.raises(ValueError, match="row >= 0"):
        pending(-1)
    tree = DraftTree([7, pending(1), pending(0)], [-1, 0, 1], torch.tensor([11, 12]))
    assert tree.has_pending and tree.read().tokens == [7, 12, 11] and not tree.read().has_pending
    assert tree.cut(2).tokens == [7, pending(1)] and tree.cut(2).source is tree.source


def _verify_step(tokens_per_entry, lengths, device_tokens=None):
    entries, slot = [], 100
    for b, (tokens, length) in enumerate(zip(tokens_per_entry, lengths)):
        t = len(tokens)
        entries.append(StepEntry(b + 1, length, list(range(slot, slot + t)), list(tokens), list(range(length, length + t)),
                                 [-1] + list(range(t - 1))))
        slot += t
    return StepBatch("verify", entries, device_tokens=device_tokens)


def test_pending_tokens_without_their_source_are_refused():
    with pytest.raises(ValueError, match="device_tokens"):
        _verify_step([[5, pending(0)]], [0])
    with pytest.raises(ValueError, match="extend"):
        StepBatch("extend", [StepEntry(0, 0, [1], [3], [0])], device_tokens=torch.tensor([1]))
    with pytest.raises(ValueError, match=r"rows of device_tokens \(0..1\), got row 2"):
        _verify_step([[5, pending(0)], [6, pending(2)]], [0, 0], torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="int64"):
        _verify_step([[5, pending(0)]], [0], torch.tensor([1, 2], dtype=torch.int32))
    _verify_step([[5, pending(1)]], [0], torch.tensor([1, 2]))  # the last row is in range


def _runner(model, backend, graph_buffers):
    pool = model.new_pool(256, torch.float32 if backend == "reference" else torch.bfloat16, max_requests=4, max_context=64)
    config = ServingConfig(backend=backend, speculate="mtp:2x3", pool_slots=pool.num_slots, cuda_graphs=graph_buffers,
                           capture_graphs=torch.cuda.is_available() and graph_buffers, graph_batch_sizes=(1, 2, 4))
    eng = build_engine(config, model, pool).engine
    for row, length in ((1, 20), (2, 9)):  # two prefixes of random slots
        slots = eng.pool.alloc(length)
        eng.pool.table.append(row, slots)
    return eng


@pytest.mark.parametrize("backend,graph_buffers", [("reference", False), ("kernel", True)])
def test_a_step_takes_its_pending_tokens_from_the_device(model, backend, graph_buffers, monkeypatch):
    """The same verify step with some tokens pending (scattered over a device tensor) computes what
    it computes with them on the host, and its entries hold their values after the run; the same
    step fed other device values computes something else (the device rows are what it reads)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    eng = _runner(model, backend, graph_buffers)
    device = eng.runner.device
    host = [[5, 17, 23, 40], [8, 2, 61]]
    want = eng.runner.run(_verify_step(host, [20, 9])).pred
    source = torch.tensor([0, 40, 99, 17, 23, 2], device=device)
    step = _verify_step([[5, pending(3), pending(4), pending(1)], [8, pending(5), 61]], [20, 9], source)
    got = eng.runner.run(step)
    assert got.pred == want
    assert [e.tokens for e in step.entries] == host
    other = torch.tensor([0, 41, 99, 18, 24, 3], device=device)
    moved = eng.runner.run(_verify_step([[5, pending(3), pending(4), pending(1)], [8, pending(5), 61]], [20, 9], other))
    assert moved.pred != want


def test_launch_refuses_an_accepting_step(model):
    eng = _runner(model, "reference", False)
    step = _verify_step([[5, 17]], [20])
    step.accept = True
    with pytest.raises(ValueError, match="accepts nothing"):
        eng.runner.launch(step)


class FutureDrafter:
    """Chains of plain greedy's next tokens (``futures``: prompt -> its whole output), every
    draft pending on the device (``on_device``) or on the host: drafts the verify step must
    accept, if its input rows hold them."""

    fused_topk = 0

    def __init__(self, futures: dict[tuple[int, ...], list[int]], depth: int, on_device: bool) -> None:
        self.futures, self.depth, self.on_device = futures, depth, on_device
        self.max_drafts = depth

    def draft_steps(self, num_layers: int) -> list[DraftStep]:
        return []

    def propose(self, ctx, requests):
        chains = [self.futures[tuple(r.prompt)][len(r.output) : len(r.output) + self.depth] for r in requests]
        if not self.on_device:
            return [DraftTree.from_paths([c]) if c else DraftTree() for c in chains]
        values, trees = [], []
        for chain in chains:
            trees.append(DraftTree([pending(len(values) + j) for j in range(len(chain))], list(range(-1, len(chain) - 1))))
            values += chain
        source = torch.tensor(values or [0], dtype=torch.long, device=ctx.runner.device)
        for tree in trees:
            tree.source = source
        return trees


@pytest.mark.parametrize("backend,graph_buffers", [("reference", False), ("kernel", True)])
def test_device_drafts_are_accepted_as_host_drafts_are(model, backend, graph_buffers, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    prompts = PROMPTS if backend == "reference" else PROMPTS[:2]

    def engine(drafter):
        pool = model.new_pool(512, torch.float32 if backend == "reference" else torch.bfloat16, max_requests=8, max_context=96)
        config = ServingConfig(backend=backend, speculate=drafter, pool_slots=pool.num_slots, cuda_graphs=graph_buffers,
                               capture_graphs=False, graph_batch_sizes=(1, 2, 8))
        return build_engine(config, model, pool).engine

    plain = engine(None).generate(prompts, MAX_NEW)
    futures = {tuple(p): r.output for p, r in zip(prompts, plain)}
    runs = {}
    for on_device in (False, True):
        eng = engine(FutureDrafter(futures, 3, on_device))
        reqs = eng.generate(prompts, MAX_NEW)
        assert [r.output for r in reqs] == [r.output for r in plain]
        assert eng.pool.leaked_slots() == 0
        runs[on_device] = (eng.stats.accepted_drafts, eng.stats.steps)
    assert runs[True] == runs[False]
    assert runs[True][0] >= len(prompts) * (MAX_NEW // 4)  # every chain accepted while the future lasts


def _chain_drafts_reach_the_verify_step(model, spec, prompts, max_new, captured):
    """The MTP chain step replayed from a bucket (captured, or its static buffers run eagerly) and
    not read, the verify step gathering its drafts: every verify step's drafts are the chain
    step's outputs (read here at proposal, a sync the engine does not make), and the output is
    plain greedy's."""

    def engine(spec):
        pool = model.new_pool(2048, torch.bfloat16, max_requests=8, max_context=256)
        config = ServingConfig(backend="kernel", speculate=spec, pool_slots=pool.num_slots, cuda_graphs=True,
                               capture_graphs=captured, graph_batch_sizes=(1, 2, 8))
        return build_engine(config, model, pool).engine

    plain = engine(None).generate(prompts, max_new)
    eng = engine(spec)
    drafted, propose = [], eng.drafter.propose

    def recording(ctx, requests):
        trees = propose(ctx, requests)
        assert all(t.has_pending for t in trees)
        drafted.append([t.read().tokens for t in trees])
        return trees

    eng.drafter.propose = recording
    verified, run = [], eng.runner.run

    def recording_run(step, then=None):
        result = run(step, then=then)
        if step.kind == "verify" and step.accept:
            verified.append([e.tokens[1:] for e in step.entries])
        return result

    eng.runner.run = recording_run
    reqs = eng.generate(prompts, max_new)
    assert [r.output for r in reqs] == [r.output for r in plain]
    graphs = eng.runner.graphs
    assert graphs.replays > 0 and graphs.eager_steps == 0
    assert "mtp-chain" in {k.family.name for k in graphs.graphs}
    assert drafted and drafted == verified
    assert not any(t < 0 for tree in drafted for tokens in tree for t in tokens)
    assert eng.pool.leaked_slots() == 0


def test_chain_drafts_reach_the_verify_step_through_graph_buffers(model, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _chain_drafts_reach_the_verify_step(model, "mtp:2x3", PROMPTS[:2], 6, captured=False)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["mtp:2x3", "mtp:4x3"])
def test_captured_chain_drafts_reach_the_verify_step(spec):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    gpu = random_model("tiny", device="cuda", dtype=torch.bfloat16, seed=3, num_nextn_predict_layers=1)
    # Two requests: up to 8 chains, each draft step in the 8-row bucket (a 32-row bucket's device
    # plan does not compile with this Triton: docs/campaign.md, "Noticed").
    _chain_drafts_reach_the_verify_step(gpu, spec, PROMPTS[:2], MAX_NEW, captured=True)
