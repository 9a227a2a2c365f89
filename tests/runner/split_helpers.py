"""A phase whose gates run in several jobs: a plan of three gates whose outcomes are steered from
outside the tree, a GPU host's copy, and the jobs that run some of its gates."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.runner.repo_fixtures import METRICS_OK, Repo, cli, copy_without_git, default_phases, gate, make_repo

RUN_FOLDER = re.compile(r"reports/demo/alpha/[^/]+/")


def split_phases(flags: Path) -> list[dict]:
    """``alpha``: build, check (verify; FAILs while ``flags/check-fails`` exists) and bench
    (benchmark, samples; FAILs while ``flags/bench-fails`` exists)."""
    phases = default_phases()
    phases[0]["gates"] = [
        gate("build", "build", "echo building"),
        gate("check", "verify", f'test ! -e "{flags}/check-fails" && {METRICS_OK}',
             expect={"speedup": ">= 1.5", "errors": "== 0"}),
        gate("bench", "benchmark", f'test ! -e "{flags}/bench-fails" && '
                                   """printf '{"ms": [4, 5, 6, 5, 4, 6, 5]}' > "$RUNNER_METRICS" """,
             expect={"ms": "<= 10"}),
    ]
    return phases


def split_repo(tmp_path: Path) -> tuple[Repo, Path, Path]:
    """The repository, its GPU host's copy and the folder of the flags that steer the gates."""
    flags = tmp_path / "flags"
    flags.mkdir()
    repo = make_repo(tmp_path / "repo", split_phases(flags))
    host = copy_without_git(repo.root, tmp_path / "host")
    return repo, host, flags


def job(env, host: Path, out: Path, *args: str):
    """``runner gate alpha ARGS --out OUT`` on the host."""
    return cli(env, host, "gate", "alpha", *args, "--out", str(out))


def coverage(path: Path, phase: str = "alpha") -> dict | None:
    [held] = [p for p in json.loads(path.read_text())["phases"] if p["phase"] == phase]
    return held.get("coverage")


def committed(repo: Repo) -> list[str]:
    """The files the last commit changed, with the run folder's name as ``RUN``."""
    names = repo.git("diff", "--name-only", "HEAD~1", "HEAD").split()
    return sorted(RUN_FOLDER.sub("reports/demo/alpha/RUN/", name) for name in names)


def trailers(repo: Repo) -> list[str]:
    return [line for line in repo.git("log", "-1", "--format=%B").splitlines() if line.startswith("Runner-")]
