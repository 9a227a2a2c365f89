"""Phase cudagraph's gates: their plumbing on the CPU (static steps without capture) and small
GPU profiles."""

from __future__ import annotations

import pytest
import torch

from phases.cudagraph import decode_speed, overhead, replay
from tests.sampled_gates import assert_samples

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")

TINY_GREEDY = dict(prompts=2, max_new_tokens=4, contexts=[8, 24], preset="tiny", speculate="tree:2x2")


def host_planned_replays(monkeypatch) -> None:
    """Every graph re-planned on the host before its replay, none planning on the device."""
    from kernel import MLAVerifyWrapper

    monkeypatch.setattr(MLAVerifyWrapper, "plans_on_device", property(lambda self: False))


@pytest.mark.parametrize("planning", ["device", "host"])
def test_replay_gate_cpu_profile_passes(monkeypatch, planning):
    if planning == "host":
        host_planned_replays(monkeypatch)
    m = replay.run(batch_sizes=[1, 2], rounds=2, preset="tiny", max_context=200, pool_slots=3000, greedy=TINY_GREEDY,
                   device="cpu")
    assert m["uncaptured_batch_sizes"] == 0 and m["replays_checked"] == 2 * 2 * 2
    for key in ("replay_mismatches", "stale_plans", "unpadded_mismatches", "host_syncs_in_replay", "padding_corrupted_rows",
                "mismatched_tokens", "leaked_slots", "requests_failed"):
        assert m[key] == 0, key


@pytest.mark.parametrize("planted", ["host keeps the capture plan", "graph plans nothing", "graph plans a key short"])
def test_replay_gate_catches_a_stale_plan(monkeypatch, planted):
    """A replay that runs the capture-time plan, or a plan of other lengths, instead of one made
    for the new lengths: on the host, or inside the graph (``kernel.device_plan``)."""
    from kernel import MLAVerifyWrapper
    from serving.attention.backends import KernelBackend

    if planted == "host keeps the capture plan":
        host_planned_replays(monkeypatch)
        monkeypatch.setattr(KernelBackend, "init_forward_metadata_replay_cuda_graph",
                            lambda self, key, batch: setattr(self, "_active", self._graph_wrappers[key]))
    elif planted == "graph plans nothing":
        monkeypatch.setattr(KernelBackend, "init_forward_metadata_in_step", lambda self, batch: None)
    else:
        original = MLAVerifyWrapper.plan_on_device

        def short(self, qo_indptr, kv_indptr):
            cut = kv_indptr.clone()
            cut[1:] -= 1  # the first request one key short, the others as long as they are
            original(self, qo_indptr, cut)

        monkeypatch.setattr(MLAVerifyWrapper, "plan_on_device", short)
    m = replay.run(batch_sizes=[2], rounds=2, preset="tiny", max_context=200, pool_slots=3000,
                   greedy=dict(TINY_GREEDY, prompts=1, contexts=[8]), device="cpu")
    assert m["stale_plans"] > 0 and m["unpadded_mismatches"] > 0


def test_decode_speed_plumbing_on_cpu_reports_its_ratios_as_one_sample_per_round():
    m = decode_speed.run(contexts=[20], batch_sizes=[1], preset="tiny", tree="1x2", warmup=0, steps=1, samples=7,
                         device="cpu")
    for key in ("verify_step_ms_kernel_0k", "decode_tps_reference_0k", "decode_tps_kernel_eager_0k"):
        assert m[key] > 0
    assert m["leaked_slots"] == 0
    speedup = assert_samples(m, "decode_speedup_0k", 7)
    assert_samples(m, "decode_speedup_eager_0k", 7)
    assert all(share <= 1 for share in assert_samples(m, "attention_share_0k", 7))
    assert "device_share_0k" not in m and "decode_speedup_device_0k" not in m  # no graph to replay alone on a CPU
    # tokens/s are medians over the rounds (an odd count: some round's ratio is on either side)
    assert min(speedup) <= m["decode_tps_kernel_0k"] / m["decode_tps_reference_0k"] <= max(speedup)


def test_overhead_plumbing_on_cpu():
    m = overhead.run(contexts=[24], preset="tiny", warmup=0, steps=2, samples=6, device="cpu")
    assert m["eager_step_ms_0k"] > 0 and m["graph_step_ms_0k"] > 0
    speedup = assert_samples(m, "replay_speedup_0k", 6)
    slowdown = assert_samples(m, "replay_slowdown_0k", 6, low=-1.0)
    assert slowdown == pytest.approx([1 / s - 1 for s in speedup])


def test_overhead_interleaves_eager_and_replayed_rounds(monkeypatch):
    """Each round times both engines, in alternating order, so drift lands on both sides."""
    seen = []
    original = decode_speed.measure_round

    def recording(engine, requests, steps, captured):
        seen.append(engine)
        return original(engine, requests, steps, captured)

    monkeypatch.setattr(decode_speed, "measure_round", recording)
    m = overhead.run(contexts=[24], preset="tiny", warmup=0, steps=1, samples=4, device="cpu")
    assert len(m["replay_speedup_0k"]) == 4 and len(seen) == 8
    first, second = seen[0], seen[1]
    assert first is not second and seen == [first, second, second, first, first, second, second, first]


@gpu
@needs_cuda
def test_replay_gate_small_gpu_profile():
    m = replay.run(batch_sizes=[1, 4, 16], rounds=3, max_context=65536, pool_slots=400_000,
                   greedy=dict(prompts=4, max_new_tokens=32, contexts=[4096]))
    for key in ("uncaptured_batch_sizes", "replay_mismatches", "unpadded_mismatches", "host_syncs_in_replay",
                "padding_corrupted_rows", "mismatched_tokens", "leaked_slots"):
        assert m[key] == 0, (key, m)


@gpu
@needs_cuda
def test_sampled_benchmark_gates_small_gpu_profiles():
    m = overhead.run(contexts=[4096], steps=5, samples=6, first_request={"skip": True})
    assert_samples(m, "replay_speedup_4k", 6)
    assert_samples(m, "replay_slowdown_4k", 6, low=-1.0)
    d = decode_speed.run(contexts=[4096], batch_sizes=[1], steps=3, samples=6)
    speedup = assert_samples(d, "decode_speedup_4k", 6)
    assert all(share <= 1 for share in assert_samples(d, "attention_share_4k", 6))
    # the graph alone is the device's part of a step: at most the step, so its ratio is at least the step's
    device_share = assert_samples(d, "device_share_4k", 6)
    assert all(share <= 1.05 for share in device_share), device_share
    device_speedup = assert_samples(d, "decode_speedup_device_4k", 6)
    assert all(dev >= 0.95 * step for dev, step in zip(device_speedup, speedup)), (device_speedup, speedup)
    assert d["leaked_slots"] == 0
