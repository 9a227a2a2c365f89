"""The defrag gates: their CPU profiles pass and report every metric the plan checks; small
GPU profiles, the Triton row copy and a captured step replayed across a compaction on a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from phases.defrag import integrity, speed
from serving.defrag import Compaction, Defragmenter, plan_compaction
from serving.defrag.executor import copy_rows_direct
from tests.sampled_gates import assert_samples

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
PLAN = Path(__file__).resolve().parents[2] / "plans" / "0002-mla-verify-kernel-defrag.md"


def expected_metrics(gate: str) -> set[str]:
    """The metric names the plan's ``gate`` of phase defrag checks."""
    text = PLAN.read_text()
    block = text[text.index("  - id: defrag") :]
    block = block[block.index(f"- name: {gate}") :]
    block = block[: block.index("expect:") + 400].split("expect:")[1]
    return set(re.findall(r"^\s+(\w+): \"", block, flags=re.M)[:3])


def test_integrity_cpu_profile_passes_and_reports_the_plan_metrics():
    m = integrity.run(**dict(integrity.CPU_PROFILE, rounds=2, planner_pools=20))
    assert expected_metrics("integrity") <= set(m)
    assert m["corrupted_rows"] == 0 and m["leaked_slots"] == 0 and m["output_mismatches"] == 0
    assert m["attention_checks"] > 0 and m["moved_rows"] > 0 and m["tokens_compared"] > 0
    assert m["engine_moved_rows"] > 0 and m["planner_violations"] == 0


def test_speed_cpu_profile_reports_the_plan_metrics_as_samples():
    m = speed.run(**dict(speed.CPU_PROFILE, contexts=(48,), shapes=((16, 1),), decode_batches=(), reps=1,
                             samples=6))
    assert expected_metrics("speed") <= set(m)
    assert m["output_mismatches"] == 0 and m["compaction_rows_intact"] == 1
    assert m["runs_per_1k_after"] < m["runs_per_1k_before"] and m["plan_moves"] >= m["plan_lower_bound"]
    rates = assert_samples(m, "compaction_GBps", 6)  # one per compaction of a pool scattered again
    assert_samples(m, "contiguous_speedup_128k", 6)
    assert_samples(m, "contiguous_speedup_nofast_128k", 6)
    # the other figures are those of one compaction, the one of the (lower) median rate
    assert m["compaction_bytes"] / (m["compaction_device_ms"] / 1e3) / 1e9 == pytest.approx(sorted(rates)[2])


def test_contiguous_speedup_is_the_geometric_mean_over_the_rows_per_round():
    rows = [dict(name="a", context=131072, batch=1, heads=16, draft=1, speedup=2.0, speedup_nofast=1.0, saving_us=1.0,
                 speedup_rounds=[1.0, 4.0, 2.0], speedup_nofast_rounds=[1.0, 1.0, 1.0], fragmented_us=2.0,
                 compacted_us=2.0, compacted_fast_us=1.0, bitwise_equal=True),
            dict(name="b", context=131072, batch=1, heads=128, draft=8, speedup=2.0, speedup_nofast=1.0, saving_us=1.0,
                 speedup_rounds=[4.0, 1.0, 2.0], speedup_nofast_rounds=[1.0, 4.0, 1.0], fragmented_us=2.0,
                 compacted_us=2.0, compacted_fast_us=1.0, bitwise_equal=True),
            dict(name="kv_indices build", context=131072, build_us=5.0, index_bytes=4 * 131072)]
    out = speed.summarize(rows, {"compaction_GBps": [900.0, 1000.0, 1100.0]})
    assert out["contiguous_speedup_128k"] == pytest.approx([2.0, 2.0, 2.0])
    assert out["contiguous_speedup_nofast_128k"] == pytest.approx([1.0, 2.0, 1.0])
    assert out["compaction_us_per_layer_128k"] == pytest.approx(2 * 131072 * 576 * 2 / 1000e9 * 1e6)  # the median rate


