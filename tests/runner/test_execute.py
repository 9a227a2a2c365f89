"""Gate execution with real processes: outcomes, metrics, logs, timeouts and process groups."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from runner.gates import execute
from runner.gates.execute import run_gate, run_steps
from runner.records.results import GateResult
from tests.runner.gate_helpers import (
    DuckGate,
    Step,
    group_alive,
    make_gate,
    pid_alive,
    python_cmd,
    write_gate_module,
)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    return root


def go(gate, repo: Path, **kwargs) -> GateResult:
    kwargs.setdefault("grace_s", 0.5)
    return run_gate(gate, repo_root=repo, log_path=repo.parent / "logs" / f"{gate.name}.log", **kwargs)


def wait_gone(pid: int, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# --- shell gates ------------------------------------------------------------------------------


def test_pass_with_metrics_and_thresholds(repo):
    gate = make_gate(
        run="""echo building; printf '{"speedup": 2.5, "label": "ok"}' > "$RUNNER_METRICS" """,
        expect={"speedup": ">= 1.5"},
    )
    res = go(gate, repo)
    assert res.outcome == "PASS", res.reason
    assert res.exit_code == 0 and res.signal is None
    assert res.metrics == {"speedup": 2.5, "label": "ok"}
    assert [(c.metric, c.ok, c.value) for c in res.checks] == [("speedup", True, 2.5)]
    assert res.log == "g.log"
    assert "building" in res.log_tail
    assert res.started.endswith("Z") and res.duration_s >= 0


def test_threshold_missed_fails(repo):
    gate = make_gate(run="""printf '{"speedup": 1.2}' > "$RUNNER_METRICS" """,
                     expect={"speedup": ">= 1.5"})
    res = go(gate, repo)
    assert res.outcome == "FAIL"
    assert "speedup" in res.reason and ">= 1.5" in res.reason
    assert res.checks[0].ok is False


def test_nonzero_exit_fails_with_code_and_log(repo):
    res = go(make_gate(run="echo to-stdout; echo to-stderr >&2; exit 3"), repo)
    assert res.outcome == "FAIL"
    assert res.reason == "exited with code 3"
    assert res.exit_code == 3
    log = (repo.parent / "logs" / "g.log").read_text()
    assert "to-stdout" in log and "to-stderr" in log
    assert "to-stderr" in res.log_tail


def test_abort_is_reported_as_signal(repo):
    res = go(make_gate(run=python_cmd("import os; os.abort()")), repo)
    assert res.outcome == "FAIL"
    assert res.signal == "SIGABRT"
    assert res.reason == "killed by SIGABRT"
    assert res.exit_code is None


def test_shell_reports_a_killed_command(repo):
    res = go(make_gate(run=python_cmd("import os; os.abort()").removeprefix("exec ") + "; exit $?"), repo)
    assert res.outcome == "FAIL"
    assert res.exit_code == 134
    assert "SIGABRT" in res.reason


def test_timeout_kills_the_whole_group(repo, tmp_path):
    pidfile = tmp_path / "bg.pid"
    gate = make_gate(run=f"sleep 1000 & echo $! > {pidfile}; sleep 1000", timeout=1)
    t0 = time.monotonic()
    res = go(gate, repo)
    elapsed = time.monotonic() - t0
    assert res.outcome == "FAIL"
    assert res.reason == "timed out after 1 s"
    assert elapsed < 5
    bg = int(pidfile.read_text())
    assert wait_gone(bg), f"background process {bg} survived the timeout"
    assert "[runner] timed out" in res.log_tail


def test_timeout_escalates_to_sigkill_when_term_is_ignored(repo, tmp_path):
    pidfile = tmp_path / "bg.pid"
    gate = make_gate(run=f"trap '' TERM; sleep 1000 & echo $! > {pidfile}; sleep 1000", timeout=1)
    t0 = time.monotonic()
    res = go(gate, repo, grace_s=0.3)
    assert res.outcome == "FAIL" and res.reason.startswith("timed out")
    assert time.monotonic() - t0 < 5
    assert wait_gone(int(pidfile.read_text()))


def test_lingering_grandchild_is_ended_after_child_exits(repo, tmp_path):
    pidfile = tmp_path / "bg.pid"
    gate = make_gate(run=f"sleep 1000 & echo $! > {pidfile}; exit 0")
    t0 = time.monotonic()
    res = go(gate, repo)
    assert res.outcome == "PASS"
    assert time.monotonic() - t0 < 5
    bg = int(pidfile.read_text())
    assert wait_gone(bg), f"left-over process {bg} is still running"
    assert "left running" in res.log_tail


def test_invalid_metrics_json_is_an_error(repo):
    res = go(make_gate(run="""echo '{not json' > "$RUNNER_METRICS" """), repo)
    assert res.outcome == "ERROR"
    assert "not valid JSON" in res.reason


def test_metrics_not_an_object_is_an_error(repo):
    res = go(make_gate(run="""echo '[1, 2]' > "$RUNNER_METRICS" """), repo)
    assert res.outcome == "ERROR"
    assert "list" in res.reason


@pytest.mark.parametrize("value", ['[[1]]', '["a"]', '[true]', '{"a": 1}'])
def test_nested_metric_value_is_an_error(repo, value):
    """A list of numbers is a metric's samples; anything else that is not a scalar is an error."""
    res = go(make_gate(run=f"""echo '{{"rows": {value}}}' > "$RUNNER_METRICS" """), repo)
    assert res.outcome == "ERROR"
    assert "'rows'" in res.reason


