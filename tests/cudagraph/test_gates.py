"""Phase cudagraph's gates: their plumbing on the CPU (static steps without capture) and small
GPU profiles."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

from phases.cudagraph import decode_speed, overhead, streaming, verify
from tests.sampled_gates import assert_samples, plan_gate, planted

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


def test_decode_speed_plumbing_on_cpu_reports_its_ratios_as_one_sample_per_round():
    m = decode_speed.run(contexts=[20], batch_sizes=[1], preset="tiny", tree="1x2", warmup=0, steps=1, samples=7,
                         device="cpu")
    for key in ("verify_step_ms_kernel_0k", "decode_tps_reference_0k", "decode_tps_kernel_eager_0k"):
        assert m[key] > 0
    assert m["leaked_slots"] == 0
    speedup = assert_samples(m, "decode_speedup_0k", 7)
    assert_samples(m, "decode_speedup_eager_0k", 7)
    assert all(share <= 1 for share in assert_samples(m, "attention_share_0k", 7))
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


TINY_END_TO_END = dict(preset="tiny", contexts=[24, 40], batch=2, batch_context=24, warmup=0, steps=1, samples=2,
                       trace_steps=1, replays=1, prefill_chunk=16, warm_prompt=8, copy_mib=1, device="cpu")


def test_end_to_end_plumbing_on_cpu_reports_fractions_as_samples_and_the_profilers_tables(monkeypatch, tmp_path):
    from runner.protocol import ARTIFACTS_ENV

    monkeypatch.setenv(ARTIFACTS_ENV, str(tmp_path))
    m = streaming.run(**TINY_END_TO_END)
    for name in ("24", "40", "b2_24"):
        fracs = assert_samples(m, f"frac_streaming_limit_{name}", 2)
        assert all(f < 1 for f in fracs)  # a CPU step is far from a GPU's streaming limit
        assert m[f"decode_tps_{name}"] > 0 and m[f"step_ms_{name}"] > 0 and m[f"limit_ms_{name}"] > 0
        assert m[f"kernels_per_step_{name}"] > 0 and m[f"replay_ms_{name}"] > 0  # static buffers, not captured
    assert m["ttft_24_s"] > 0 and m["ttft_40_s"] > 0 and "ttft_b2_24_s" not in m
    assert m["copy_GBps"] > 0 and m["leaked_slots"] == 0
    assert m["limit_ms_b2_24"] > m["limit_ms_24"]  # twice the rows to read
    report = (tmp_path / "end_to_end_profile.md").read_text()
    assert [line for line in report.splitlines() if line.startswith("### ")] == [
        "### 24: B=1, 24 cached rows", "### b2_24: B=2, 24 cached rows", "### 40: B=1, 40 cached rows"]
    assert "| class | kernels/step | GPU µs/step |" in report
    assert "| frac_streaming_limit_24 |" in (tmp_path / "end_to_end.md").read_text()


@pytest.mark.parametrize(("changes", "message"), [
    (dict(batch_context=32), "Expected batch_context among the contexts [24, 40] (its prefill is shared), got 32"),
    (dict(contexts=[64000, 64100], batch_context=64000), "Expected contexts whose metric names differ, got [64000, 64100]"),
    (dict(batch=1), "Expected batch >= 2"),
    (dict(samples=0), "Expected samples to be a whole number >= 1, got 0"),
])
def test_end_to_end_refuses_arguments_it_cannot_run_before_measuring(monkeypatch, changes, message):
    monkeypatch.setattr(streaming.step_profile, "copy_bandwidth", lambda *a, **k: pytest.fail("measured before refusing"))
    with pytest.raises(ValueError, match=re.escape(message)):
        streaming.run(**dict(TINY_END_TO_END, **changes))


def test_end_to_end_names_its_rows_as_the_plan_does():
    assert streaming.tag(65536, 1) == "64k" and streaming.tag(189440, 1) == "185k" and streaming.tag(65536, 8) == "b8_64k"
    assert streaming.tag(24, 2) == "b2_24"
    # 8 requests of 64k (and what they decode) are the most rows live at once, with the warm-up prompt
    assert streaming.pool_slots([65536, 189440], 8, 65536, 100, 4096) == 8 * (65536 + 102) + 4096 + 64
    assert streaming.pool_slots([65536, 189440], 2, 65536, 100, 4096) == 189440 + 102 + 4096 + 64


def test_the_plans_end_to_end_gate_holds_the_issues_thresholds_and_fits_one_gpu_command():
    gate = plan_gate("cudagraph", "end-to-end")
    assert gate.kind == "benchmark" and gate.call == "phases.cudagraph.streaming:run" and "cuda" in gate.requires
    assert gate.timeout <= 600
    assert {k: t.text for k, t in gate.expect.items()} == {
        "frac_streaming_limit_64k": ">= 0.8", "frac_streaming_limit_185k": ">= 0.8", "frac_streaming_limit_b8_64k": ">= 0.8",
        "ttft_64k_s": "<= 6", "ttft_185k_s": "<= 35"}
    assert {k: t.text for k, t in gate.targets.items()} == {
        "frac_streaming_limit_64k": ">= 0.9", "frac_streaming_limit_185k": ">= 0.9", "frac_streaming_limit_b8_64k": ">= 0.9",
        "ttft_185k_s": "<= 25"}
    run_args = inspect.signature(streaming.run).parameters
    assert set(gate.args) <= set(run_args)
    contexts, batch = gate.args["contexts"], gate.args["batch"]
    names = {streaming.tag(c, 1) for c in contexts} | {streaming.tag(gate.args["batch_context"], batch)}
    assert {f"frac_streaming_limit_{n}" for n in names} | {f"ttft_{streaming.context_label(c)}_s" for c in contexts} \
        == set(gate.expect)


def test_the_end_to_end_fractions_are_judged_on_the_interval_of_their_samples():
    """The gate's sample count passes the fraction thresholds only when the interval of the
    median clears them, as for the other sampled gates (``tests/test_gate_samples.py``)."""
    from runner.plan.samples import min_samples
    from runner.records.checks import check_thresholds

    gate = plan_gate("cudagraph", "end-to-end")
    count = gate.args.get("samples", inspect.signature(streaming.run).parameters["samples"].default)
    assert count >= min_samples(gate.confidence)
    for metric, threshold in gate.expect.items():
        if not metric.startswith("frac_"):
            continue
        (good,) = check_thresholds({metric: threshold}, {metric: planted(threshold, count, True)}, gate.confidence)
        assert good.ok and good.samples == count, good
        (bad,) = check_thresholds({metric: threshold}, {metric: planted(threshold, count, False)}, gate.confidence)
        assert not bad.ok, bad


@gpu
@needs_cuda
def test_replay_gate_small_gpu_profile():
    m = verify.run(batch_sizes=[1, 4, 16], rounds=3, max_context=65536, pool_slots=400_000,
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
    assert_samples(d, "decode_speedup_4k", 6)
    assert all(share <= 1 for share in assert_samples(d, "attention_share_4k", 6))
    assert d["leaked_slots"] == 0


@gpu
@needs_cuda
def test_end_to_end_small_gpu_profile():
    m = streaming.run(preset="gpu-h16", contexts=[4096, 16384], batch=4, batch_context=4096, steps=5, samples=6,
                      warm_prompt=1024, copy_mib=512)
    for name in ("4k", "16k", "b4_4k"):
        assert all(f <= 1.05 for f in assert_samples(m, f"frac_streaming_limit_{name}", 6))
        assert m[f"replay_ms_{name}"] <= m[f"step_ms_{name}"] * 1.05
    assert m["ttft_4k_s"] > 0 and m["ttft_16k_s"] > 0 and m["leaked_slots"] == 0
