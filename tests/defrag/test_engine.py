"""Compaction between engine steps: tree speculation stays token-exact, the pool stays
consistent after every step, and a step replayed from static buffers (the CUDA-graph path,
run eagerly on the CPU) gives bitwise the same outputs after its rows moved."""

from __future__ import annotations

import random

import pytest
import torch

from serving.defrag import Defragmenter, DefragPolicy
from serving.defrag.measure import count_runs
from serving.kv.batch import PackedStep, StepBatch, StepEntry, StepLayout, StepShape
from serving.model.presets import random_model
from serving.stack import ServingConfig, build_engine

PROMPTS = [[1, 2, 3, 4, 5] * 7, [9, 9] * 15, list(range(20, 51))]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def model():
    return random_model("tiny", seed=3)


@pytest.fixture(scope="module")
def uncompacted(model):
    """Each speculation's outputs without compaction."""
    return {spec: [r.output for r in make_engine(model, spec).generate(PROMPTS, NEW_TOKENS)]
            for spec in ("tree:2x2", "ngram:2x4")}


def make_engine(model, spec="tree:2x2", backend="reference", slots=1024, dtype=torch.float32, hooks=(), **config):
    pool = model.new_pool(slots, dtype)
    return build_engine(ServingConfig(backend=backend, speculate=spec, pool_slots=slots, **config), model, pool, hooks).engine


class LateChecks:
    """A between-steps hook whose checker needs the engine's pool, made after the engine."""

    def __init__(self, make):
        self.make, self.checks = make, None

    def __call__(self, engine):
        if self.checks is None:
            self.checks = self.make(engine.pool)
        self.checks(engine)


class PoolChecks:
    """A between-steps hook around a defragmenter: every live row is where the table says,
    byte for byte across the compaction, and the bookkeeping is consistent after every step."""

    def __init__(self, defrag: Defragmenter, rng: random.Random | None = None) -> None:
        self.defrag, self.rng, self.steps, self.compactions = defrag, rng, 0, 0

    def __call__(self, engine) -> None:
        pool, t = engine.pool, engine.pool.table
        rows = {r: pool.kv[:, t.slots(r)].clone() for r in t.requests()}
        if self.rng is None:
            self.defrag(engine)
        elif self.rng.random() < 0.4:  # compaction at random steps, all of it now
            self.compactions += self.defrag.compact() > 0
        self.steps += 1
        for r in t.requests():
            assert torch.equal(pool.kv[:, t.slots(r)], rows[r]), f"request {r}'s rows changed"
            assert t.device_slots(r).tolist() == t.slots(r)
        owned = [s for r in t.requests() for s in t.slots(r)]
        assert len(owned) == len(set(owned))
        assert pool.leaked_slots() == self.defrag.reserved_slots


@pytest.mark.parametrize("spec", ["tree:2x2", "ngram:2x4"])
def test_speculation_with_compaction_at_random_steps_is_token_exact(model, uncompacted, spec):
    late = LateChecks(lambda pool: PoolChecks(Defragmenter(pool), random.Random(0)))
    eng = make_engine(model, spec, hooks=[late])
    reqs = eng.generate(PROMPTS, NEW_TOKENS)
    checks = late.checks
    assert [r.output for r in reqs] == uncompacted[spec] and all(r.error is None for r in reqs)
    assert checks.compactions > 0 and checks.defrag.stats.moved_rows > 0
    assert eng.pool.leaked_slots() == 0 and eng.pool.allocator.num_free == eng.pool.allocator.capacity


def test_incremental_compaction_under_a_tight_budget_is_token_exact(model, uncompacted):
    policy = DefragPolicy(threshold=0, min_tokens=1, min_runs=2, max_moves=5, min_reserve=2)
    late = LateChecks(lambda pool: PoolChecks(Defragmenter(pool, policy)))
    eng = make_engine(model, "ngram:2x4", hooks=[late])
    reqs = eng.generate(PROMPTS, NEW_TOKENS)
    checks = late.checks
    assert [r.output for r in reqs] == uncompacted["ngram:2x4"]
    s = checks.defrag.stats
    assert s.compactions > 1 and s.steps_moving > s.compactions  # compactions spanned several steps
    assert eng.pool.leaked_slots() == 0


