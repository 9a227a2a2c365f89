"""docs/ARCHITECTURE.md lists every module of the campaign and names only paths that exist.

Every ``.py`` file under ``kernel/``, ``serving/`` and ``phases/`` must appear in it by its path
(a package's ``__init__.py`` may, and need not: its room's row says what the room holds), and
every repository path it writes in backticks (``serving/kv/pool.py``, ``phases/common/``) must
exist. A module added, renamed or removed without the document is caught here; a planted module
and a planted rename show that it is.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
LISTED = ("kernel", "serving", "phases")  # every module of these is listed
NAMED = ("kernel", "serving", "phases", "runner", "tests", "plans", "docs")  # a path under these must exist

_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"(?:%s)/[\w.\-/]*" % "|".join(NAMED))


def named_paths(text: str) -> set[str]:
    """The repository paths ``text`` writes as code spans: a span that is a path under one of
    ``NAMED`` as a whole, with no placeholder (``phases/<phase>/``) or wildcard (``hopper*.py``)."""
    return {span for span in _CODE_SPAN.findall(text) if _PATH.fullmatch(span)}


def modules(root: Path = ROOT) -> list[str]:
    """Every module under ``LISTED`` (POSIX paths relative to ``root``), packages' ``__init__.py`` left out."""
    return sorted(path.relative_to(root).as_posix() for pkg in LISTED for path in (root / pkg).rglob("*.py")
                  if path.name != "__init__.py" and "__pycache__" not in path.parts)


def unlisted(text: str, root: Path = ROOT) -> list[str]:
    """The modules under ``root`` that ``text`` does not name."""
    named = named_paths(text)
    return [module for module in modules(root) if module not in named]


def missing(text: str, root: Path = ROOT) -> list[str]:
    """The paths ``text`` names that do not exist under ``root`` (a trailing ``/`` asks for a folder)."""
    def exists(path: str) -> bool:
        return (root / path).is_dir() if path.endswith("/") else (root / path).exists()

    return sorted(path for path in named_paths(text) if not exists(path))


def test_every_campaign_module_is_listed():
    assert unlisted(DOC.read_text(encoding="utf-8")) == [], "add each to its room in docs/ARCHITECTURE.md"


def test_every_named_path_exists():
    assert missing(DOC.read_text(encoding="utf-8")) == [], "docs/ARCHITECTURE.md names paths that do not exist"


def test_named_paths_reads_code_spans_only():
    text = ("`serving/kv/pool.py` and `phases/common/`, not serving/kv/batch.py; "
            "`phases/<phase>/`, `kernel/hopper*.py`, `python -m serving`, `kernel.reference`")
    assert named_paths(text) == {"serving/kv/pool.py", "phases/common/"}


@pytest.fixture
def tree(tmp_path):
    """A copy of the folders the document names, to plant changes in."""
    for name in NAMED:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


@pytest.mark.parametrize("planted", ["serving/kv/planted.py", "phases/cudagraph/bench/planted.py", "kernel/_planted.py"])
def test_a_planted_module_is_caught(tree, planted):
    (tree / planted).write_text('"""Planted."""\n')
    text = DOC.read_text(encoding="utf-8")
    assert unlisted(text, tree) == [planted]
    assert missing(text, tree) == []


def test_a_module_left_out_of_the_document_is_caught(tree):
    text = DOC.read_text(encoding="utf-8")
    assert text.count("`serving/demo/__main__.py`") == 1
    text = text.replace("`serving/demo/__main__.py`", "`serving/demo/`")
    assert unlisted(text, tree) == ["serving/demo/__main__.py"]


def test_a_planted_rename_is_caught(tree):
    (tree / "serving/kv/pool.py").rename(tree / "serving/kv/slots.py")
    text = DOC.read_text(encoding="utf-8")
    assert unlisted(text, tree) == ["serving/kv/slots.py"]
    assert missing(text, tree) == ["serving/kv/pool.py"]


def test_a_named_folder_must_be_a_folder(tree):
    text = DOC.read_text(encoding="utf-8") + "\n`phases/kernel/NOTES.md/`\n"
    assert missing(text, tree) == ["phases/kernel/NOTES.md/"]