def test_a_list_of_numbers_is_a_metrics_samples(repo):
    res = go(make_gate(run="""echo '{"rows": [1, 2.5]}' > "$RUNNER_METRICS" """), repo)
    assert res.outcome == "PASS" and res.metrics == {"rows": [1, 2.5]}


def test_missing_metric_fails_and_is_not_zero(repo):
    res = go(make_gate(run="true", expect={"speedup": "<= 10"}), repo)
    assert res.outcome == "FAIL"
    assert res.metrics == {}
    (check,) = res.checks
    assert check.value is None and check.ok is False and check.reason == "not reported"
    assert "speedup: not reported" in res.reason


def test_nan_metric_fails(repo):
    res = go(make_gate(run="""echo '{"max_err": NaN}' > "$RUNNER_METRICS" """,
                       expect={"max_err": "<= 0.01"}), repo)
    assert res.outcome == "FAIL"
    assert "NaN" in res.reason


def test_metrics_still_recorded_when_the_gate_fails(repo):
    res = go(make_gate(run="""printf '{"speedup": 3}' > "$RUNNER_METRICS"; exit 1""",
                       expect={"speedup": ">= 1"}), repo)
    assert res.outcome == "FAIL" and res.reason == "exited with code 1"
    assert res.metrics == {"speedup": 3}


def test_environment_cwd_and_stdin(repo):
    gate = make_gate(
        name="env-check",
        run=(
            'test "$MY_VAR" = from-gate && test "$RUNNER_GATE" = env-check '
            '&& test "$EXTRA" = from-run && test "$(pwd -P)" = "$(cd "$EXPECT_ROOT" && pwd -P)" '
            '&& test -n "$RUNNER_PROGRESS" && test -f "$RUNNER_PROGRESS" '
            '&& case "$PYTHONPATH" in "$EXPECT_ROOT"*) true;; *) false;; esac '
            "&& ! read -r line"
        ),
        env={"MY_VAR": "from-gate", "EXPECT_ROOT": str(repo.resolve())},
    )
    res = go(gate, repo, env={"EXTRA": "from-run", "MY_VAR": "overridden-by-gate"})
    assert res.outcome == "PASS", res.log_tail


def test_log_tail_is_bounded(repo):
    res = go(make_gate(run="for i in $(seq 1 500); do echo line-$i; done"), repo)
    lines = res.log_tail.splitlines()
    assert len(lines) == execute.LOG_TAIL_LINES
    assert lines[-1] == "line-500"
    big = go(make_gate(name="big", run=python_cmd("print('x' * 100000)")), repo)
    assert len(big.log_tail.encode()) <= execute.LOG_TAIL_BYTES


def test_log_relative_to_report_dir(repo, tmp_path):
    report = tmp_path / "report"
    res = run_gate(make_gate(run="true"), repo_root=repo, log_path=report / "logs" / "g.log",
                   report_dir=report)
    assert res.log == "logs/g.log"


def test_unstartable_command_is_an_error(tmp_path):
    res = run_gate(make_gate(run="true"), repo_root=tmp_path / "missing", log_path=tmp_path / "g.log")
    assert res.outcome == "ERROR"
    assert "could not start" in res.reason


