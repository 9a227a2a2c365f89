"""The runner stands alone: it imports nothing of the campaign and needs neither torch nor triton."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import runner

RUNNER = Path(runner.__file__).resolve().parent  # the installed runner, or this checkout's
FORBIDDEN = ("kernel", "phases", "serving", "torch", "triton", "numpy")


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted(RUNNER.rglob("*.py")), ids=lambda p: p.relative_to(RUNNER).as_posix())
def test_runner_module_imports_nothing_of_the_campaign_or_the_gpu_stack(path):
    bad = sorted(name for name in _imported_modules(path) if name.split(".")[0] in FORBIDDEN)
    assert bad == [], f"{path.name} imports {bad}"


def _loaded_after(code: str, packages: tuple[str, ...], timeout: float) -> list[str]:
    """The modules of ``packages`` loaded once ``code`` ran in a fresh interpreter."""
    script = (
        "import sys\n"
        f"{code}\n"
        f"print(sorted(n for n in sys.modules if n.split('.')[0] in {packages!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=RUNNER.parent, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr
    return ast.literal_eval(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["status", "--help"], ["gate", "--help"]])
def test_cli_starts_without_torch_or_triton(argv):
    code = (
        "from typer.testing import CliRunner\n"
        "from runner.cli import app\n"
        f"result = CliRunner().invoke(app, {argv!r})\n"
        "assert result.exit_code == 0, result.output"
    )
    assert _loaded_after(code, ("torch", "triton", "kernel", "phases", "serving", "numpy"), timeout=60) == []


def test_machine_probe_does_not_import_torch_into_the_runner():
    code = "from runner.records.machine import probe_machine\nprobe_machine()"
    assert _loaded_after(code, ("torch", "triton"), timeout=120) == []
