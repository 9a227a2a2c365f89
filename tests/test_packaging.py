"""The two wings and the one-way door between them, as installed and as imported.

``pip install .`` puts the runner alone into site-packages (a ``phases`` package installed
there would hide a user's own ``phases/`` folder); the campaign imports nothing of the runner
but ``runner.gatekit``.
"""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = ("kernel", "phases", "serving")


def _setuptools_can_build() -> bool:
    if importlib.util.find_spec("setuptools") is None:
        return False
    from importlib.metadata import version

    return int(version("setuptools").split(".")[0]) >= 77


@pytest.mark.slow
@pytest.mark.skipif(not _setuptools_can_build(), reason="needs setuptools >= 77 to build the wheel offline")
def test_the_wheel_holds_the_runner_alone(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in ("runner", *CAMPAIGN):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
         str(tmp_path / "wheel"), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    assert "project.license" not in build.stderr  # a TOML table there makes setuptools warn on every build
    [wheel] = (tmp_path / "wheel").glob("*.whl")
    top_level = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"runner"}
    assert any(name.endswith("templates/report.md.j2") for name in zipfile.ZipFile(wheel).namelist())


@pytest.mark.parametrize("wing", CAMPAIGN)
def test_the_campaign_imports_only_the_gate_kit_of_the_runner(wing):
    for path in sorted((ROOT / wing).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "runner":
                    assert name == "runner.gatekit", f"{path.relative_to(ROOT)} imports {name}"
