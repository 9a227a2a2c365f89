"""A metric with a threshold or a target and no ``tolerance:`` is judged against the default
tolerance (10%, significant on samples), as asv judges a change with no configuration; the verdict
says the default was used, and a declared ``tolerance:`` still decides."""

from __future__ import annotations

import json

import pytest

from runner.views.diff import compare_metric
from tests.runner.repo_fixtures import cli, default_phases, gate, make_repo
from tests.runner.run_samples import gate_result, results, write_run

BASE = ("20261201T000000Z-aaaaaaaa", "2026-12-01T00:00:00Z")

# One timing per run of the gate, around $CENTRE ms, seeded: `repeat: 10` makes it 10 samples.
TIMED = """python3 -c 'import json, os, random
draw = random.Random(int(os.environ["SEED"]) * 1000 + len(os.listdir(os.environ["RUNS"])))
open(os.path.join(os.environ["RUNS"], str(draw.random())), "w").close()
json.dump({"chunked_ms": round(float(os.environ["CENTRE"]) * draw.uniform(0.98, 1.02), 4)},
          open(os.environ["RUNNER_METRICS"], "w"))'"""


def timed_repo(tmp_path, centre: float, *, tolerance: dict | None = None, seed: int = 1):
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    phases = default_phases()
    fields = {"tolerance": tolerance} if tolerance is not None else {}
    phases[0]["gates"] = [gate("speed", "benchmark", TIMED, expect={"chunked_ms": "<= 100000"}, repeat=10,
                               env={"CENTRE": str(centre), "SEED": str(seed), "RUNS": str(runs)}, **fields)]
    return make_repo(tmp_path / "repo", phases, git_init=False)


def baseline(repo, centre: float) -> None:
    samples = [round(centre * (0.99 + 0.002 * i), 4) for i in range(10)]
    gates = [gate_result("speed", "benchmark", metrics={"chunked_ms": samples})]
    write_run(repo.root, results(run_id=BASE[0], created=BASE[1], gates=gates))


def speed_row(text: str) -> str:
    [row] = [line for line in text.splitlines() if " chunked_ms " in line]
    return row


def test_a_22x_slowdown_with_no_tolerance_is_a_regression_by_the_default(tmp_path, runner_env):
    repo = timed_repo(tmp_path, centre=220.0)
    baseline(repo, 10.0)
    result = cli(runner_env, repo.root, "gate", "alpha", "--baseline", BASE[0])
    assert result.exit_code == 1, result.text
    assert "alpha PASS" in result.stdout  # the gate passed its threshold; the baseline judged it
    row = speed_row(result.stdout)
    assert row.split()[-1] == "regression" and "10% (default)" in row and "n=10" in row
    assert "1 regression(s); judged against the default tolerance of 10%" in result.stdout
    assert "speed.chunked_ms" in result.stdout.splitlines()[-1]


def test_a_small_significant_slowdown_is_within_the_default(tmp_path, runner_env):
    repo = timed_repo(tmp_path, centre=10.5)  # 5% slower, every sample: significant, within 10%
    baseline(repo, 10.0)
    result = cli(runner_env, repo.root, "gate", "alpha", "--baseline", BASE[0])
    assert result.exit_code == 0, result.text
    row = speed_row(result.stdout)
    assert row.split()[-2:] == ["within", "tolerance"] and "10% (default)" in row
    assert "no regression; judged against the default tolerance of 10%" in result.stdout


def test_a_declared_tolerance_still_decides(tmp_path, runner_env):
    repo = timed_repo(tmp_path, centre=220.0, tolerance={"chunked_ms": 30})  # 3000%: anything goes
    baseline(repo, 10.0)
    result = cli(runner_env, repo.root, "gate", "alpha", "--baseline", BASE[0])
    assert result.exit_code == 0, result.text
    row = speed_row(result.stdout)
    assert row.split()[-2:] == ["within", "tolerance"] and "(default)" not in row and "3000%" in row
    assert "default tolerance" not in result.stdout


def test_a_noisy_change_is_not_judged_however_far_its_median_moved():
    old = [10.0, 30.0, 11.0, 29.0, 12.0, 28.0]
    new = [x * 1.3 for x in (10.0, 30.0, 11.0, 9.0, 12.0, 8.0)]
    row = compare_metric("p", "g", "m", old, new, threshold="<= 100", direction="lower", tolerance=None,
                         comparable=True)
    assert row.verdict == "no significant change" and row.p_value >= 0.05


@pytest.mark.parametrize(("new", "verdict"), [(1.5, "regression"), (1.9, "within tolerance"), (2.5, "better")])
def test_single_numbers_use_the_default_on_the_effect_alone(new, verdict):
    row = compare_metric("p", "g", "m", 2.0, new, threshold=">= 1", direction="higher", tolerance=None,
                         comparable=True)
    assert row.verdict == verdict and row.tolerance == 0.10 and row.tolerance_default  # the 10%


def test_a_metric_without_a_direction_gets_no_tolerance():
    row = compare_metric("p", "g", "m", 2.0, 1.0, threshold=None, direction=None, tolerance=None, comparable=True)
    assert row.verdict == "changed" and row.tolerance is None and not row.tolerance_default


def test_json_says_the_default_was_used(tmp_path, runner_env):
    repo = timed_repo(tmp_path, centre=220.0)
    baseline(repo, 10.0)
    out = tmp_path / "fresh.json"
    assert cli(runner_env, repo.root, "gate", "alpha", "--out", str(out)).exit_code == 0
    data = json.loads(cli(runner_env, repo.root, "diff", BASE[0], str(out), "--json").stdout)
    [row] = [row for row in data["metrics"] if row["metric"] == "chunked_ms"]
    assert (row["verdict"], row["tolerance"], row["tolerance_default"]) == ("regression", 0.1, True)
    assert data["regressions"] == 1