def test_duck_typed_gate(repo):
    res = go(DuckGate(name="duck", run="exit 0"), repo)
    assert res.outcome == "PASS" and res.kind == "build"


def test_interrupt_ends_group_and_reraises(repo, tmp_path, monkeypatch):
    pidfile = tmp_path / "bg.pid"
    real_wait = subprocess.Popen.wait

    def interrupted_wait(self, timeout=None):
        if timeout is not None and timeout > 100:
            deadline = time.monotonic() + 300  # a readiness signal: the gate wrote its child's pid
            while not pidfile.exists() or not pidfile.read_text().strip():
                assert time.monotonic() < deadline
                time.sleep(0.02)
            raise KeyboardInterrupt
        return real_wait(self, timeout=timeout)

    monkeypatch.setattr(subprocess.Popen, "wait", interrupted_wait)
    gate = make_gate(run=f"sleep 1000 & echo $! > {pidfile}; sleep 1000", timeout=1000)
    with pytest.raises(KeyboardInterrupt):
        go(gate, repo)
    assert wait_gone(int(pidfile.read_text()))


# --- callable gates ---------------------------------------------------------------------------


def test_callable_pass(repo):
    mod = write_gate_module(repo)
    gate = make_gate(call=f"{mod}:ok", args={"n": 3}, expect={"speedup": ">= 2.5"})
    res = go(gate, repo)
    assert res.outcome == "PASS", res.log_tail
    assert res.metrics == {"speedup": 3.0, "count": 3, "label": "x", "exact": True}


def test_callable_runs_from_repo_root(repo):
    mod = write_gate_module(repo)
    gate = make_gate(call=f"{mod}:where", env={"EXPECT_ROOT": str(repo)})
    res = go(gate, repo)
    assert res.outcome == "PASS", res.log_tail
    assert res.metrics == {"cwd_is_root": True}


def test_callable_that_raises_fails_with_traceback(repo):
    mod = write_gate_module(repo)
    res = go(make_gate(call=f"{mod}:boom"), repo)
    assert res.outcome == "FAIL"
    assert "ValueError: boom went the gate" in res.reason
    assert "Traceback" in res.log_tail


@pytest.mark.parametrize(
    ("target", "args", "needle"),
    [
        ("no_such_module_xyz:f", {}, "could not import no_such_module_xyz"),
        ("gatemod:missing", {}, "has no attribute 'missing'"),
        ("gatemod:ok", {"bogus": 1}, "cannot call gatemod:ok"),
    ],
)
def test_callable_that_cannot_load_is_an_error(repo, target, args, needle):
    write_gate_module(repo)
    res = go(make_gate(call=target, args=args), repo)
    assert res.outcome == "ERROR"
    assert needle in res.reason


def test_callable_returning_non_dict_fails(repo):
    mod = write_gate_module(repo)
    res = go(make_gate(call=f"{mod}:returns_list"), repo)
    assert res.outcome == "FAIL"
    assert "returned list, expected a dict" in res.reason
    nested = go(make_gate(name="nested", call=f"{mod}:returns_nested"), repo)
    assert nested.outcome == "FAIL" and "'rows'" in nested.reason


def test_callable_returning_samples_reports_them(repo):
    mod = write_gate_module(repo)
    res = go(make_gate(call=f"{mod}:returns_samples", expect={"ms": "<= 2"}), repo)
    assert res.outcome == "PASS", res.reason
    assert res.metrics == {"ms": [1.0, 2, 1.5, 1.25, 1.75, 1.5], "label": "x"}
    assert res.checks[0].interval == [1.0, 2.0] and res.checks[0].samples == 6


def test_callable_nan_metric_fails(repo):
    mod = write_gate_module(repo)
    res = go(make_gate(call=f"{mod}:nan", expect={"max_err": "<= 0.01"}), repo)
    assert res.outcome == "FAIL"
    assert res.checks[0].reason == "is NaN"


def test_callable_exit_code_three_without_status_is_a_failure(repo):
    mod = write_gate_module(repo)
    res = go(make_gate(call=f"{mod}:exits_three"), repo)
    assert res.outcome == "FAIL"
    assert res.reason == "exited with code 3"


# --- run_steps --------------------------------------------------------------------------------


