"""Run gates as isolated processes and turn what they did into ``GateResult`` records.

Each gate runs in its own session and process group, with stdin from ``/dev/null`` and
stdout and stderr going through one pipe that a thread drains into its log file
(``runner.gates.log``: the log keeps the first and the last MiB of the output, so a gate that
prints gigabytes cannot fill the disk). On a timeout
or an interrupt the whole group gets SIGTERM, then SIGKILL after a grace period; when the
gate's main process exits on its own, members of its group that are still running (a
forgotten ``sleep 1000 &``) are ended the same way. A process that starts a new session of
its own (``setsid`` after a double fork) leaves the group; once orphaned it is adopted by the
runner (a child subreaper, ``runner.gates.procgroup``), which ends it after the gate and says so
in the gate's reason and log. The runner stops reading the gate's output once the gate is over.

A gate killed by SIGKILL that the runner did not send is reported as ``killed by SIGKILL (out
of memory?)``: the kernel's out-of-memory killer is the usual sender.

The gate's ``PYTHONPATH`` starts with the repository root (so the project's own packages
import), followed by the folder this ``runner`` package was loaded from when that is elsewhere
(so a gate can import ``runner.gatekit``). A callable gate's child is started by the file path
of this runner's ``runner/gates/bootstrap.py``, which loads this runner's
``runner.gates.call`` by location: a repository with a ``runner`` of its own cannot hide it.

``$RUNNER_ARTIFACTS`` names a fresh folder for each gate: the small UTF-8 text files the gate
leaves directly in it (at most ``MAX_ARTIFACTS`` files of at most ``MAX_ARTIFACT_BYTES`` each)
come back in ``GateResult.artifacts``; anything else is skipped with a note in the log. Lines
``{"done": n, "total": m}`` the gate appends to ``$RUNNER_PROGRESS`` are passed to an optional
``on_progress`` callback while the gate runs.

``run_gate`` never raises for anything the gate does; a ``KeyboardInterrupt`` while waiting
ends the group and is re-raised.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import runner
from runner.gates import output as gateoutput
from runner.gates.log import HEAD_BYTES, CappedLog, OutputPump
from runner.gates.procgroup import adopt_orphans, end_escaped, end_group, own_children, with_parent_death_signal
from runner.protocol import ARTIFACT_NAME_PATTERN, MAX_ARTIFACT_BYTES, MAX_ARTIFACTS, GateFiles
from runner.gates.repeat import run_repeated
from runner.gates.verdict import Verdict, judge
from runner.records.results import GateResult
from runner.timeutil import iso_ms
from runner.untrusted import UntrustedFileError, read_bounded

LOG_TAIL_LINES = 60
MAX_ARTIFACT_ENTRIES = 10 * MAX_ARTIFACTS  # directory entries looked at, at most
LOG_TAIL_BYTES = 8 * 1024
_PROGRESS_POLL_S = 0.25  # how often a running gate's progress file is read

_ARTIFACT_NAME = re.compile(ARTIFACT_NAME_PATTERN)

_RUNNER_ROOT = Path(runner.__file__).resolve().parent.parent
_BOOTSTRAP = Path(__file__).resolve().with_name("bootstrap.py")  # a call: gate's child, by file path


class GateLike(Protocol):
    """The attributes of ``runner.plan.schema.Gate`` that execution reads."""

    name: str
    kind: str
    run: str | None
    call: str | None
    args: dict[str, Any]
    env: dict[str, str]
    timeout: float | None
    expect: Mapping[str, Any]


class StepLike(Protocol):
    """A planner step: run the gate, or record it as blocked with a reason."""

    gate: GateLike
    action: str
    reason: str


RunGateFn = Callable[..., GateResult]

ProgressFn = Callable[[str, float, "int | None", "int | None"], None]
"""Called while a gate runs with (gate name, seconds elapsed, done, total); the counts are
``None`` until the gate reports progress."""

StartFn = Callable[[str, Path], None]
"""Called as a gate's process is about to start, with (gate name, log file)."""


