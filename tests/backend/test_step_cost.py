"""``phases.speculation.bench.step_cost`` on the CPU: the tiny shape, plain and the MTP chain, a
couple of steps (Triton's interpreter makes every step cost a fraction of a second)."""

from __future__ import annotations

import json

import pytest

from phases.speculation.bench import step_cost


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    out = tmp_path_factory.mktemp("step_cost") / "step_cost.json"
    assert step_cost.main(["--device", "cpu", "--tiny", "--contexts", "32", "--modes", "plain,mtp:1x3", "--steps", "2",
                           "--profile-steps", "1", "--warmup-steps", "1", "--settle-tokens", "2", "--graph-batch-sizes", "1",
                           "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_every_mode_reports_wall_tokens_and_host_figures(doc):
    assert [(r["mode"], r["context"]) for r in doc["rows"]] == [("plain", 32), ("mtp:1x3", 32)]
    for row in doc["rows"]:
        assert row["wall_ms_per_step"] > 0 and row["wall_ms_median"] > 0
        assert row["tokens_per_step"] >= 1
        assert row["eager_steps"] == 0  # every step on the replay path
        median = row["trace"]["median"]
        for key in ("graph_launches", "host_step_us", "host_before_first_launch_us", "host_after_last_launch_us",
                    "host_wait_us"):
            assert key in median, key
        assert row["cprofile"][0]["function"].endswith("(Engine.step)") and row["cprofile"][0]["calls_per_step"] == 1
        assert all(f["cum_us_per_step"] >= 0 for f in row["cprofile"])
    assert "| plain | 32 |" in doc["table"]


def test_the_chain_launches_a_draft_step_before_its_verify_step(doc):
    plain, chain = doc["rows"]
    assert plain["graph_replays_per_step"] == 1 and chain["graph_replays_per_step"] == 2
    assert plain["trace"]["median"]["graph_launches"] == 1
    assert chain["trace"]["median"]["graph_launches"] == 2
    assert chain["trace"]["median"]["draft_launches"] == 1 and chain["trace"]["median"]["verify_launches"] == 1
    assert "host_between_launches_us" in chain["trace"]["median"]


def test_trace_analysis_splits_device_work_by_the_replay_that_issued_it():
    """A synthetic CUDA trace: one step, a draft launch and a verify launch, their kernels
    (matched by correlation id), a sync and an eager copy."""
    S = step_cost.Span
    spans = [
        S(step_cost.STEP_RANGE, "user_annotation", 0, 100),
        S(step_cost.DRAFT_RANGE, "user_annotation", 10, 20),
        S(step_cost.GRAPH_LAUNCH, "cuda_runtime", 12, 18, 1),
        S(step_cost.VERIFY_RANGE, "user_annotation", 40, 90),
        S(step_cost.GRAPH_LAUNCH, "cuda_runtime", 45, 50, 2),
        S("cudaMemcpyAsync", "cuda_runtime", 60, 61, 3),
        S("cudaStreamSynchronize", "cuda_runtime", 61, 85),
        S("k_draft", "kernel", 20, 30, 1),
        S("k_verify", "kernel", 50, 70, 2),
        S("k_verify2", "kernel", 65, 80, 2),
        S("copy", "gpu_memcpy", 80, 81, 3),
    ]
    (row,) = step_cost.analyze_trace(spans, cuda=True)
    assert row["graph_launches"] == 2 and row["draft_launches"] == 1 and row["verify_launches"] == 1
    assert row["host_before_first_launch_us"] == 12 and row["host_between_launches_us"] == 27
    assert row["host_after_last_launch_us"] == 50 and row["host_wait_us"] == 25
    assert row["all_kernels"] == 3 and row["all_copies"] == 1
    assert row["draft_kernel_us"] == 10 and row["verify_kernel_us"] == 35 and row["verify_busy_us"] == 31
    assert row["verify_copies"] == 1 and row["other_copies"] == 0  # the result read is the verify call's
    assert row["all_busy_us"] == 10 + 30 + 1
