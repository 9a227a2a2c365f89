"""Samples: a metric reported as a list of numbers is judged on a confidence interval of its
median from order statistics; ``repeat: N`` collects a gate's numbers over N runs; a single
number keeps its meaning."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

from runner.plan.load import load_plan
from runner.plan.samples import (
    _rank,
    interval_gap,
    interval_holds,
    median_interval,
    merge_repetitions,
    min_samples,
)
from runner.plan.thresholds import Threshold
from runner.records.checks import check_thresholds
from tests.runner.repo_fixtures import PY, cli, copy_without_git, default_phases, edit_results, gate, make_repo


def _coverage(n: int, k: int) -> Fraction:
    """``P(x(k) <= median <= x(n+1-k))`` for ``n`` samples, by the binomial sum."""
    from math import comb

    return 1 - 2 * Fraction(sum(comb(n, i) for i in range(k)), 2**n)


@pytest.mark.parametrize("n, rank", [(5, 0), (6, 1), (8, 1), (9, 2), (10, 2), (20, 6), (50, 18), (100, 40)])
def test_the_interval_is_the_widest_rank_with_enough_coverage(n, rank):
    """The classic table of order-statistic intervals of the median at 95%."""
    assert _rank(n, Fraction(0.95)) == rank
    if rank:
        assert _coverage(n, rank) >= Fraction(0.95) > _coverage(n, rank + 1)


def test_min_samples_by_confidence():
    assert (min_samples(0.95), min_samples(0.99), min_samples(0.5)) == (6, 8, 2)


def test_median_interval_of_twenty_samples():
    interval = median_interval([float(x) for x in range(20, 0, -1)])  # unsorted on purpose
    assert (interval.n, interval.median, interval.low, interval.high) == (20, 10.5, 6.0, 15.0)


@pytest.mark.parametrize("op, bound, holds", [
    (">=", 6.0, True), (">=", 6.5, False), (">", 5.9, True), (">", 6.0, False),
    ("<=", 15.0, True), ("<=", 14.5, False), ("<", 15.1, True), ("<", 15.0, False),
    ("==", 10.5, False), ("!=", 16.0, True), ("!=", 10.0, False),
])
def test_a_threshold_must_hold_over_the_whole_interval(op, bound, holds):
    interval = median_interval(list(range(1, 21)))  # [6, 15]
    assert interval_holds(op, bound, interval) is holds
    gap = interval_gap(op, bound, interval)
    assert (gap == 0.0) if holds else (gap is None or gap >= 0)


def test_ge_is_judged_on_the_lower_bound_and_le_on_the_upper():
    samples = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9]  # median 1.45, interval [1.1, 1.8]
    [ge_median, ge_low] = check_thresholds({"a": Threshold.parse(">= 1.4"), "b": Threshold.parse(">= 1.1")},
                                           {"a": samples, "b": samples})
    assert not ge_median.ok and ge_median.value == pytest.approx(1.45)  # the median alone would pass
    assert ge_median.interval == [1.1, 1.8] and ge_median.samples == 10 and ge_median.gap == pytest.approx(0.3)
    assert "95% interval [1.1, 1.8] of 10 samples: not >= 1.4 over the interval" in ge_median.reason
    assert ge_low.ok
    [le] = check_thresholds({"a": Threshold.parse("<= 1.8")}, {"a": samples})
    assert le.ok
    [le] = check_thresholds({"a": Threshold.parse("<= 1.7")}, {"a": samples})
    assert not le.ok


def test_too_few_samples_never_pass_and_say_how_many_are_needed():
    [check] = check_thresholds({"a": Threshold.parse(">= 0")}, {"a": [5.0, 6.0, 7.0, 8.0, 9.0]})
    assert not check.ok and check.interval is None and check.gap is None
    assert "too few for a 95% interval (at least 6)" in check.reason


@pytest.mark.parametrize("samples, needle", [
    ([], "empty list"), ([1.0, math.nan] * 3, "not a finite number"), ([1.0, math.inf] * 3, "not a finite number"),
])
def test_samples_that_cannot_be_judged_fail(samples, needle):
    [check] = check_thresholds({"a": Threshold.parse(">= 0")}, {"a": samples})
    assert not check.ok and needle in check.reason


def test_confidence_changes_the_interval():
    samples = list(range(1, 11))  # 95%: [2, 9]; 50%: ranks 4..7
    [at_95] = check_thresholds({"a": Threshold.parse(">= 3")}, {"a": samples}, 0.95)
    [at_50] = check_thresholds({"a": Threshold.parse(">= 3")}, {"a": samples}, 0.5)
    assert not at_95.ok and at_50.ok and at_50.interval == [4.0, 7.0]


def test_a_single_number_keeps_its_meaning():
    [check] = check_thresholds({"a": Threshold.parse(">= 1.5")}, {"a": 1.6})
    assert check.ok and check.interval is None and check.samples is None and check.reason == "1.6 >= 1.5"


def test_merge_repetitions_collects_numbers_and_keeps_the_last_of_the_rest():
    merged = merge_repetitions([{"ms": 1.0, "label": "a", "rows": [1, 2]}, {"ms": 2, "label": "b", "rows": [3]}])
    assert merged == {"ms": [1.0, 2], "label": "b", "rows": [1, 2, 3]}


# --- through the runner -----------------------------------------------------------------------

SAMPLES_GATE = (f"{PY} -c \"import json, os; json.dump({{'speedup': [2.4, 2.5, 2.6, 2.5, 2.7, 2.3, 2.5], "
                "'errors': 0}, open(os.environ['RUNNER_METRICS'], 'w'))\"")


def sampled_phases(expect: str = ">= 1.5", **fields):
    phases = default_phases()
    phases[0]["gates"] = [gate("check", "verify", SAMPLES_GATE, expect={"speedup": expect, "errors": "== 0"},
                               **fields)]
    return phases


def test_a_sampled_metric_checkpoints_with_its_median_in_the_plan(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", sampled_phases())
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    alpha = load_plan(repo.plan).plan.phase("alpha")
    assert alpha.checkpoint.metrics == {"speedup": 2.5, "errors": 0}
    report = (repo.root / alpha.checkpoint.report).read_text()
    assert "| speedup | `>= 1.5` | 2.5 (median of 7; 95% interval [2.3, 2.7]) | yes |" in report
    assert "speedup=2.5" in cli(runner_env, repo.root, "status").stdout


def test_a_sampled_metric_whose_interval_misses_fails(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", sampled_phases(">= 2.4"))  # the median 2.5 would pass
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 1, result.text
    assert "not >= 2.4 over the interval" in result.text


def test_confidence_per_gate(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", sampled_phases(">= 2.4", confidence=0.5))  # 50%: ranks 3..5
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    report = (repo.root / load_plan(repo.plan).plan.phase("alpha").checkpoint.report).read_text()
    assert "| speedup | `>= 2.4` | 2.5 (median of 7; 50% interval [2.5, 2.5]) | yes |" in report


COUNTER_GATE = (f"{PY} -c \"import json, os; p = 'count.txt'; n = int(open(p).read()) + 1 if os.path.exists(p) else 1; "
                "open(p, 'w').write(str(n)); print('run', n); "
                "json.dump({'ms': 10.0 + n, 'label': 'run %d' % n}, open(os.environ['RUNNER_METRICS'], 'w'))\"")


def repeat_phases(repeat: int, expect: str, run: str = COUNTER_GATE):
    phases = default_phases()
    phases[0]["headline"] = ["ms"]
    phases[0]["gates"] = [gate("timing", "benchmark", run, repeat=repeat, expect={"ms": expect})]
    return phases


def test_repeat_collects_each_runs_number_into_samples(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", repeat_phases(8, "<= 19"))  # 11..18; 95% needs 8 for [min, max]
    (repo.root / ".gitignore").write_text((repo.root / ".gitignore").read_text() + "count.txt\n")
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "ignore the counter")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    assert (repo.root / "count.txt").read_text() == "8"
    alpha = load_plan(repo.plan).plan.phase("alpha")
    assert alpha.checkpoint.metrics == {"ms": 14.5}
    run_dir = (repo.root / alpha.checkpoint.report).parent
    [stored] = json.loads((run_dir / "results.json").read_text())["phases"][0]["gates"]
    assert stored["metrics"] == {"ms": [11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0], "label": "run 8"}
    assert stored["checks"][0]["interval"] == [11.0, 18.0]
    assert stored["reason"] == "exited with code 0 in each of 8 repetitions; 1 threshold(s) met"
    log = (run_dir / "timing.log").read_text()
    assert "[runner] repetition 1 of 8\nrun 1" in log and "[runner] repetition 8 of 8\nrun 8" in log


def test_a_failing_repetition_fails_the_gate_and_ends_it(tmp_path, runner_env):
    flaky = COUNTER_GATE + "; test $(cat count.txt) -lt 3"
    repo = make_repo(tmp_path / "repo", repeat_phases(5, "<= 100", run=flaky))
    (repo.root / ".gitignore").write_text((repo.root / ".gitignore").read_text() + "count.txt\n")
    result = cli(runner_env, repo.root, "gate", "alpha", "--out", str(tmp_path / "r.json"))
    assert result.exit_code == 1, result.text
    [stored] = json.loads((tmp_path / "r.json").read_text())["phases"][0]["gates"]
    assert stored["outcome"] == "FAIL" and stored["reason"] == "repetition 3 of 5: exited with code 1"
    assert (repo.root / "count.txt").read_text() == "3"  # repetitions 4 and 5 never ran
    assert stored["metrics"]["ms"] == [11.0, 12.0, 13.0]


def test_samples_travel_and_are_judged_again_with_the_plans_confidence(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", sampled_phases())
    host = copy_without_git(repo.root, tmp_path / "host")
    made = cli(runner_env, host, "gate", "alpha", "--out", str(tmp_path / "results.json"))
    assert made.exit_code == 0, made.text
    definitions = json.loads((tmp_path / "results.json").read_text())["phases"][0]["definitions"]
    assert definitions["check"]["repeat"] == 1 and definitions["check"]["confidence"] == 0.95
    edit_results(tmp_path / "results.json",
                 lambda phase: phase["gates"][0]["metrics"].update(speedup=[2.5, 0.5, 2.5, 2.5, 2.5, 2.5]))
    refused = cli(runner_env, repo.root, "advance", "--results", str(tmp_path / "results.json"))
    assert refused.exit_code == 2 and "not >= 1.5 over the interval" in refused.stderr


def test_results_without_repeat_and_confidence_read_as_the_defaults(gpu_results, runner_env):
    repo, results = gpu_results

    def older(phase):
        for definition in phase["definitions"].values():
            del definition["repeat"], definition["confidence"]

    edit_results(results, older)
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == 0, result.text


def test_repeat_and_confidence_are_checked_in_the_plan(tmp_path, runner_env):
    for fields, needle in (({"repeat": 0}, "repeat: repeat is how many times the gate runs, a whole number"),
                           ({"repeat": 2.5}, "from 1 to 1000, got 2.5"),
                           ({"confidence": 95}, "confidence: a confidence is a fraction between 0 and 1 such as "
                                                "0.95 (for 95%), got 95"),
                           ({"confidence": 1.0}, "got 1.0"), ({"confidence": "high"}, "got 'high'")):
        repo = make_repo(tmp_path / f"repo-{len(needle)}", sampled_phases(**fields), git_init=False)
        result = cli(runner_env, repo.root, "status")
        assert result.exit_code == 2 and needle in result.stderr, (fields, result.text)


def test_bounds_that_round_to_the_threshold_are_shown_in_full():
    [check] = check_thresholds({"a": Threshold.parse(">= 1")}, {"a": [0.99996, 1.2, 1.3, 1.4, 1.5, 1.6]})
    assert not check.ok and "[0.99996" in check.reason


def test_repetitions_that_collect_too_many_samples_are_an_error(tmp_path, runner_env, monkeypatch):
    from runner.gates import repeat as repeat_module

    monkeypatch.setattr(repeat_module, "MAX_SAMPLES", 5)
    repo = make_repo(tmp_path / "repo", repeat_phases(3, "<= 100", run=SAMPLES_GATE))
    result = cli(runner_env, repo.root, "gate", "alpha", "--out", str(tmp_path / "r.json"))
    assert result.exit_code == 1, result.text
    [stored] = json.loads((tmp_path / "r.json").read_text())["phases"][0]["gates"]
    assert stored["outcome"] == "ERROR" and "'speedup' collected more than 5 samples over 3" in stored["reason"]
    assert len(stored["metrics"]["speedup"]) == 5