def test_the_plan_gates_name_these_callables():
    text = PLAN.read_text()
    assert "call: phases.defrag.integrity:run" in text and "call: phases.defrag.speed:run" in text


@gpu
@needs_cuda
def test_triton_row_copy_on_the_gpu():
    kv = torch.randn(61, 4096, 576, device="cuda").to(torch.bfloat16)
    expect = kv.clone()
    perm = torch.randperm(4095, device="cuda")[:2000] + 1
    src, dst = perm[:1000], perm[1000:]
    copy_rows_direct(kv, src, dst)
    expect[:, dst] = expect[:, src]
    assert torch.equal(kv.view(torch.int16), expect.view(torch.int16))


@gpu
@needs_cuda
def test_small_gpu_profiles_of_both_gates():
    m = integrity.run(requests=32, rounds=4, context=(16, 2048), attention_every=2, attention_requests=16,
                   engine_prompts=2, engine_context=64, engine_tokens=8, preset="tiny", speculate="tree:2x2",
                   planner_pools=20)
    assert m["corrupted_rows"] == 0 and m["leaked_slots"] == 0 and m["output_mismatches"] == 0
    assert m["attention_checks"] > 0
    s = speed.run(layers=4, pool_slots=50_000, requests=8, contexts=(16384,), decode_batches=(16,), reps=5, samples=6)
    assert s["output_mismatches"] == 0 and s["compaction_rows_intact"] == 1
    assert_samples(s, "compaction_GBps", 6)
    assert_samples(s, "contiguous_speedup_128k", 6)


@gpu
@needs_cuda
def test_a_captured_verify_step_replays_bitwise_equal_after_compaction():
    """STYLE's graph recipe: warm up on a side stream, capture the device half of a verify step
    (kv_indices built from the slot table, the kernel, the model), compact the pool between
    replays, refresh the static buffers and the plan, poison the outputs, replay, compare."""
    from serving.kv.batch import PackedStep, StepBatch, StepEntry, StepLayout, StepShape
    from serving.model.presets import random_model
    from serving.stack import ServingConfig, build_engine

    dev = torch.device("cuda")
    model = random_model("gpu-h16", dev, torch.bfloat16, seed=0)
    pool = model.new_pool(8192, torch.bfloat16)
    eng = build_engine(ServingConfig(backend="kernel", pool_slots=pool.num_slots), model, pool).engine
    gen = torch.Generator().manual_seed(0)
    reqs = [eng.add_request(torch.randint(0, model.cfg.vocab_size, (300,), generator=gen).tolist(), 100) for _ in range(3)]
    for r in reqs:
        eng.prefill(r)
    for _ in range(8):
        eng.step(reqs)
    table, entries = pool.table, []
    for req in reqs:
        base = table.length(req.req_id)
        entries.append(StepEntry(table.row(req.req_id), base, pool.alloc(4), [req.tokens[-1], 5, 6, 7],
                                 [base, base + 1, base + 2, base + 1], [-1, 0, 1, 0]))
    step = StepBatch("verify", entries)
    layout = StepLayout(batch=4, tokens=16, tails=16, mask=64, width=4, kv=4096)
    packed = PackedStep.allocate(layout, pin=True)
    device_buffer = packed.host.to(dev)
    kv_indices = torch.zeros(layout.kv, dtype=torch.int32, device=dev)
    shape = StepShape.of(step, width=layout.width)
    eng.backend.init_cuda_graph_state(layout.batch, layout.tokens)
    batch = eng.runner.prepare(step, packed, device_buffer, kv_indices)
    eng.backend.init_forward_metadata_capture_cuda_graph("bucket", layout.batch, layout.width, batch)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eng.runner.forward_step(batch, shape)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ints, gap = eng.runner.forward_step(batch, shape)
    graph.replay()
    torch.cuda.synchronize()
    before = (ints.clone(), gap.clone(), kv_indices.clone())
    assert Defragmenter(pool).compact() > 0
    batch = eng.runner.prepare(step, packed, device_buffer, kv_indices)
    eng.backend.init_forward_metadata_replay_cuda_graph("bucket", batch)
    ints.fill_(-1)
    gap.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    n, rows = step.num_tokens, layout.tokens
    assert not torch.equal(before[2], kv_indices)  # the replay read the renamed slots
    assert torch.equal(before[0][:n], ints[:n]) and torch.equal(before[0][rows : rows + n], ints[rows : rows + n])
    assert torch.equal(before[1][:n], gap[:n])


