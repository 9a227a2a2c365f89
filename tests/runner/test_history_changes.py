"""``runner history PHASE --changes``: the change points of each thresholded metric over the runs
of one machine fingerprint, with the run and commit where each level starts, and the same steps
marked on the HTML report's history plots."""

from __future__ import annotations

import json
import random
import shutil

from tests.runner.repo_fixtures import cli, default_phases, make_repo
from tests.runner.run_samples import gate_result, results, write_run

STEP_AT = 18


def timed_phases() -> list[dict]:
    phases = default_phases()
    phases[0]["headline"] = ["ms"]
    phases[0]["gates"][1]["expect"] = {"ms": "<= 100"}
    return phases


def run_id(i: int) -> tuple[str, str]:
    day, hour = 1 + i // 24, i % 24
    return f"202612{day:02d}T{hour:02d}0000Z-abababab", f"2026-12-{day:02d}T{hour:02d}:00:00Z"


def plant(root, levels: list[float], *, seed: int = 1, gpus: list[str | None] | None = None) -> list:
    """One run per level: ten samples of ``ms`` around it; ``gpus`` names each run's GPU."""
    rng = random.Random(seed)
    paths = []
    for i, level in enumerate(levels):
        ms = [round(level * (1 + rng.gauss(0, 0.03)), 4) for _ in range(10)]
        rid, created = run_id(i)
        gates = [gate_result("build", "build"), gate_result("check", "verify", metrics={"ms": ms})]
        paths.append(write_run(root, results(run_id=rid, created=created, gates=gates,
                                             gpu=(gpus[i] if gpus else None))))
    return paths


def test_a_planted_step_is_named_with_its_run_commit_before_and_after(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", timed_phases())
    paths = plant(repo.root, [10.0] * STEP_AT + [13.0] * 12)
    repo.git("add", "-f", str(paths[STEP_AT].parent))
    repo.git("commit", "-qm", "record the run")
    recorded = repo.head()
    result = cli(runner_env, repo.root, "history", "alpha", "--changes")
    assert result.exit_code == 0, result.text
    [row] = [line for line in result.stdout.splitlines() if line.startswith("  alpha ")]
    assert run_id(STEP_AT)[0] in row and recorded[:12] in row
    assert "+30" in row and row.split()[-1] == "worse"
    data = json.loads(cli(runner_env, repo.root, "history", "alpha", "--changes", "--json").stdout)
    [change] = data["changes"]
    assert (change["run_id"], change["commit"], change["verdict"]) == (run_id(STEP_AT)[0], recorded, "worse")
    assert 9.7 < change["before"] < 10.3 and 12.6 < change["after"] < 13.4 and change["floor"] == 0.1
    assert data["series"] == [{"phase": "alpha", "gate": "check", "metric": "ms", "machine": "testhost: no GPU",
                               "machine_fingerprint": change["machine_fingerprint"], "runs": 30}]


def test_noise_reports_no_change(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", timed_phases(), git_init=False)
    for seed in range(3):
        shutil.rmtree(repo.root / "reports", ignore_errors=True)
        plant(repo.root, [10.0] * 30, seed=seed)
        result = cli(runner_env, repo.root, "history", "alpha", "--changes")
        assert result.exit_code == 0 and "none found" in result.stdout, result.stdout


def test_two_machines_are_two_series_not_a_step(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", timed_phases(), git_init=False)
    gpus = ["GPU A" if i % 3 else "GPU B" for i in range(30)]
    plant(repo.root, [10.0 if gpu == "GPU A" else 13.0 for gpu in gpus], gpus=gpus)
    data = json.loads(cli(runner_env, repo.root, "history", "alpha", "--changes", "--json").stdout)
    assert data["changes"] == []
    assert sorted(series["runs"] for series in data["series"]) == [10, 20]


def test_the_gate_tolerance_is_the_smallest_move_that_counts(tmp_path, runner_env):
    phases = timed_phases()
    phases[0]["gates"][1]["tolerance"] = {"ms": "50%"}
    repo = make_repo(tmp_path / "repo", phases, git_init=False)
    plant(repo.root, [10.0] * STEP_AT + [13.0] * 12)
    assert "none found" in cli(runner_env, repo.root, "history", "alpha", "--changes").stdout


def test_the_html_history_plot_marks_the_step(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", timed_phases(), git_init=False)
    plant(repo.root, [10.0] * STEP_AT + [13.0] * 12)
    out = tmp_path / "page.html"
    assert cli(runner_env, repo.root, "report", "--out", str(out)).exit_code == 0
    html = out.read_text()
    assert "level change" in html and "+30% worse" in html
    plain = make_repo(tmp_path / "plain", timed_phases(), git_init=False)
    plant(plain.root, [10.0] * 30)
    assert cli(runner_env, plain.root, "report", "--out", str(tmp_path / "plain.html")).exit_code == 0
    assert "level change" not in (tmp_path / "plain.html").read_text()
