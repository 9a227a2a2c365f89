"""Known kernel bugs, planted in a copy of the tree, to show that the tests catch them.

    python -m tests.kernel.planted_bugs first_draft_visible /tmp/planted   # copy + plant, prints the diff
    cd /tmp/planted && python -m pytest -q -m gpu tests/kernel/test_hopper.py -k small_row

The repository itself is never edited: the copy (without .git, virtual environments and caches)
gets one exact text replacement, which must match exactly once. Each bug here once got past
tests that existed at the time (phases/kernel/NOTES.md, "Tests that catch what the gate catches").
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "*.pyc")


@dataclass(frozen=True)
class PlantedBug:
    """Replace ``old`` (exactly one occurrence) with ``new`` in ``path`` (relative to the repo root)."""

    path: str
    old: str
    new: str
    what: str


BUGS = {
    "first_draft_visible": PlantedBug(
        path="kernel/hopper_gluon.py",
        old="visible = key_ok[:, None] & ((u[:, None] < 0) | draft_ok)",
        new="visible = key_ok[:, None] & ((u[:, None] <= 0) | draft_ok)",
        what="keys-as-M consumer: the first draft (u == 0) is visible to every draft, whatever the tree",
    ),
}


def plant(name: str, source: Path, dest: Path) -> str:
    """Copy ``source`` to ``dest`` (must not exist) and plant bug ``name`` there; returns the diff."""
    bug = BUGS[name]
    text = (source / bug.path).read_text()
    if text.count(bug.old) != 1:
        raise ValueError(f"Expected one occurrence of the anchor in {bug.path}, got {text.count(bug.old)}")
    shutil.copytree(source, dest, ignore=SKIP)
    planted = text.replace(bug.old, bug.new)
    (dest / bug.path).write_text(planted)
    return "".join(difflib.unified_diff(text.splitlines(True), planted.splitlines(True), f"a/{bug.path}", f"b/{bug.path}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bug", choices=sorted(BUGS))
    parser.add_argument("dest", type=Path, help="directory to create with the planted copy")
    parser.add_argument("--source", type=Path, default=REPO)
    args = parser.parse_args(argv)
    print(f"planting {args.bug} ({BUGS[args.bug].what}) in {args.dest}")
    print(plant(args.bug, args.source, args.dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
