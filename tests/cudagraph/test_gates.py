"""Phase cudagraph's gates: their plumbing on the CPU (static steps without capture) and small
GPU profiles."""

from __future__ import annotations

import pytest
import torch

from phases.cudagraph import decode_speed, overhead, verify

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")

TINY_GREEDY = dict(prompts=2, max_new_tokens=4, contexts=[8, 24], preset="tiny", speculate="tree:2x2")


def test_replay_gate_cpu_profile_passes():
    m = verify.run(batch_sizes=[1, 2], rounds=2, preset="tiny", max_context=200, pool_slots=3000, greedy=TINY_GREEDY,
                   device="cpu")
    assert m["uncaptured_batch_sizes"] == 0 and m["replays_checked"] == 2 * 2 * 2
    for key in ("replay_mismatches", "stale_plans", "unpadded_mismatches", "host_syncs_in_replay", "padding_corrupted_rows",
                "mismatched_tokens", "leaked_slots", "requests_failed"):
        assert m[key] == 0, key


def test_replay_gate_catches_a_stale_plan(monkeypatch):
    """A replay that keeps the capture-time plan instead of re-planning the new lengths."""
    from serving.engine.attention import KernelBackend

    monkeypatch.setattr(KernelBackend, "init_forward_metadata_replay_cuda_graph",
                        lambda self, key, batch: setattr(self, "_active", self._graph_wrappers[key]))
    m = verify.run(batch_sizes=[2], rounds=2, preset="tiny", max_context=200, pool_slots=3000,
                   greedy=dict(TINY_GREEDY, prompts=1, contexts=[8]), device="cpu")
    assert m["stale_plans"] > 0 and m["unpadded_mismatches"] > 0


def test_decode_speed_plumbing_on_cpu():
    m = decode_speed.run(contexts=[20], batch_sizes=[1], preset="tiny", tree="1x2", warmup=0, steps=1, device="cpu")
    for key in ("decode_speedup_0k", "attention_share_0k", "verify_step_ms_kernel_0k", "decode_tps_reference_0k",
                "decode_tps_kernel_eager_0k"):
        assert m[key] > 0
    assert m["leaked_slots"] == 0


def test_overhead_plumbing_on_cpu():
    m = overhead.run(contexts=[24], preset="tiny", warmup=0, steps=2, device="cpu")
    assert m["eager_step_ms_0k"] > 0 and m["replay_speedup_0k"] > 0


@gpu
@needs_cuda
def test_replay_gate_small_gpu_profile():
    m = verify.run(batch_sizes=[1, 4, 16], rounds=3, max_context=65536, pool_slots=400_000,
                   greedy=dict(prompts=4, max_new_tokens=32, contexts=[4096]))
    for key in ("uncaptured_batch_sizes", "replay_mismatches", "unpadded_mismatches", "host_syncs_in_replay",
                "padding_corrupted_rows", "mismatched_tokens", "leaked_slots"):
        assert m[key] == 0, (key, m)
