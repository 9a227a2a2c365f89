"""The demo model's text: Python sources nobody here wrote, split by file into train and held out.

Decisions:
- The files are the running interpreter's standard library and installed packages (``.py``
  under ``sysconfig``'s stdlib and purelib paths), sorted by path relative to their root, so
  the corpus is the same on every machine with the same installs.
- A file is held out when the SHA-256 of its relative path falls in the held-out share: the
  split does not depend on which other files exist, and a held-out file never enters training.
- ``max_bytes`` bounds the training text (the files are taken in hash order, which mixes
  packages) so a run's time does not depend on how much is installed.
- Tests and generated files are kept: they are real text too; files that are not UTF-8 are
  decoded with replacement.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HELD_OUT_PER_MILLE = 20  # 2% of files


@dataclass(frozen=True)
class SourceFile:
    root: Path
    relative: str

    @property
    def path(self) -> Path:
        return self.root / self.relative

    @property
    def key(self) -> str:
        return hashlib.sha256(self.relative.encode()).hexdigest()

    @property
    def held_out(self) -> bool:
        return int(self.key[:8], 16) % 1000 < HELD_OUT_PER_MILLE

    def text(self) -> str:
        return self.path.read_text(encoding="utf-8", errors="replace")


def roots() -> list[Path]:
    """The interpreter's standard library and its installed packages, each once."""
    paths = sysconfig.get_paths()
    seen: list[Path] = []
    for name in ("stdlib", "purelib", "platlib"):
        p = Path(paths[name]).resolve()
        if p.is_dir() and p not in seen:
            seen.append(p)
    return seen


def source_files() -> list[SourceFile]:
    """Every ``.py`` file under ``roots()``, once (the stdlib's site-packages belongs to purelib)."""
    out: dict[str, SourceFile] = {}
    rs = roots()
    for root in rs:
        for path in root.rglob("*.py"):
            if not path.is_file() or any(other != root and other.is_relative_to(root) and path.is_relative_to(other) for other in rs):
                continue
            rel = path.relative_to(root).as_posix()
            out.setdefault(f"{root.name}/{rel}", SourceFile(root, rel))
    return sorted(out.values(), key=lambda f: f.key)


def split(max_bytes: int, max_files: int | None = None) -> tuple[list[SourceFile], list[SourceFile]]:
    """(training files up to ``max_bytes`` of text, held-out files), both in hash order."""
    train, held, total = [], [], 0
    for f in source_files()[:max_files]:
        if f.held_out:
            held.append(f)
            continue
        if total >= max_bytes:
            continue
        try:
            size = f.path.stat().st_size
        except OSError:
            continue
        train.append(f)
        total += size
    return train, held
