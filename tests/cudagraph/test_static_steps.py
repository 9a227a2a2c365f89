"""Graph steps on the CPU: everything but the capture (static buffers, bucket choice, padding,
re-planning into each bucket's workspace) against the eager engine, under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from serving.graphs import families_for
from serving.graphs.buckets import GraphKey, key_for, keys_for, placeholder_step
from serving.kv.batch import StepBatch, StepEntry
from serving.model.presets import random_model
from serving.speculation.drafters import parse_speculate
from serving.stack import ServingConfig, build_engine

PROMPTS = [[5, 17, 99, 3, 42, 8, 8, 1], [7], [100, 101, 102, 100, 101, 102, 100]]


@pytest.fixture(scope="module")
def model():
    return random_model("tiny", "cpu", torch.float32, seed=3)


def engine(model, spec, static: bool, batch_sizes=(1, 2, 8)):
    pool = model.new_pool(512, torch.bfloat16, max_requests=8, max_context=64)
    config = ServingConfig(backend="kernel", speculate=spec, pool_slots=pool.num_slots, cuda_graphs=static,
                           graph_batch_sizes=tuple(batch_sizes), capture_graphs=False)
    stack = build_engine(config, model, pool)
    return stack.engine, stack.capture_report


@pytest.mark.parametrize("spec", [None, "tree:2x2", "ngram:2x2"])
def test_static_bucket_steps_decode_what_eager_steps_decode(model, spec):
    eager, _ = engine(model, spec, static=False)
    static, report = engine(model, spec, static=True)
    want = eager.generate(PROMPTS, 6)
    got = static.generate(PROMPTS, 6)
    assert [r.output for r in got] == [r.output for r in want]
    assert all(r.error is None for r in got)
    graphs = static.runner.graphs
    assert graphs.replays > 0 and graphs.eager_steps == 0, "every step fits a bucket"
    assert len(report.per_key) == 3 * len(families_for(static.drafter, model.num_layers))
    assert static.pool.leaked_slots() == 0 and static.pool.allocator.num_free == static.pool.allocator.capacity
    assert static.pool.table.rows[0].eq(0).all(), "the padding row stays zeros"


def test_a_batch_past_the_largest_bucket_runs_eagerly(model):
    static, _ = engine(model, None, static=True, batch_sizes=(1, 2))
    eager, _ = engine(model, None, static=False)
    got = static.generate(PROMPTS, 3)
    assert [r.output for r in got] == [r.output for r in eager.generate(PROMPTS, 3)]
    assert static.runner.graphs.eager_steps > 0


def test_bucket_choice_and_layout_bounds():
    families = families_for(parse_speculate("tree:4x4:layers=1"), 4)
    assert [f.name for f in families] == ["decode", "verify", "draft-first", "draft"]
    assert families[1].shape.width == 17 and families[3].copies == 4 and families[3].tail == 4
    keys = keys_for(families, (1, 2, 4, 8))
    assert keys[0].batch * keys[0].family.shape.width == max(k.batch * k.family.shape.width for k in keys)
    step = StepBatch("decode", [StepEntry(1, 10, [3], [1], [10], None) for _ in range(3)], accept=True)
    layouts = [(k, k.layout(100, 50)) for k in keys]
    key = key_for(step, layouts)
    assert key == GraphKey(families[0], 4)
    layout = key.layout(100, 50)
    assert layout.kv == min(4 * 50, 100) + 4 and layout.tokens == 4
    wide = StepBatch("decode", [StepEntry(1, 10, [3], [1], [10]) for _ in range(9)], accept=True)
    assert key_for(wide, layouts) is None
    other = StepBatch("decode", [StepEntry(1, 10, [3], [1], [10])], num_layers=1, topk=4)
    assert key_for(other, layouts).family.name == "draft-first"
    holder = placeholder_step(GraphKey(families[1], 2))
    assert holder.batch_size == 2 and holder.max_tokens == 17 and all(e.row == 0 and set(e.tail) == {0} for e in holder.entries)