def verify_step(engine, requests, width=3):
    """A verify step of a ``width``-token chain per request over freshly allocated tail slots."""
    table, entries = engine.pool.table, []
    for req in requests:
        base = table.length(req.req_id)
        tail = engine.pool.alloc(width)
        entries.append(StepEntry(table.row(req.req_id), base, tail, [req.tokens[-1]] + [5, 6][: width - 1],
                                 [base + d for d in range(width)], [-1] + list(range(width - 1))))
    return StepBatch("verify", entries)


@pytest.mark.parametrize("backend, dtype", [("reference", torch.float32), ("kernel", torch.bfloat16)])
def test_a_step_from_static_buffers_is_bitwise_equal_after_compaction(model, backend, dtype):
    """A captured step's recipe, run eagerly: a bucket's static packed buffers and kv_indices,
    the backend's graph metadata (planned for the bucket at capture, re-planned per replay);
    kv_indices come from the slot table, so after rows move the same buffers read the new slots."""
    eng = make_engine(model, spec=None, backend=backend, slots=400, dtype=dtype)
    reqs = [eng.add_request(p[:12], 100) for p in PROMPTS[:2]]
    for r in reqs:
        eng.prefill(r)
    for _ in range(3):  # decode steps interleave the requests' slots
        eng.step(reqs)
    assert any(count_runs(eng.pool.table.slots(r.req_id)) > 1 for r in reqs)
    step = verify_step(eng, reqs)
    layout = StepLayout(batch=4, tokens=16, tails=16, mask=64, width=4, kv=1024)  # a bucket, larger than the step
    packed = PackedStep.allocate(layout, pin=False)
    device_buffer = packed.host.clone()
    kv_indices = torch.zeros(layout.kv, dtype=torch.int32)
    shape = StepShape.of(step, width=layout.width)
    graphs = eng.backend.supports_cuda_graph
    if graphs:
        eng.backend.init_cuda_graph_state(layout.batch, layout.tokens)

    def replay(first: bool):
        batch = eng.runner.prepare(step, packed, device_buffer, kv_indices)
        if not graphs:
            eng.backend.init_forward_metadata(batch)
        elif first:
            eng.backend.init_forward_metadata_capture_cuda_graph("bucket", layout.batch, layout.width, batch)
        else:
            eng.backend.init_forward_metadata_replay_cuda_graph("bucket", batch)
        ints, gap = eng.runner.forward_step(batch, shape)
        return ints.clone(), gap.clone(), kv_indices.clone()

    before = replay(first=True)
    moved = Defragmenter(eng.pool).compact()
    assert moved > 0 and all(count_runs(eng.pool.table.slots(r.req_id)) == 1 for r in reqs)
    after = replay(first=False)
    assert not torch.equal(before[2], after[2])  # the same buffer now names the new slots
    n, rows = step.num_tokens, layout.tokens  # ints: pred [rows] then near-tie flags [rows]; padded rows are garbage
    for got in (after, before):
        assert torch.equal(before[0][:n], got[0][:n]) and torch.equal(before[0][rows : rows + n], got[0][rows : rows + n])
    assert torch.equal(before[1][:n], after[1][:n])


def test_the_builder_installs_the_hook_and_idle_engines_hold_no_reservation(model):
    pool = model.new_pool(1024, torch.float32)
    config = ServingConfig(backend="reference", speculate="tree:2x2", pool_slots=1024, defrag="on",
                           defrag_policy=DefragPolicy(threshold=0, min_tokens=1, min_runs=2, max_moves=1))
    stack = build_engine(config, model, pool)
    eng, defrag = stack.engine, stack.defrag
    assert eng.between_steps == (defrag,) and defrag.enabled
    eng.generate(PROMPTS[:2], 8)
    assert defrag.active is None and eng.pool.leaked_slots() == 0
    summary = defrag.summary()
    assert summary["checks"] > 0 and summary["fragmentation"]["requests"] == 0
