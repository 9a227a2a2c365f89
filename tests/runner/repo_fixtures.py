"""Throwaway repositories with a small plan, and helpers to drive the CLI in them (the
fixtures built on them, ``runner_env`` and ``gpu_results``, are in ``tests/runner/conftest.py``)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from runner.cli import app
from runner.records.machine import MachineInfo, parse_devices

PY = shlex.quote(sys.executable)

GITIGNORE = "__pycache__/\n/.runner.lock\n/ignored/\n"

# A gate that reports the metrics the default plan expects.
METRICS_OK = """printf '{"speedup": 2.5, "errors": 0}' > "$RUNNER_METRICS" """


def gate(name: str, kind: str = "verify", run: str = "true", **fields: Any) -> dict[str, Any]:
    return {"name": name, "kind": kind, "run": run, **fields}


def default_phases() -> list[dict[str, Any]]:
    """``alpha`` (a build and a verify gate with thresholds), then ``beta`` (needs cuda)."""
    return [
        {
            "id": "alpha",
            "title": "First phase",
            "status": "pending",
            "paths": ["src/"],
            "headline": ["speedup", "errors"],
            "gates": [
                gate("build", "build", "echo building"),
                gate("check", "verify", METRICS_OK, expect={"speedup": ">= 1.5", "errors": "== 0"}),
            ],
        },
        {
            "id": "beta",
            "title": "Second phase",
            "status": "pending",
            "paths": ["docs/"],
            "gates": [gate("gpu", "verify", "true", requires=["cuda"])],
        },
    ]


def gpu_phases() -> list[dict[str, Any]]:
    """``default_phases`` with alpha's check needing cuda and writing an artifact."""
    phases = default_phases()
    phases[0]["gates"] = [
        gate("build", "build", "echo building"),
        gate("check", "verify",
             METRICS_OK + '; printf "| size | ms |\\n|---|---|\\n| 1 | 0.5 |\\n" > "$RUNNER_ARTIFACTS/bench.md"',
             requires=["cuda"], expect={"speedup": ">= 1.5", "errors": "== 0"}),
    ]
    return phases


def edit_results(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data["phases"][0])
    path.write_text(json.dumps(data))


def plan_text(phases: list[dict[str, Any]], plan_id: str = "demo") -> str:
    """A Markdown plan; values are written as JSON, which is YAML."""
    lines = ["---", "schema: 1", f"id: {plan_id}", "title: Demo plan", "phases:"]
    for phase in phases:
        first = True
        for key, value in phase.items():
            prefix = "  - " if first else "    "
            first = False
            if key == "gates":
                lines.append(f"{prefix}gates:")
                for item in value:
                    gate_first = True
                    for gate_key, gate_value in item.items():
                        gate_prefix = "      - " if gate_first else "        "
                        gate_first = False
                        lines.append(f"{gate_prefix}{gate_key}: {json.dumps(gate_value)}")
            else:
                lines.append(f"{prefix}{key}: {json.dumps(value)}")
    lines += [
        "---",
        "# Demo plan",
        "",
        "Prose the runner never touches.",
        "",
        "<!-- runner:status:begin -->",
        "<!-- runner:status:end -->",
        "",
    ]
    return "\n".join(lines)


def git(root: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)}: {proc.stderr}")
    return proc.stdout


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@dataclass
class Repo:
    root: Path

    @property
    def plan(self) -> Path:
        return self.root / "plans" / "demo.md"

    def git(self, *args: str, check: bool = True) -> str:
        return git(self.root, *args, check=check)

    def head(self) -> str:
        return self.git("rev-parse", "HEAD").strip()

    def commit_count(self) -> int:
        return int(self.git("rev-list", "--count", "HEAD").strip())

    def porcelain(self) -> str:
        return self.git("status", "--porcelain=v1", "-uall")


def make_repo(root: Path, phases: list[dict[str, Any]] | None = None, *, git_init: bool = True) -> Repo:
    """A repository with ``plans/demo.md``, ``src/`` and ``docs/``, all committed."""
    root.mkdir(parents=True, exist_ok=True)
    write(root, ".gitignore", GITIGNORE)
    write(root, "plans/demo.md", plan_text(phases if phases is not None else default_phases()))
    write(root, "src/code.py", "VALUE = 1\n")
    write(root, "docs/notes.md", "notes\n")
    write(root, "unrelated.txt", "unrelated v1\n")
    if git_init:
        git(root, "init", "-q", "-b", "main")
        git(root, "config", "user.name", "Test Person")
        git(root, "config", "user.email", "test@example.com")
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", "base")
    return Repo(root)


def copy_without_git(src: Path, dest: Path) -> Path:
    """A plain copy of the work tree, as a GPU host receives it."""
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".git"))
    return dest


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` except ``.git`` and caches, with its bytes."""
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0] == ".git" or "__pycache__" in rel.parts or not path.is_file():
            continue
        files[rel.as_posix()] = path.read_bytes()
    return files


def fake_machine() -> MachineInfo:
    """A fixed machine whose devices follow ``RUNNER_DEVICES`` (no torch probe: fast)."""
    devices = parse_devices(os.environ.get("RUNNER_DEVICES")) or ["cpu"]
    return MachineInfo(
        hostname="testhost",
        platform="Linux-test",
        arch="x86_64",
        python="3.12.0",
        cpu_count=4,
        devices=devices,
        gpu_name="Test GPU" if "cuda" in devices else None,
        gpu_count=1 if "cuda" in devices else 0,
        torch="2.5.0",
        triton="3.2.0",
    )


@dataclass
class Outcome:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout + self.stderr


def cli(monkeypatch, cwd: Path, *args: str) -> Outcome:
    """Run ``runner <args>`` in-process from ``cwd``."""
    monkeypatch.chdir(cwd)
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return Outcome(result.exit_code, result.stdout, result.stderr)
