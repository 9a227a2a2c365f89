"""``runner diff`` on metrics reported as samples: a regression needs a significant rank test
*and* an effect beyond the plan's tolerance; noise is "no significant change"."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from runner.views.diff import compare_metric
from tests.runner.repo_fixtures import METRICS_OK, cli, default_phases, gate, make_repo
from tests.runner.run_samples import gate_result, results, write_run

OLD = ("20261201T000000Z-aaaaaaaa", "2026-12-01T00:00:00Z")
NEW = ("20261202T000000Z-bbbbbbbb", "2026-12-02T00:00:00Z")


def draws(seed: int, centre: float, spread: float, n: int = 20) -> list[float]:
    """``n`` samples of a noisy benchmark: a seeded normal around ``centre``."""
    draw = random.Random(seed)
    return [round(draw.gauss(centre, spread), 4) for _ in range(n)]


def relative_change(old: list[float], new: list[float]) -> float:
    return (statistics.median(new) - statistics.median(old)) / statistics.median(old)


def sampled_repo(tmp_path, old_samples, new_samples, tolerance="3%", gpu=None):
    phases = default_phases()
    phases[0]["gates"][1] = gate("check", "benchmark", METRICS_OK, expect={"speedup": ">= 1.5"},
                                 tolerance={"speedup": tolerance})
    repo = make_repo(tmp_path / "repo", phases, git_init=False)
    for (run_id, created), samples, machine_gpu in ((OLD, old_samples, None), (NEW, new_samples, gpu)):
        gates = [gate_result("build", "build"), gate_result("check", "benchmark", metrics={"speedup": samples})]
        write_run(repo.root, results(run_id=run_id, created=created, gates=gates, gpu=machine_gpu))
    return repo


def row_of(data: dict, metric: str = "speedup") -> dict:
    return next(row for row in data["metrics"] if row["metric"] == metric)


def test_noise_beyond_the_tolerance_is_no_significant_change(tmp_path, runner_env):
    old, new = draws(1, 2.0, 0.3), draws(2, 2.0, 0.3)
    assert relative_change(old, new) < -0.03  # the medians alone would call it a regression
    repo = sampled_repo(tmp_path, old, new)
    result = cli(runner_env, repo.root, "diff", OLD[0], NEW[0], "--json")
    assert result.exit_code == 0, result.text
    row = row_of(json.loads(result.stdout))
    assert row["verdict"] == "no significant change"
    assert row["p_value"] > 0.05 and row["old_samples"] == row["new_samples"] == 20
    low, high = row["new_interval"]
    assert low < statistics.median(new) < high


def test_a_real_shift_beyond_the_tolerance_is_a_regression(tmp_path, runner_env):
    old, new = draws(3, 2.0, 0.05), draws(4, 1.8, 0.05)
    repo = sampled_repo(tmp_path, old, new)
    result = cli(runner_env, repo.root, "diff", OLD[0], NEW[0])
    assert result.exit_code == 1, result.text
    [line] = [line for line in result.stdout.splitlines() if " speedup " in line]
    assert line.split()[-1] == "regression"
    assert "n=20" in line and "[" in line  # the medians with their intervals
    assert "1 regression(s)" in result.stdout


def test_a_significant_shift_within_the_tolerance_is_within_tolerance():
    old, new = draws(5, 2.0, 0.005), draws(6, 1.98, 0.005)
    assert -0.03 < relative_change(old, new) < 0
    row = compare_metric("p", "g", "m", old, new, threshold=">= 1", direction="higher", tolerance=0.03,
                         comparable=True)
    assert row.p_value < 0.05 and row.verdict == "within tolerance"


def test_the_gates_confidence_sets_the_level_of_the_rank_test():
    old = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    new = [1.25, 1.35, 1.45, 1.55, 1.65, 1.75]  # p = 0.18 (exact)
    strict = compare_metric("p", "g", "m", old, new, threshold=None, direction="lower", tolerance=0.01,
                            comparable=True, confidence=0.95)
    loose = compare_metric("p", "g", "m", old, new, threshold=None, direction="lower", tolerance=0.01,
                           comparable=True, confidence=0.75)
    assert strict.p_value == pytest.approx(loose.p_value) and 0.05 < strict.p_value < 0.25
    assert (strict.verdict, loose.verdict) == ("no significant change", "regression")


def test_two_single_numbers_keep_the_effect_alone():
    row = compare_metric("p", "g", "m", 2.0, 1.8, threshold=None, direction="higher", tolerance=0.05,
                         comparable=True)
    assert row.verdict == "regression" and row.p_value is None


def test_a_single_number_against_samples_is_one_sample():
    row = compare_metric("p", "g", "m", 2.0, draws(7, 1.5, 0.01, n=8), threshold=None, direction="higher",
                         tolerance=0.05, comparable=True)
    assert row.p_value == pytest.approx(2 / 9) and row.verdict == "no significant change"


def test_another_machine_stays_not_comparable(tmp_path, runner_env):
    repo = sampled_repo(tmp_path, draws(3, 2.0, 0.05), draws(4, 1.5, 0.05), gpu="Other GPU")
    result = cli(runner_env, repo.root, "diff", OLD[0], NEW[0], "--json")
    assert result.exit_code == 0 and row_of(json.loads(result.stdout))["verdict"] == "not comparable"


def test_markdown_shows_the_interval_and_p(tmp_path, runner_env):
    repo = sampled_repo(tmp_path, draws(3, 2.0, 0.05), draws(4, 1.8, 0.05))
    text = cli(runner_env, repo.root, "diff", OLD[0], NEW[0], "--format", "markdown").stdout
    [line] = [line for line in text.splitlines() if "| speedup |" in line]
    assert "n=20" in line and "**regression**" in line
    assert float(line.split("|")[8]) < 0.05  # the p column
