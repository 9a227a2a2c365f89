"""Gate output the runner cannot trust: each bad metrics, progress or artifacts file is a
recorded FAIL/ERROR with a reason, never a traceback, a hang, or an unbounded read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runner import untrusted
from runner.gates import output as gateoutput
from runner.gates.execute import run_gate
from runner.protocol import ARTIFACTS_ENV, STATUS_ENV
from tests.runner.gate_helpers import make_gate, python_cmd


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    return root


def go(gate, repo: Path, **kwargs):
    return run_gate(gate, repo_root=repo, log_path=repo.parent / "logs" / f"{gate.name}.log", grace_s=0.5, **kwargs)


def metrics_gate(shell: str, **fields):
    return make_gate("m", "verify", run=shell, timeout=60, **fields)


@pytest.mark.parametrize("shell, needle", [
    ('rm -f "$RUNNER_METRICS"; mkfifo "$RUNNER_METRICS"', "FIFO"),
    ('ln -sf /dev/zero "$RUNNER_METRICS"', "symbolic link"),
    ('mkfifo "$RUNNER_METRICS.fifo"; ln -sf "$RUNNER_METRICS.fifo" "$RUNNER_METRICS"', "symbolic link"),
    ('truncate -s 1G "$RUNNER_METRICS"', "over the"),
    ('mkdir "$RUNNER_METRICS"', "folder"),
    (python_cmd("import os; open(os.environ['RUNNER_METRICS'],'w').write('['*100000 + ']'*100000)"), "levels deep"),
    (python_cmd("import os; open(os.environ['RUNNER_METRICS'],'w').write('{\"a\": ' + '['*2000 + ']'*2000 + '}')"), "levels deep"),
    (python_cmd("import os; open(os.environ['RUNNER_METRICS'],'w').write('{\"a\": 1' + '0'*5000 + '}')"), "digits"),
    (python_cmd("import os; open(os.environ['RUNNER_METRICS'],'w').write('{\"a\": 1' + '0'*320 + '}')"), "range of a float"),
    (python_cmd("import os; open(os.environ['RUNNER_METRICS'],'w').write('{\"a\": \"\\\\ud800\"}')"), "surrogate"),
    (python_cmd("import os; open(os.environ['RUNNER_METRICS'],'w').write('{\"\\\\udfff\": 1}')"), "surrogate"),
    (python_cmd("import os; open(os.environ['RUNNER_METRICS'],'wb').write(b'{\"a\": \"\\xed\\xa0\\x80\"}')"), "not UTF-8"),
])
def test_bad_metrics_files_are_an_error_with_a_reason(repo, shell, needle):
    result = go(metrics_gate(shell, expect={"a": ">= 0"}), repo)
    assert result.outcome == "ERROR", result
    assert needle in result.reason
    assert len(result.reason) < 300


def test_timeout_is_enforced_when_the_progress_file_is_a_fifo(repo):
    gate = make_gate("p", "verify", run='rm -f "$RUNNER_PROGRESS"; mkfifo "$RUNNER_PROGRESS"; exec sleep 60',
                     timeout=1)
    seen = []
    result = go(gate, repo, on_progress=lambda *args: seen.append(args))
    assert result.outcome == "FAIL" and "timed out" in result.reason


def test_progress_file_replaced_by_a_link_to_dev_zero_is_ignored(repo):
    gate = make_gate("p", "verify", run='ln -sf /dev/zero "$RUNNER_PROGRESS"; exec sleep 60', timeout=1)
    result = go(gate, repo, on_progress=lambda *args: None)
    assert result.outcome == "FAIL" and "timed out" in result.reason


def test_artifact_fifo_and_huge_and_many_files_are_skipped(repo):
    code = (
        "import os; d=os.environ['%s']\n"
        "os.mkfifo(os.path.join(d, 'a-fifo'))\n"
        "open(os.path.join(d, 'b-huge'), 'w').truncate(1 << 30)\n"
        "os.symlink('/dev/zero', os.path.join(d, 'c-link'))\n"
        "[open(os.path.join(d, 'f%%05d' %% i), 'w').write('x') for i in range(3000)]\n" % ARTIFACTS_ENV
    )
    result = go(make_gate("a", "verify", run=python_cmd(code), timeout=60), repo)
    assert result.outcome == "PASS", result
    assert "a-fifo" not in result.artifacts and "b-huge" not in result.artifacts and "c-link" not in result.artifacts
    assert len(result.artifacts) <= 20


# --- the reader itself ----------------------------------------------------------------------


def test_read_bounded_fifo_does_not_block(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(untrusted.UntrustedFileError, match="FIFO"):
        untrusted.read_bounded(fifo, 100)


def test_read_bounded_tail_and_missing(tmp_path):
    assert untrusted.read_bounded(tmp_path / "none", 10) is None
    (tmp_path / "f").write_bytes(b"x" * 100 + b"END")
    assert untrusted.read_bounded(tmp_path / "f", 3, tail=True) == b"END"
    with pytest.raises(untrusted.UntrustedFileError, match="over the 3-byte limit"):
        untrusted.read_bounded(tmp_path / "f", 3)


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": -1e999}', '{"a": 1.5, "b": "x", "c": [1, {"d": 2}]}',
                                  '{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}',
                                  '{"a": "\\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}'])
def test_parse_json_accepts_what_json_module_accepts(text):
    assert repr(untrusted.parse_json(text)) == repr(json.loads(text))


def test_progress_reads_the_last_good_line(tmp_path):
    path = tmp_path / "p"
    path.write_text('{"done": 1, "total": 5}\n' + "garbage\n" * 10000 + '{"done": 3, "total": 5}\nnot json\n')
    assert gateoutput.read_progress(path) == (3, 5)
    path.write_text('{"done": 1' + "0" * 5000 + "}\n")
    assert gateoutput.read_progress(path) == (None, None)


def test_status_file_replaced_by_a_fifo_does_not_hang_the_verdict(repo):
    (repo / "evil_status.py").write_text(
        "import os\n"
        "def run():\n"
        "    path = os.environ['%s']\n"
        "    if os.path.exists(path):\n"
        "        os.unlink(path)\n"
        "    os.mkfifo(path)\n"
        "    os._exit(0)\n" % STATUS_ENV
    )
    result = go(make_gate("s", "verify", call="evil_status:run", timeout=60), repo)
    assert result.outcome in ("PASS", "FAIL", "ERROR")  # judged on its exit status; above all, it returned


@pytest.mark.parametrize("content", [b'{"status": "raised", "message": "' + b"x" * (1 << 17) + b'"}',
                                     b'{"status": ["raised"]}', b'{"status": "nonsense"}', b"[" * 100])
def test_read_status_refuses_what_a_child_could_not_have_written(tmp_path, content):
    path = tmp_path / "status.json"
    path.write_bytes(content)
    assert gateoutput.read_status(path, {"raised", "ok"}) is None
    path.write_bytes(b'{"status": "raised", "message": {"a": 1}}')
    assert gateoutput.read_status(path, {"raised"}) == ("raised", "{'a': 1}")


def test_artifact_listing_reads_a_bounded_number_of_entries(tmp_path, monkeypatch):
    from runner.gates import execute

    folder = tmp_path / "artifacts"
    folder.mkdir()
    for i in range(execute.MAX_ARTIFACT_ENTRIES * 3):
        (folder / f"f{i:05d}").write_text("x")
    pulled = []
    real_scandir = os.scandir

    class Counting:
        def __init__(self, path):
            self.inner = real_scandir(path)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.inner.close()

        def __iter__(self):
            for entry in self.inner:
                pulled.append(entry.name)
                yield entry

    monkeypatch.setattr(execute.os, "scandir", Counting)
    notes = []

    class Log:
        def write(self, data):
            notes.append(data.decode())

    artifacts = execute._read_artifacts(folder, Log())
    assert len(pulled) <= execute.MAX_ARTIFACT_ENTRIES + 1
    assert len(artifacts) == 20
    assert any("more than" in note for note in notes)
