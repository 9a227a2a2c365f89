"""Everything checkable before the gates run: a gate module is never imported in the runner's
process, paths and the reports folder stay inside the repository and out of .gitignore, output
options name writable places; a signal during start-up exits 130 without a traceback."""

from __future__ import annotations

import os
import signal
import time

import pytest

from runner.errors import ExitCode
from runner.gates import preflight
from tests.runner.gate_helpers import sigint_raises
from tests.runner.repo_fixtures import cli, default_phases, gate, make_repo, write


def _call_phases(call: str):
    phases = default_phases()
    phases[0]["gates"] = [{"name": "probe", "kind": "verify", "call": call}]
    return phases


# a module whose source cannot say whether `run` exists (module __getattr__), so only an import can
_EXITS = "import os\nos._exit(0)\ndef __getattr__(name):\n    raise AttributeError(name)\n"
_BLOCKS = "import time\ntime.sleep(1000)\ndef __getattr__(name):\n    raise AttributeError(name)\n"


@pytest.mark.parametrize("body", [_EXITS, _BLOCKS], ids=["exits", "blocks"])
def test_a_module_that_exits_or_blocks_at_import_cannot_end_the_runner(tmp_path, runner_env, body, monkeypatch):
    monkeypatch.setattr(preflight, "IMPORT_CHECK_TIMEOUT_S", 2.0)
    repo = make_repo(tmp_path / "repo", _call_phases("gatemod:run"))
    write(repo.root, "gatemod.py", body)
    started = time.monotonic()
    result = cli(runner_env, repo.root, "advance", "--dry-run")
    assert time.monotonic() - started < 60
    assert result.exit_code == 0, result.text
    assert "probe: run" in result.stdout and "dry run: nothing was changed" in result.stdout


def test_import_check_still_finds_a_missing_function(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", _call_phases("gatemod:run"))
    write(repo.root, "gatemod.py", "names = {}\nglobals().update(names)\n")
    result = cli(runner_env, repo.root, "advance", "--dry-run")
    assert result.exit_code == ExitCode.USAGE and "no attribute 'run'" in result.stderr


@pytest.mark.parametrize("path", ["../outside", "/etc"])
def test_paths_outside_the_repository_are_refused(tmp_path, runner_env, path):
    phases = default_phases()
    phases[0]["paths"] = ["src/", path]
    repo = make_repo(tmp_path / "repo", phases)
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.USAGE and "outside the repository" in result.stderr
    assert not (repo.root / "reports").exists()


def test_ignored_reports_or_plan_is_refused(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    (repo.root / ".gitignore").write_text((repo.root / ".gitignore").read_text() + "reports/\n")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.USAGE and "ignored by git" in result.stderr
    (repo.root / ".gitignore").write_text("plans/\n")
    result = cli(runner_env, repo.root, "advance", "--dry-run")
    assert result.exit_code == ExitCode.USAGE and "the plan is ignored" in result.stderr


def test_reports_linked_outside_the_repository_is_refused(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (repo.root / "reports").symlink_to(outside)
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.USAGE and "symbolic link" in result.stderr
    assert list(outside.iterdir()) == []
    (repo.root / "reports").unlink()
    (repo.root / "reports" / "demo").mkdir(parents=True)
    (repo.root / "reports" / "demo" / "alpha").symlink_to(outside)
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.USAGE and "symbolic link" in result.stderr
    assert list(outside.iterdir()) == []


def test_output_options_are_checked_before_the_gates(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["gates"] = [gate("build", "build", "touch ran")]
    repo = make_repo(tmp_path / "repo", phases)
    folder = tmp_path / "a-folder"
    folder.mkdir()
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for args in (["--out", str(folder)], ["--junit", str(folder)], ["--logs", str(a_file)],
                 ["--out", str(a_file / "x.json")]):
        result = cli(runner_env, repo.root, "gate", "alpha", *args)
        assert result.exit_code == ExitCode.USAGE, (args, result.text)
        assert not (repo.root / "ran").exists()
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        result = cli(runner_env, repo.root, "gate", "alpha", "--out", str(locked / "r.json"))
        assert result.exit_code == ExitCode.USAGE and "not writable" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_start_up_exits_130_without_a_traceback(monkeypatch, capsys, signum):
    import runner.cli
    from runner.__main__ import main

    def starting():
        # raise_signal, not os.kill: a signal sent to the process may land on another thread
        # (a library's), which leaves this thread's sleep uninterrupted and the handler late
        signal.raise_signal(signum)
        time.sleep(10)  # the handler raises before this; a signal dropped fails the test then

    monkeypatch.setattr(runner.cli, "main", starting)
    with sigint_raises(), pytest.raises(SystemExit) as exit_info:  # SIGTERM: main's own handler
        main()
    assert exit_info.value.code == 130
    err = capsys.readouterr().err
    assert err.strip() == "runner: interrupted" and "Traceback" not in err
