"""The sample runner output in README.md and docs/runner.md, and docs/report-example.html, match
what the runner prints (for the tracked runs, the noisy benchmark and the toy plan's tour): when
a run is added or the runner's output changes, this says so (``python docs/examples.py``
regenerates them)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs a git checkout: the samples come from the tracked runs")
def test_the_documented_examples_match_the_tracked_runs():
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "examples.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