@gpu
@needs_cuda
def test_compaction_on_a_cuda_pool_with_events():
    from tests.defrag.pools import churn_pool

    pool = churn_pool(3000, 2000, 1, layers=4, row_dim=576, dtype=torch.bfloat16)
    pool.kv = pool.kv.cuda()
    pool.table.rows = pool.table.rows.cuda()
    pool.table.device = pool.kv.device
    rows = {r: pool.kv[:, pool.table.slots(r)].clone() for r in pool.table.requests()}
    t = pool.table
    plan = plan_compaction({r: t.slots(r) for r in t.requests()}, pool.allocator.free_slots(), pool.num_slots)
    c = Compaction(pool, plan, events=True)
    c.run(97)
    assert c.device_seconds() > 0 and pool.leaked_slots() == 0
    for r in t.requests():
        assert torch.equal(pool.kv[:, t.slots(r)], rows[r])
        assert t.device_slots(r).tolist() == t.slots(r)


@gpu
@needs_cuda
def test_compaction_through_a_row_mover_graph():
    """Pieces that fit the mover go through its graph replay (count and indices uploaded per
    piece), the others through launches; every request's rows and slots end where they should."""
    from serving.defrag.executor import RowMover
    from tests.defrag.pools import churn_pool

    pool = churn_pool(3000, 2000, 4, layers=3, row_dim=576, dtype=torch.bfloat16)
    pool.kv = pool.kv.cuda()
    pool.table.rows, pool.table.device = pool.table.rows.cuda(), pool.kv.device
    rows = {r: pool.kv[:, pool.table.slots(r)].clone() for r in pool.table.requests()}
    t = pool.table
    mover = RowMover(pool.kv, 40)
    assert mover.capacity == 48
    with pytest.raises(ValueError, match="at most 48"):
        mover.load(np.arange(1, 50), np.arange(100, 149))
    plan = plan_compaction({r: t.slots(r) for r in t.requests()}, pool.allocator.free_slots(), pool.num_slots)
    c = Compaction(pool, plan, mover=mover, events=True)
    for moves in (48, 7, 60, 1, 48):  # fits, small, too big for the mover, one, fits again
        c.step(moves)
    c.run(40)
    assert c.device_seconds() > 0 and pool.leaked_slots() == 0 and c.stats.applied == plan.num_moves
    assert 0 < c.stats.replayed <= c.stats.pieces  # the mover copied pieces (not only the launches)
    for r in t.requests():
        assert torch.equal(pool.kv[:, t.slots(r)], rows[r])
        assert t.device_slots(r).tolist() == t.slots(r)
    with pytest.raises(ValueError, match="this pool"):
        Compaction(pool, plan, mover=RowMover(pool.kv.clone(), 16))


@gpu
@needs_cuda
def test_compaction_refuses_to_run_under_a_graph_capture():
    from tests.defrag.pools import churn_pool

    pool = churn_pool(200, 150, 2)
    pool.kv = pool.kv.cuda()
    pool.table.rows, pool.table.device = pool.table.rows.cuda(), pool.kv.device
    t = pool.table
    plan = plan_compaction({r: t.slots(r) for r in t.requests()}, pool.allocator.free_slots(), pool.num_slots)
    c = Compaction(pool, plan)
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(side), pytest.raises(RuntimeError, match="graph capture in progress"):
        with torch.cuda.graph(graph):
            c.step(1)
    assert c.next == 0
    c.run()
    assert pool.leaked_slots() == 0
