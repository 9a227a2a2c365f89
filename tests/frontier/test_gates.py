"""Phase frontier's gates: their plumbing on the CPU (the kernel in Triton's interpreter, static
steps without capture), the plan's thresholds as decided on 2026-12-06, and small GPU profiles."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

from phases.frontier import end_to_end, end_to_end_fp8, mtp_tree, peers
from phases.kernel.bench.peers import PEER_CLASSES
from tests.sampled_gates import PLAN, assert_samples, plan_gate, planted

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")


TINY_END_TO_END = dict(preset="tiny", contexts=[24, 40], batch=2, batch_context=24, warmup=0, steps=1, samples=2,
                       trace_steps=1, replays=1, prefill_chunk=16, warm_prompt=8, copy_mib=1, device="cpu")


def test_end_to_end_plumbing_on_cpu_reports_fractions_as_samples_and_the_profilers_tables(monkeypatch, tmp_path):
    from runner.protocol import ARTIFACTS_ENV

    monkeypatch.setenv(ARTIFACTS_ENV, str(tmp_path))
    m = end_to_end.run(**TINY_END_TO_END)
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
    monkeypatch.setattr(end_to_end.step_profile, "copy_bandwidth", lambda *a, **k: pytest.fail("measured before refusing"))
    with pytest.raises(ValueError, match=re.escape(message)):
        end_to_end.run(**dict(TINY_END_TO_END, **changes))


def test_end_to_end_names_its_rows_as_the_plan_does():
    assert end_to_end.tag(65536, 1) == "64k" and end_to_end.tag(189440, 1) == "185k" and end_to_end.tag(65536, 8) == "b8_64k"
    assert end_to_end.tag(24, 2) == "b2_24"
    # 8 requests of 64k (and what they decode) are the most rows live at once, with the warm-up prompt
    assert end_to_end.pool_slots([65536, 189440], 8, 65536, 100, 4096) == 8 * (65536 + 102) + 4096 + 64
    assert end_to_end.pool_slots([65536, 189440], 2, 65536, 100, 4096) == 189440 + 102 + 4096 + 64


def test_the_plans_end_to_end_gate_holds_the_issues_thresholds_and_fits_one_gpu_command():
    gate = plan_gate("frontier", "end-to-end")
    assert gate.kind == "benchmark" and gate.call == "phases.frontier.end_to_end:run" and "cuda" in gate.requires
    assert gate.timeout <= 600
    assert {k: t.text for k, t in gate.expect.items()} == {
        "frac_streaming_limit_64k": ">= 0.8", "frac_streaming_limit_185k": ">= 0.8", "frac_streaming_limit_b8_64k": ">= 0.8",
        "ttft_64k_s": "<= 6", "ttft_185k_s": "<= 35"}
    assert {k: t.text for k, t in gate.targets.items()} == {
        "frac_streaming_limit_64k": ">= 0.9", "frac_streaming_limit_185k": ">= 0.9", "frac_streaming_limit_b8_64k": ">= 0.9",
        "ttft_185k_s": "<= 25"}
    run_args = inspect.signature(end_to_end.run).parameters
    assert set(gate.args) <= set(run_args)
    contexts, batch = gate.args["contexts"], gate.args["batch"]
    names = {end_to_end.tag(c, 1) for c in contexts} | {end_to_end.tag(gate.args["batch_context"], batch)}
    assert {f"frac_streaming_limit_{n}" for n in names} | {f"ttft_{end_to_end.context_label(c)}_s" for c in contexts} \
        == set(gate.expect)


def test_the_end_to_end_fractions_are_judged_on_the_interval_of_their_samples():
    """The gate's sample count passes the fraction thresholds only when the interval of the
    median clears them, as for the other sampled gates (``tests/test_gate_samples.py``)."""
    from runner.plan.samples import min_samples
    from runner.records.checks import check_thresholds

    gate = plan_gate("frontier", "end-to-end")
    count = gate.args.get("samples", inspect.signature(end_to_end.run).parameters["samples"].default)
    assert count >= min_samples(gate.confidence)
    for metric, threshold in gate.expect.items():
        if not metric.startswith("frac_"):
            continue
        (good,) = check_thresholds({metric: threshold}, {metric: planted(threshold, count, True)}, gate.confidence)
        assert good.ok and good.samples == count, good
        (bad,) = check_thresholds({metric: threshold}, {metric: planted(threshold, count, False)}, gate.confidence)
        assert not bad.ok, bad


TINY_FP8 = dict(fp8_preset="tiny-fp8", bf16_preset="tiny", context=24, warmup=0, steps=1, samples=2, trace_steps=1,
                replays=1, copy_mib=1, device="cpu")


def test_end_to_end_fp8_plumbing_on_cpu_pairs_the_rounds_of_both_sides(monkeypatch, tmp_path):
    from runner.protocol import ARTIFACTS_ENV

    monkeypatch.setenv(ARTIFACTS_ENV, str(tmp_path))
    timed = []
    real = end_to_end_fp8.step_profile.time_steps

    def time_steps(engine, requests, steps):
        timed.append(engine)
        return real(engine, requests, steps)

    monkeypatch.setattr(end_to_end_fp8.step_profile, "time_steps", time_steps)
    m = end_to_end_fp8.run(**TINY_FP8)
    first, second = timed[0], timed[1]
    assert first is not second and timed == [first, second, second, first]  # rounds interleaved, order alternating
    for side in ("fp8_24", "bf16_24"):
        assert all(f < 1 for f in assert_samples(m, f"frac_streaming_limit_{side}", 2))
        assert m[f"decode_tps_{side}"] > 0 and m[f"limit_ms_{side}"] > 0 and m[f"kernels_per_step_{side}"] > 0
    speedups = assert_samples(m, "fp8_speedup_24", 2)
    assert m["leaked_slots"] == 0 and m["copy_GBps"] > 0 and len(speedups) == 2
    report = (tmp_path / "end_to_end_fp8_profile.md").read_text()
    assert [line for line in report.splitlines() if line.startswith("### ")] == [
        "### fp8_24: B=1, 24 cached rows", "### bf16_24: B=1, 24 cached rows"]


def test_end_to_end_fp8_speedup_is_bf16_step_time_over_fp8s_round_by_round(monkeypatch):
    """A planted FP8 side twice as fast as bf16 reads as 2.0 in every round."""
    def time_steps(engine, requests, steps):
        fp8 = engine.model.cfg.quantization is not None
        return [0.005 if fp8 else 0.010] * steps

    monkeypatch.setattr(end_to_end_fp8.step_profile, "time_steps", time_steps)
    m = end_to_end_fp8.run(**TINY_FP8)
    assert m["fp8_speedup_24"] == pytest.approx([2.0, 2.0])
    assert m["decode_tps_fp8_24"] == pytest.approx(200.0) and m["decode_tps_bf16_24"] == pytest.approx(100.0)


def test_end_to_end_fp8_refuses_arguments_before_measuring(monkeypatch):
    monkeypatch.setattr(end_to_end_fp8.step_profile, "copy_bandwidth", lambda *a, **k: pytest.fail("measured before refusing"))
    with pytest.raises(ValueError, match="Expected samples"):
        end_to_end_fp8.run(**dict(TINY_FP8, samples=0))
    with pytest.raises(ValueError, match="Expected context >= 2"):
        end_to_end_fp8.run(**dict(TINY_FP8, context=1))


def test_the_plans_fp8_gate_names_the_metrics_the_gate_reports():
    gate = plan_gate("frontier", "end-to-end-fp8")
    assert set(gate.args) <= set(inspect.signature(end_to_end_fp8.run).parameters)
    assert {k: t.text for k, t in gate.expect.items()} == {
        "frac_streaming_limit_fp8_64k": ">= 0.8", "fp8_speedup_64k": ">= 1.3"}
    assert {k: t.text for k, t in gate.targets.items()} == {
        "frac_streaming_limit_fp8_64k": ">= 0.9", "fp8_speedup_64k": ">= 1.45"}
    assert end_to_end.context_label(gate.args["context"]) == "64k" and gate.timeout <= 600


def test_mtp_tree_gate_on_cpu_reports_the_trees_ratio_as_samples():
    m = mtp_tree.run(tiny=True, contexts=[40], max_new_tokens=4, samples=6, device="cpu")
    assert assert_samples(m, "mtp_tree_ratio_b1", 6) == m["mtp_tree_40_b1_ratio"]
    assert_samples(m, "mtp_tree_tokens_per_step_b1", 6)
    assert not any(k.startswith(("mtp_best", "mtp_chain", "ngram", "layer_skip")) for k in m)


def test_the_plans_frontier_holds_the_frontier_thresholds():
    """Decision of 2026-12-06: the gates that measure the project against the best peers and the
    hardware's limits, with their thresholds unchanged, in the last phase."""
    from runner.plan import load as planfile

    plan = planfile.load_plan(PLAN).plan
    assert plan.phases[-1].id == "frontier"
    frontier = plan.phase("frontier")
    assert [g.name for g in frontier.gates] == ["peers", "end-to-end", "end-to-end-fp8", "mtp-tree"]
    gate = frontier.gate("peers")
    classes = [f"min_peer_ratio_{klass}" for klass in PEER_CLASSES]
    assert all(gate.expect[name].text == ">= 1.0" and gate.targets[name].text == ">= 1.10" for name in classes)
    assert gate.call == "phases.frontier.peers:run"
    assert frontier.gate("mtp-tree").expect["mtp_tree_ratio_b1"].text == ">= 2.0"
    assert frontier.gate("mtp-tree").targets["mtp_tree_ratio_b1"].text == ">= 2.5"
    for phase in plan.phases[:-1]:  # no earlier phase judges a frontier metric
        for g in phase.gates:
            assert not any(k.startswith(("min_peer_ratio", "frac_streaming_limit", "mtp_tree_ratio")) for k in g.expect), g.name


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_peers_gate_needs_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        peers.run()


@gpu
@needs_cuda
def test_end_to_end_small_gpu_profile():
    m = end_to_end.run(preset="gpu-h16", contexts=[4096, 16384], batch=4, batch_context=4096, steps=5, samples=6,
                      warm_prompt=1024, copy_mib=512)
    for name in ("4k", "16k", "b4_4k"):
        assert all(f <= 1.05 for f in assert_samples(m, f"frac_streaming_limit_{name}", 6))
        assert m[f"replay_ms_{name}"] <= m[f"step_ms_{name}"] * 1.05
    assert m["ttft_4k_s"] > 0 and m["ttft_16k_s"] > 0 and m["leaked_slots"] == 0