def run_gate(
    gate: GateLike,
    *,
    repo_root: Path,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    grace_s: float = 5.0,
    report_dir: Path | None = None,
    on_progress: ProgressFn | None = None,
) -> GateResult:
    """Run one gate to completion and check its ``expect`` thresholds.

    Args:
        gate: the gate (``runner.plan.schema.Gate`` or anything with the same attributes).
        repo_root: the working directory of the gate; also first on its ``PYTHONPATH``.
        log_path: file that receives the gate's stdout and stderr (created or replaced).
        env: extra variables for the gate, applied over the runner's environment and under
            the gate's own ``env:``; the ``RUNNER_*`` variables are set last.
        grace_s: seconds between SIGTERM and SIGKILL when the group must be ended.
        report_dir: the folder ``GateResult.log`` is relative to (default: the log's folder).
        on_progress: called about every quarter second while the gate runs (see ``ProgressFn``).
    """
    repo_root = Path(repo_root)
    log_path = Path(log_path)
    started = iso_ms()
    t0 = time.monotonic()
    log_rel = _relative_log(log_path, report_dir)

    def result(verdict: Verdict, artifacts: dict[str, str] | None = None, tail: str | None = None) -> GateResult:
        return GateResult(
            name=gate.name,
            kind=gate.kind,
            outcome=verdict.outcome,
            reason=verdict.reason,
            metrics=verdict.metrics,
            checks=verdict.checks,
            targets=verdict.targets,
            started=started,
            duration_s=round(time.monotonic() - t0, 3),
            exit_code=verdict.exit_code,
            signal=verdict.signal,
            log=log_rel,
            log_tail=_log_tail(log_path) if tail is None else tail,
            artifacts=artifacts or {},
        )

    scratch = Path(tempfile.mkdtemp(prefix="runner-gate-"))
    try:
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.write_bytes(b"")
        except OSError as exc:
            return result(Verdict("ERROR", f"could not create its log {log_path}: {exc.strerror or exc}"))
        try:
            argv = _command(gate)
        except ValueError as exc:
            return result(Verdict("ERROR", str(exc)))
        files = GateFiles.inside(scratch)
        files.progress.touch()
        files.artifacts.mkdir()
        child_env = _child_env(gate, repo_root, env, files)
        timeout = _timeout_of(gate)

        log = CappedLog(log_path)
        read_fd, write_fd = os.pipe()
        adopt_orphans()  # a process the gate starts in a new session comes back to us, see procgroup
        children_before = own_children()
        try:
            proc = subprocess.Popen(
                with_parent_death_signal(argv),
                cwd=repo_root,
                env=child_env,
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            os.close(read_fd)
            log.close()
            return result(Verdict("ERROR", f"could not start the gate: {exc}"))
        finally:
            os.close(write_fd)
        pump = OutputPump(read_fd, log).start()
        timed_out = False
        try:
            _wait(proc, timeout, gate.name, t0, files.progress, on_progress)
        except subprocess.TimeoutExpired:
            timed_out = True
            end_group(proc, grace_s)
            escaped = end_escaped(children_before, grace_s)
            pump.stop()
            _note(log, f"timed out after {timeout:g} s; its process group was ended")
        except BaseException:
            end_group(proc, grace_s)
            end_escaped(children_before, grace_s)
            pump.stop()
            _note(log, "interrupted; the gate's process group was ended")
            log.close()
            raise
        else:
            leftover = end_group(proc, grace_s)
            escaped = end_escaped(children_before, grace_s)
            pump.stop()
            if leftover:
                _note(log, f"ended {leftover} process(es) the gate left running")
        if escaped:
            _note(log, f"ended {len(escaped)} process(es) that left the gate's process group: {', '.join(escaped)}")
        artifacts = _read_artifacts(files.artifacts, log)
        if log.elided:
            _note(log, f"the log keeps the first and last {HEAD_BYTES >> 20} MiB of the output")
        log.close()

        tail = _log_tail(log_path)
        verdict = judge(gate, proc.returncode, timed_out, timeout, files, output=tail)
        if escaped:
            verdict = replace(verdict, reason=(
                f"{verdict.reason}; it left {len(escaped)} process(es) running outside its process "
                f"group (started in a new session), which the runner ended: {', '.join(escaped)}"
            ))
        return result(verdict, artifacts, tail)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_steps(
    steps: Iterable[StepLike],
    *,
    repo_root: Path,
    log_dir: Path,
    on_result: Callable[[GateResult], None] | None = None,
    run_gate_fn: RunGateFn = run_gate,
    env: Mapping[str, str] | None = None,
    report_dir: Path | None = None,
    on_progress: ProgressFn | None = None,
    keep_going: bool = False,
    on_start: StartFn | None = None,
) -> list[GateResult]:
    """Run the planner's steps in order and return one result per step.

    A ``blocked`` step becomes a BLOCKED result without a process. After the first FAIL or
    ERROR every remaining step is SKIPPED; with ``keep_going`` the later gates run anyway
    (to collect all the evidence in one run), except that a benchmark gate is SKIPPED unless
    every verify gate before it passed: correct before fast. A gate with ``repeat: N`` runs N
    times (``runner.gates.repeat``). Logs go to ``log_dir/<gate name>.log``;
    ``on_result`` is called with each result as soon as it is known. ``run_gate_fn`` is
    called like ``run_gate`` (tests pass a fake), ``on_progress`` included. ``on_start`` is
    called with the gate's name and its log file just before a gate's process starts.
    """
    log_dir = Path(log_dir)
    report_dir = Path(report_dir) if report_dir is not None else log_dir
    results: list[GateResult] = []
    stopped_by: GateResult | None = None
    used_names: set[str] = set()
    unverified: GateResult | None = None  # the first verify gate of this run that did not pass
    for step in steps:
        gate = step.gate
        if stopped_by is not None and not keep_going:
            res = GateResult.not_run(
                gate, "SKIPPED", f"not run: gate {stopped_by.name!r} {stopped_by.outcome.lower()}ed"
            )
        elif keep_going and gate.kind == "benchmark" and unverified is not None:
            res = GateResult.not_run(
                gate, "SKIPPED", f"not run: verify gate {unverified.name!r} is {unverified.outcome}, not PASS"
            )
        elif step.action == "blocked":
            res = GateResult.not_run(gate, "BLOCKED", step.reason)
        elif step.action == "run":
            log_path = log_dir / _log_name(gate.name, used_names)
            if on_start is not None:
                on_start(gate.name, log_path)
            res = run_repeated(
                gate,
                run_gate_fn=run_gate_fn,
                repo_root=repo_root,
                log_path=log_path,
                env=env,
                report_dir=report_dir,
                on_progress=on_progress,
            )
            if res.outcome in ("FAIL", "ERROR"):
                stopped_by = stopped_by or res
        else:
            raise ValueError(f"step for gate {gate.name!r} has unknown action {step.action!r}")
        if gate.kind == "verify" and res.outcome != "PASS" and unverified is None:
            unverified = res
        results.append(res)
        if on_result is not None:
            on_result(res)
    return results


# --- the process ----------------------------------------------------------------------------


def _command(gate: GateLike) -> list[str]:
    run, call = getattr(gate, "run", None), getattr(gate, "call", None)
    if run and call:
        raise ValueError(f"gate {gate.name!r} has both run and call")
    if run:
        return ["bash", "-c", run]
    if call:
        args = getattr(gate, "args", None) or {}
        return [sys.executable, str(_BOOTSTRAP), call, "--args-json", json.dumps(args)]
    raise ValueError(f"gate {gate.name!r} has neither run nor call")


def gate_environment(gate: GateLike, repo_root: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a gate's process starts with, less the ``RUNNER_*`` files: the runner's
    environment, ``extra``, the gate's ``env:``, and ``PYTHONPATH`` led by the repository root
    and this runner's folder (see the module docstring)."""
    env = dict(os.environ)
    env.update(extra or {})
    env.update(getattr(gate, "env", None) or {})
    path_entries = [str(Path(repo_root).resolve())]
    if _RUNNER_ROOT != Path(repo_root).resolve():
        path_entries.append(str(_RUNNER_ROOT))  # a gate's import of runner.gatekit
    if env.get("PYTHONPATH"):
        path_entries.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path_entries)
    return env


def _child_env(gate: GateLike, repo_root: Path, extra: Mapping[str, str] | None, files: GateFiles) -> dict[str, str]:
    env = gate_environment(gate, repo_root, extra)
    env.update(files.environment(gate.name))
    return env


def _timeout_of(gate: GateLike) -> float | None:
    timeout = getattr(gate, "timeout", None)
    return None if timeout is None else float(timeout)


def _wait(
    proc: subprocess.Popen,
    timeout: float | None,
    name: str,
    t0: float,
    progress_file: Path,
    on_progress: ProgressFn | None,
) -> None:
    """Wait for the gate's main process; ``subprocess.TimeoutExpired`` after ``timeout``.

    With ``on_progress``, wake up every ``_PROGRESS_POLL_S`` to report the latest progress.
    """
    if on_progress is None:
        proc.wait(timeout=timeout)
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        step = _PROGRESS_POLL_S
        if deadline is not None:
            step = min(step, max(deadline - time.monotonic(), 0.0))
        try:
            proc.wait(timeout=step)
            return
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                raise
        done, total = _read_progress(progress_file)
        on_progress(name, time.monotonic() - t0, done, total)


def _read_progress(path: Path) -> tuple[int | None, int | None]:
    """The last well-formed ``{"done": n, "total": m}`` line of the progress file."""
    return gateoutput.read_progress(path)


def _read_artifacts(folder: Path, log) -> dict[str, str]:
    """The small UTF-8 text files the gate left in its artifacts folder, by name.

    Sub-folders, links, files over ``MAX_ARTIFACT_BYTES``, files that are not UTF-8, names
    that are not plain (letters, digits, ``._-``) and files past the first ``MAX_ARTIFACTS``
    are skipped with a note in the log.
    """
    artifacts: dict[str, str] = {}
    try:
        with os.scandir(folder) as listing:  # a gate that leaves a million files costs no more
            entries = list(itertools.islice(listing, MAX_ARTIFACT_ENTRIES + 1))
    except OSError as exc:
        _note(log, f"could not list the artifacts folder: {exc}")
        return artifacts
    if len(entries) > MAX_ARTIFACT_ENTRIES:
        entries = entries[:MAX_ARTIFACT_ENTRIES]
        _note(log, f"the artifacts folder holds more than {MAX_ARTIFACT_ENTRIES} entries; only "
                   f"{MAX_ARTIFACT_ENTRIES} were looked at")
    entries.sort(key=lambda entry: entry.name)
    for entry in entries:
        skip = None
        if not entry.is_file(follow_symlinks=False):
            skip = "not a plain file"
        elif not _ARTIFACT_NAME.fullmatch(entry.name):
            skip = "name is not letters, digits and ._-"
        elif len(artifacts) >= MAX_ARTIFACTS:
            skip = f"more than {MAX_ARTIFACTS} artifacts"
        else:
            try:
                size = entry.stat(follow_symlinks=False).st_size
                if size > MAX_ARTIFACT_BYTES:
                    skip = f"{size} bytes, over the {MAX_ARTIFACT_BYTES}-byte limit"
                else:
                    data = read_bounded(Path(entry.path), MAX_ARTIFACT_BYTES, what="artifact")
                    artifacts[entry.name] = (data or b"").decode("utf-8")
            except UnicodeDecodeError:
                skip = "not UTF-8 text"
            except (OSError, UntrustedFileError) as exc:
                skip = f"unreadable ({exc})"
        if skip is not None:
            _note(log, f"artifact {entry.name!r} skipped: {skip}")
    return artifacts


def _note(log: CappedLog, text: str) -> None:
    log.write(f"\n[runner] {text}\n".encode())


# --- small helpers ----------------------------------------------------------------------------


def _log_name(gate_name: str, used: set[str]) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", gate_name).strip("-.") or "gate"
    name, n = f"{stem}.log", 1
    while name in used:
        n += 1
        name = f"{stem}-{n}.log"
    used.add(name)
    return name


def _relative_log(log_path: Path, report_dir: Path | None) -> str:
    base = Path(report_dir) if report_dir is not None else log_path.parent
    try:
        return log_path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return log_path.name


def _log_tail(log_path: Path) -> str:
    try:
        with open(log_path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - LOG_TAIL_BYTES))
            data = handle.read()
    except OSError:
        return ""
    lines = data.decode("utf-8", errors="replace").splitlines()
    if size > LOG_TAIL_BYTES and lines:
        lines = lines[1:]  # the first line was cut in the middle
    return "\n".join(lines[-LOG_TAIL_LINES:])