class FakeRunner:
    def __init__(self, outcomes: dict[str, str]):
        self.outcomes = outcomes
        self.calls: list[tuple[str, Path]] = []

    def __call__(self, gate, *, repo_root, log_path, env=None, report_dir=None, on_progress=None):
        self.calls.append((gate.name, log_path))
        return GateResult(
            name=gate.name, kind=gate.kind, outcome=self.outcomes.get(gate.name, "PASS"),
            reason="fake", metrics={}, checks=[], started="2024-01-01T00:00:00Z",
            duration_s=0.0, exit_code=0, signal=None, log=log_path.name, log_tail="",
        )


def test_run_steps_blocks_stops_and_skips(tmp_path):
    steps = [
        Step(make_gate("build", "build", run="x")),
        Step(make_gate("gpu", "verify", run="x"), action="blocked", reason="needs cuda"),
        Step(make_gate("verify", "verify", run="x")),
        Step(make_gate("bench", "benchmark", run="x")),
        Step(make_gate("gpu-bench", "benchmark", run="x"), action="blocked", reason="needs cuda"),
    ]
    fake = FakeRunner({"verify": "FAIL"})
    seen: list[str] = []
    results = run_steps(steps, repo_root=tmp_path, log_dir=tmp_path / "logs",
                        on_result=lambda r: seen.append(r.name), run_gate_fn=fake)
    assert [(r.name, r.outcome) for r in results] == [
        ("build", "PASS"), ("gpu", "BLOCKED"), ("verify", "FAIL"),
        ("bench", "SKIPPED"), ("gpu-bench", "SKIPPED"),
    ]
    assert [name for name, _ in fake.calls] == ["build", "verify"]
    assert results[1].reason == "needs cuda" and results[1].log is None
    assert "'verify' failed" in results[3].reason
    assert seen == ["build", "gpu", "verify", "bench", "gpu-bench"]
    assert fake.calls[0][1] == tmp_path / "logs" / "build.log"


def test_run_steps_error_stops_too(tmp_path):
    steps = [Step(make_gate("a", run="x")), Step(make_gate("b", run="x"))]
    results = run_steps(steps, repo_root=tmp_path, log_dir=tmp_path,
                        run_gate_fn=FakeRunner({"a": "ERROR"}))
    assert [r.outcome for r in results] == ["ERROR", "SKIPPED"]


def test_run_steps_keep_going_runs_past_failures_but_not_unverified_benchmarks(tmp_path):
    steps = [
        Step(make_gate("build", "build", run="x")),
        Step(make_gate("verify", "verify", run="x")),
        Step(make_gate("bench", "benchmark", run="x")),
    ]
    fake = FakeRunner({"build": "FAIL"})
    results = run_steps(steps, repo_root=tmp_path, log_dir=tmp_path, run_gate_fn=fake, keep_going=True)
    assert [(r.name, r.outcome) for r in results] == [("build", "FAIL"), ("verify", "PASS"), ("bench", "PASS")]
    fake = FakeRunner({"verify": "FAIL"})
    results = run_steps(steps, repo_root=tmp_path, log_dir=tmp_path, run_gate_fn=fake, keep_going=True)
    assert [(r.name, r.outcome) for r in results] == [("build", "PASS"), ("verify", "FAIL"), ("bench", "SKIPPED")]
    assert "verify gate 'verify' is FAIL" in results[2].reason
    assert [name for name, _ in fake.calls] == ["build", "verify"]


def test_run_steps_rejects_unknown_action(tmp_path):
    with pytest.raises(ValueError, match="unknown action"):
        run_steps([Step(make_gate(run="x"), action="maybe")], repo_root=tmp_path,
                  log_dir=tmp_path, run_gate_fn=FakeRunner({}))


def test_run_steps_with_real_processes(repo, tmp_path):
    steps = [Step(make_gate("one", run="echo one")), Step(make_gate("two", run="exit 2")),
             Step(make_gate("three", run="echo three"))]
    results = run_steps(steps, repo_root=repo, log_dir=tmp_path / "logs")
    assert [r.outcome for r in results] == ["PASS", "FAIL", "SKIPPED"]
    assert (tmp_path / "logs" / "one.log").read_text() == "one\n"
    assert not (tmp_path / "logs" / "three.log").exists()


def test_no_group_member_left_after_a_run(repo, tmp_path):
    pidfile = tmp_path / "pg"
    res = go(make_gate(run=f"echo $$ > {pidfile}; (sleep 1000 &); sleep 0.1"), repo)
    assert res.outcome == "PASS"
    pgid = int(pidfile.read_text())
    deadline = time.monotonic() + 3
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert group_alive(pgid) == []
