"""Shared helpers for the execution tests: gates, planner steps and process checks."""

from __future__ import annotations

import shlex
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.plan.schema import Gate


def make_gate(name: str = "g", kind: str = "verify", **fields: Any) -> Gate:
    """A real ``runner.plan.schema.Gate``; ``expect`` values may be threshold strings."""
    return Gate.model_validate({"name": name, "kind": kind, **fields})


@dataclass
class DuckGate:
    """A gate that is not a ``Gate`` model, to show execution only reads attributes."""

    name: str
    kind: str = "build"
    run: str | None = None
    call: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    requires: list[str] = field(default_factory=list)
    timeout: float = 60.0
    expect: dict[str, Any] = field(default_factory=dict)


@dataclass
class Step:
    """Stand-in for the planner's step: run the gate, or record it as blocked."""

    gate: Any
    action: str = "run"
    reason: str = ""


def python_cmd(code: str) -> str:
    """A shell command that runs ``code`` with this interpreter (exec'd, so signals show)."""
    return f"exec {shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    state = stat[stat.rfind(b")") + 2 :].split()[0]
    return state not in (b"Z", b"X")


@contextmanager
def sigint_raises() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` in the block, whatever this process inherited.

    A test that sends itself SIGINT relies on Python's handler, which Python installs only when
    SIGINT was not ignored at start-up; a shell's background job (``make test &``, ``nohup``)
    starts with it ignored, and the signal is then dropped. The handler before is put back."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def group_alive(pgid: int) -> list[int]:
    """Live members of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry.name))
    return members


GATE_MODULE = '''
import os
import sys


def ok(n=2):
    return {"speedup": n * 1.0, "count": n, "label": "x", "exact": True}


def boom():
    raise ValueError("boom went the gate")


def returns_list():
    return [1, 2]


def returns_nested():
    return {"rows": [[1], [2]]}


def returns_samples():
    return {"ms": [1.0, 2, 1.5, 1.25, 1.75, 1.5], "label": "x"}


def nan():
    return {"max_err": float("nan")}


def exits_three():
    sys.exit(3)


def where():
    here = os.path.realpath(os.getcwd())
    return {"cwd_is_root": here == os.path.realpath(os.environ["EXPECT_ROOT"])}
'''


def write_gate_module(root: Path, name: str = "gatemod") -> str:
    """Write the test callables as ``root/<name>.py``; return the module name."""
    (root / f"{name}.py").write_text(GATE_MODULE)
    return name
