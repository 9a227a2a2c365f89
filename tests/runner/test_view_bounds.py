"""The views read only what they show: ``status`` reads a phase's runs back to its newest
verdict, a results file over ``VIEW_MAX_RESULTS_BYTES`` is named and never opened, and what a
view keeps of a run holds each string metric cut as the plan cuts it."""

from __future__ import annotations

import os
import sys

from runner.plan.schema import MAX_PLAN_STRING
from runner.views.runs import VIEW_MAX_RESULTS_BYTES, find_runs, find_shown_runs, phase_runs
from tests.runner.repo_fixtures import cli, make_repo
from tests.runner.run_samples import check_run, gate_result, results, write_run

_OPENED: list[str] = []
_WATCHING = [False]


def _audit(event, args):
    if _WATCHING[0] and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # once per process: an audit hook cannot be removed


def opened_by(run) -> list[str]:
    _OPENED.clear()
    _WATCHING[0] = True
    try:
        run()
    finally:
        _WATCHING[0] = False
    return [path for path in _OPENED if path.endswith("results.json")]


def runs_of_every_kind(root):
    """Ten recorded failures, then an evidence run, then a run that only blocked."""
    for day in range(1, 11):
        check_run(root, f"202611{day:02d}T000000Z-aaaaaaaa", f"2026-11-{day:02d}T00:00:00Z", 1.0)
    evidence = check_run(root, "20261111T000000Z-bbbbbbbb", "2026-11-11T00:00:00Z", 2.0)
    (evidence.parent / "run.json").write_text('{"role": "evidence", "recorded": false, "reason": "waiting"}')
    blocked = results(run_id="20261112T000000Z-cccccccc", created="2026-11-12T00:00:00Z",
                      gates=[gate_result("build", "build"),
                             gate_result("check", outcome="BLOCKED", exit_code=None, reason="needs cuda")])
    write_run(root, blocked)


def test_status_reads_the_runs_back_to_the_newest_verdict_only(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    runs_of_every_kind(repo.root)
    shown, skipped = find_shown_runs(repo.root, "demo")
    everything = phase_runs(find_runs(repo.root, "demo"))
    assert skipped == []
    for slot in ("verdict", "blocked", "evidence"):
        assert getattr(shown["alpha"], slot).path == getattr(everything["alpha"], slot).path, slot
    assert shown["alpha"].count == 12
    paths = opened_by(lambda: cli(runner_env, repo.root, "status"))
    assert sorted(os.path.basename(os.path.dirname(path)) for path in paths) == [
        "20261110T000000Z-aaaaaaaa", "20261111T000000Z-bbbbbbbb", "20261112T000000Z-cccccccc"]


def test_an_oversize_results_file_is_named_and_never_opened(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    check_run(repo.root, "20261101T000000Z-aaaaaaaa", "2026-11-01T00:00:00Z", 2.0)
    big = repo.root / "reports" / "demo" / "alpha" / "20261102T000000Z-aaaaaaaa" / "results.json"
    big.parent.mkdir(parents=True)
    with open(big, "wb") as handle:
        handle.truncate(VIEW_MAX_RESULTS_BYTES + 1)
    for command in ("status", "history"):
        outcome = []
        paths = opened_by(lambda: outcome.append(cli(runner_env, repo.root, command)))
        assert outcome[0].exit_code == 0, outcome[0].text
        assert "a view reads of a results file; skipped" in outcome[0].text, command
        assert str(big) not in paths, command


def test_a_view_keeps_string_metrics_cut(tmp_path):
    long = "y" * 1_000_000
    run = results(run_id="20261101T000000Z-aaaaaaaa", created="2026-11-01T00:00:00Z",
                  gates=[gate_result("check", metrics={"blob": long, "speedup": 2.0},
                                     targets=[{"metric": "blob", "threshold": ">= 1", "value": long,
                                               "ok": False, "reason": "a string"}])])
    write_run(tmp_path, run)
    [record] = find_runs(tmp_path, "demo").runs
    [gate] = record.results.phases[0].gates
    assert len(gate.metrics["blob"]) == MAX_PLAN_STRING and gate.metrics["speedup"] == 2.0
    assert len(gate.targets[0].value) == MAX_PLAN_STRING


def test_json_depth_is_counted_on_the_parsed_value_not_the_bytes():
    """Brackets inside strings do not nest; arrays and objects do, to exactly the limit."""
    from runner.untrusted import UntrustedFileError, parse_json

    assert parse_json('{"a": "' + "[" * 100 + '"}', max_depth=1) == {"a": "[" * 100}
    assert parse_json("[" * 3 + "]" * 3, max_depth=3) == [[[]]]
    for text in ("[" * 4 + "]" * 4, '{"a": {"b": [{}]}}', "[" * 50000 + "]" * 50000):
        try:
            parse_json(text, max_depth=3)
        except UntrustedFileError as error:
            assert "levels deep, over the limit of 3" in str(error)
        else:
            raise AssertionError(f"{text[:20]} was accepted")


def test_runs_of_one_second_keep_their_order(tmp_path):
    """Two runs of one tree in one second share a run id; the second one's folder is ``-2``."""
    failed = check_run(tmp_path, "20261101T000000Z-aaaaaaaa", "2026-11-01T00:00:00Z", 1.0)
    blocked = results(run_id="20261101T000000Z-aaaaaaaa", created="2026-11-01T00:00:00Z",
                      gates=[gate_result("build", "build"),
                             gate_result("check", outcome="BLOCKED", exit_code=None, reason="needs cuda")])
    second = failed.parent.with_name(failed.parent.name + "-2") / "results.json"
    blocked.dump(second)
    shown, _ = find_shown_runs(tmp_path, "demo")
    everything = phase_runs(find_runs(tmp_path, "demo"))
    assert shown["alpha"].verdict.path == everything["alpha"].verdict.path == failed
    assert shown["alpha"].blocked.path == everything["alpha"].blocked.path == second
