"""``runner gate --baseline RUN``: the fresh results judged against a run of the same machine
fingerprint, as ``runner diff`` judges two runs; another machine is refused before any gate."""

from __future__ import annotations

import json

from tests.runner.repo_fixtures import cli, default_phases, gate, make_repo, write
from tests.runner.run_samples import gate_result, results, write_run

BASE = ("20261201T000000Z-aaaaaaaa", "2026-12-01T00:00:00Z")

# The check gate reports 20 samples of a seeded noisy benchmark around $CENTRE.
NOISY = """python3 -c 'import json, os, random
draw = random.Random(int(os.environ["SEED"]))
centre = float(os.environ["CENTRE"])
json.dump({"speedup": [round(draw.gauss(centre, 0.05), 4) for _ in range(20)]}, open(os.environ["RUNNER_METRICS"], "w"))'"""


def noisy_repo(tmp_path, centre: float, seed: int = 1):
    phases = default_phases()
    phases[0]["gates"][1] = gate("check", "benchmark", NOISY, expect={"speedup": ">= 1.5"},
                                 tolerance={"speedup": "5%"}, env={"CENTRE": str(centre), "SEED": str(seed)})
    return make_repo(tmp_path / "repo", phases, git_init=False)


def baseline_run(repo, samples, gpu=None):
    gates = [gate_result("build", "build"), gate_result("check", "benchmark", metrics={"speedup": samples})]
    return write_run(repo.root, results(run_id=BASE[0], created=BASE[1], gates=gates, gpu=gpu))


def test_a_regression_against_the_baseline_exits_1_though_every_gate_passed(tmp_path, runner_env):
    repo = noisy_repo(tmp_path, centre=1.8)
    baseline_run(repo, [2.0 + 0.001 * i for i in range(20)])
    result = cli(runner_env, repo.root, "gate", "alpha", "--baseline", BASE[0])
    assert result.exit_code == 1, result.text
    assert "alpha PASS" in result.stdout
    [line] = [line for line in result.stdout.splitlines() if " speedup " in line]
    assert line.split()[-1] == "regression" and "n=20" in line
    assert "1 regression(s)" in result.stdout


def test_the_same_distribution_is_no_significant_change(tmp_path, runner_env):
    repo = noisy_repo(tmp_path, centre=2.0, seed=5)
    out = tmp_path / "baseline.json"
    assert cli(runner_env, repo.root, "gate", "alpha", "--out", str(out)).exit_code == 0
    write(repo.root, "plans/demo.md", (repo.root / "plans/demo.md").read_text().replace('"SEED": "5"', '"SEED": "6"'))
    result = cli(runner_env, repo.root, "gate", "alpha", "--baseline", str(out))
    assert result.exit_code == 0, result.text
    [line] = [line for line in result.stdout.splitlines() if " speedup " in line]
    assert line.split()[-3:] == ["no", "significant", "change"]
    assert "no regression" in result.stdout


def test_a_baseline_from_another_machine_is_refused_before_any_gate(tmp_path, runner_env):
    repo = noisy_repo(tmp_path, centre=1.0)
    baseline_run(repo, [2.0] * 20, gpu="Other GPU")
    logs = tmp_path / "logs"
    result = cli(runner_env, repo.root, "gate", "alpha", "--baseline", BASE[0], "--logs", str(logs))
    assert result.exit_code == 2, result.text
    message = result.stderr
    assert f"--baseline {BASE[0]}" in message and "Other GPU" in message and "testhost: no GPU" in message
    assert "same machine fingerprint" in message and "runner history" in message
    assert not logs.exists()  # no gate ran


def test_a_baseline_of_another_phase_is_refused(tmp_path, runner_env):
    repo = noisy_repo(tmp_path, centre=2.0)
    write_run(repo.root, results(run_id=BASE[0], created=BASE[1], phase="beta", gates=[gate_result("gpu")]),
              phase="beta")
    result = cli(runner_env, repo.root, "gate", "alpha", "--baseline", BASE[0])
    assert result.exit_code == 2 and "none of the phases checked here (alpha)" in result.stderr


def test_an_unknown_baseline_is_refused(tmp_path, runner_env):
    repo = noisy_repo(tmp_path, centre=2.0)
    result = cli(runner_env, repo.root, "gate", "alpha", "--baseline", "nothing-like-it")
    assert result.exit_code == 2 and "'nothing-like-it' is not a results file" in result.stderr
