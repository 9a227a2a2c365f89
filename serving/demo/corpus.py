"""The demo model's text: Python sources nobody here wrote, split by file into train and held out.

Decisions:
- The files are the running interpreter's standard library and installed packages (``.py``
  under ``sysconfig``'s stdlib and purelib paths), sorted by path relative to their root, so
  the corpus is the same on every machine with the same installs.
- A file is held out when the SHA-256 of its relative path falls in the held-out share: the
  split does not depend on which other files exist, and a held-out file never enters training.
- ``max_bytes`` bounds the training text (the files are taken in hash order, which mixes
  packages) so a run's time does not depend on how much is installed.
- Files are kept or dropped by the filters code corpora use (Codex, StarCoder, The Stack;
  ``quality``): a file whose text another file already has (vendored copies: pip's ``rich``
  beside ``rich``), and files that are data more than code: a line over 1000 characters, a mean
  line over 100, under a quarter alphanumeric, or more than 1% of characters outside ASCII
  (box-drawing test expectations, translations, spinner tables). A small model learns what
  such files repeat and prints it: the same glyph 200 times after a docstring. The filters
  apply to held-out files too, so the prompts are code.
- Tests are kept: they are real code; files that are not UTF-8 are decoded with replacement.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HELD_OUT_PER_MILLE = 20  # 2% of files
MAX_LINE = 1000
MAX_MEAN_LINE = 100
MIN_ALNUM_SHARE = 0.25
MAX_NON_ASCII_SHARE = 0.01
_NOT_ALNUM = bytes(b for b in range(256) if not chr(b).isascii() or not chr(b).isalnum())


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


def quality(text: str) -> str | None:
    """Why ``text`` is data more than code (see Decisions), or None to keep it."""
    if not text.strip():
        return "empty"
    lines = text.splitlines()
    if max(map(len, lines)) > MAX_LINE:
        return f"a line over {MAX_LINE} characters"
    if len(text) / len(lines) > MAX_MEAN_LINE:
        return f"mean line over {MAX_MEAN_LINE} characters"
    ascii_text = text.encode("ascii", "ignore")  # C-speed counts: the corpus is 120 MB
    if len(text) - len(ascii_text) > MAX_NON_ASCII_SHARE * len(text):
        return f"over {MAX_NON_ASCII_SHARE:.0%} outside ASCII"
    if len(ascii_text.translate(None, _NOT_ALNUM)) < MIN_ALNUM_SHARE * len(text):
        return f"under {MIN_ALNUM_SHARE:.0%} alphanumeric"
    return None


def split(max_bytes: int, max_files: int | None = None) -> tuple[list[SourceFile], list[SourceFile]]:
    """(training files up to ``max_bytes`` of text, held-out files), both in hash order, each
    file passing ``quality`` and none repeating an earlier file's text."""
    train, held, total, seen = [], [], 0, set()
    for f in source_files()[:max_files]:
        if not f.held_out and total >= max_bytes:
            continue
        try:
            text = f.text()
        except OSError:
            continue
        digest = hashlib.sha256(text.encode()).digest()
        if digest in seen or quality(text) is not None:
            continue
        seen.add(digest)
        if f.held_out:
            held.append(f)
        else:
            train.append(f)
            total += len(text.encode())
    return train, held
