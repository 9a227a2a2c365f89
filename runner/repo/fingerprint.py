"""Content fingerprint of a source tree, computed without git.

The file set is what ``git ls-files --cached --others --exclude-standard`` lists in a clone
whose tracked files are not ignored: every file under the root except ``.git/`` and what the
root's and nested ``.gitignore`` files ignore. ``.git/info/exclude`` and the global excludes
file are not read: a copy of the tree on a GPU host has neither, and both sides must agree.
``__pycache__`` folders, ``*.pyc`` files and the runner's fallback lock ``.runner.lock`` (with
its take-over files) at the root are always left out, whatever ``.gitignore`` says. A
file that is tracked although a ``.gitignore`` ignores it is left out here, unlike in
``git ls-files``. Symbolic links are not followed; a link is hashed by its target string.

Ignore rules follow git's own algorithm (``dir.c``) rather than a per-file matcher: the walk
asks about each directory and file as it reaches it; a pattern matches only the path itself
(a ``dir/`` pattern only directories; a pattern without a slash the base name; any other
pattern the whole path relative to its ``.gitignore``); the deepest ``.gitignore`` with a
matching pattern decides, and within one file the last matching pattern; an ignored
directory is not entered, so nothing under it can be re-included. Per-file matchers such as
``pathspec.GitIgnoreSpec`` answer differently for rules like ``a/**`` + ``!a/keep`` or
``*`` + ``!*/`` + ``!*.py``, which is why the patterns are translated here.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from runner.errors import UsageError

_CHUNK = 1 << 20
_LOCK_FALLBACK = ".runner.lock"  # runner.lock.FALLBACK_NAME


@dataclass(frozen=True)
class TreeState:
    """The tree as fingerprinted: ``fingerprint`` and, per file, the sha256 (hex) of what was
    hashed (``files``), so a later step can prove that what it commits is what was tested."""

    fingerprint: str
    files: Mapping[str, str]


def tree_fingerprint(root: Path, exclude: Iterable[str] = ()) -> str:
    """``"sha256:<hex>"`` over the tree's files (``tree_state``)."""
    return tree_state(root, exclude).fingerprint


def tree_state(root: Path, exclude: Iterable[str] = ()) -> TreeState:
    """The tree's files and fingerprint, in sorted POSIX relative path order.

    For each file the fingerprint takes its path bytes, NUL, the sha256 digest of its content
    (of its target string for a symbolic link), NUL. ``exclude`` lists POSIX paths relative to
    ``root`` (or absolute paths inside it) to leave out; a directory leaves out everything
    under it.
    """
    root = Path(root)
    digest = hashlib.sha256()
    files: dict[str, str] = {}
    for rel in fingerprint_files(root, exclude):
        content = _content_digest(root / rel)
        files[rel] = content.hex()
        digest.update(os.fsencode(rel))
        digest.update(b"\0")
        digest.update(content)
        digest.update(b"\0")
    return TreeState("sha256:" + digest.hexdigest(), files)


def fingerprint_files(root: Path, exclude: Iterable[str] = ()) -> list[str]:
    """The POSIX relative paths ``tree_fingerprint`` hashes, sorted (useful for ``--explain``)."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"cannot fingerprint {root}: not a directory")
    excluded = _normalise_excludes(root, exclude)
    # (directory relative to root, "" for the root; its .gitignore spec), outermost first
    specs: list[tuple[str, list[_Pattern]]] = []
    files: list[str] = []

    def walk(rel_dir: str) -> None:
        abs_dir = root / rel_dir if rel_dir else root
        spec = _read_gitignore(abs_dir / ".gitignore")
        if spec is not None:
            specs.append((rel_dir, spec))
        try:
            entries = sorted(os.scandir(abs_dir), key=lambda e: e.name)
        except OSError as exc:
            raise UsageError(f"cannot list {abs_dir} for the fingerprint: {exc}") from exc
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if entry.name == ".git" or _is_excluded(rel, excluded):
                continue
            if not rel_dir and entry.name.startswith(_LOCK_FALLBACK):
                continue  # the runner's own lock (and its take-over files) when there is no .git
            is_dir = entry.is_dir(follow_symlinks=False)
            if entry.name == "__pycache__" and is_dir or entry.name.endswith(".pyc") and not is_dir:
                continue  # written by merely importing the code; never a change of the tree
            if not is_dir and not (entry.is_file(follow_symlinks=False) or entry.is_symlink()):
                continue  # sockets, fifos, devices: git does not track them
            if _ignored(rel, is_dir, specs):
                continue
            if is_dir:
                walk(rel)
            else:
                files.append(rel)
        if spec is not None:
            specs.pop()

    walk("")
    return sorted(files, key=os.fsencode)


def _read_gitignore(path: Path) -> list[_Pattern] | None:
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc}") from exc
    patterns = [p for p in map(_parse_line, text.splitlines()) if p is not None]
    return patterns or None


def _ignored(rel: str, is_dir: bool, specs: list[tuple[str, list[_Pattern]]]) -> bool:
    """The deepest ``.gitignore`` with a matching pattern decides; in it, the last match."""
    basename = rel.rsplit("/", 1)[-1]
    for base, patterns in reversed(specs):
        sub = rel[len(base) + 1 :] if base else rel
        for pattern in reversed(patterns):
            if pattern.dir_only and not is_dir:
                continue
            if pattern.regex.fullmatch(sub if pattern.anchored else basename):
                return not pattern.negated
    return False


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern[str]
    negated: bool
    dir_only: bool
    anchored: bool  # matched against the path relative to its .gitignore, else the base name


def _parse_line(line: str) -> _Pattern | None:
    """One ``.gitignore`` line as a pattern, or ``None`` for blanks and comments."""
    text = line.rstrip(" ")
    if text.endswith("\\") and len(text) < len(line):
        text += " "  # "foo\\ " keeps its escaped trailing space
    if not text or text.startswith("#"):
        return None
    negated = text.startswith("!")
    if negated:
        text = text[1:]
    dir_only = text.endswith("/")
    text = text.rstrip("/")
    if not text:
        return None
    anchored = "/" in text
    text = text.lstrip("/")
    return _Pattern(re.compile(_wildmatch_regex(text)), negated, dir_only, anchored)


def _wildmatch_regex(pattern: str) -> str:
    """Translate a gitignore glob (``*``, ``?``, ``[...]``, ``**`` segments) to a regex."""
    segments = pattern.split("/")
    out = ""
    for index, segment in enumerate(segments):
        first, last = index == 0, index == len(segments) - 1
        if segment == "**":
            if first and last:
                out += ".*"
            elif first:
                out += "(?:.*/)?"
            elif last:
                out += "/.*"
            else:
                out += "/(?:.*/)?"
            continue
        if not first and segments[index - 1] != "**":
            out += "/"
        out += _segment_regex(segment)
    return out


_POSIX_CLASSES = {
    "alnum": "a-zA-Z0-9", "alpha": "a-zA-Z", "blank": " \\t", "digit": "0-9",
    "lower": "a-z", "upper": "A-Z", "space": "\\s", "xdigit": "0-9A-Fa-f",
    "punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
}


def _segment_regex(segment: str) -> str:
    out, i = "", 0
    while i < len(segment):
        char = segment[i]
        if char == "\\" and i + 1 < len(segment):
            out += re.escape(segment[i + 1])
            i += 2
        elif char == "*":
            while i < len(segment) and segment[i] == "*":
                i += 1
            out += "[^/]*"
        elif char == "?":
            out += "[^/]"
            i += 1
        elif char == "[":
            klass, end = _char_class(segment, i)
            out += klass if klass is not None else re.escape("[")
            i = end
        else:
            out += re.escape(char)
            i += 1
    return out


def _char_class(segment: str, start: int) -> tuple[str | None, int]:
    """The regex for the ``[...]`` class at ``start`` and the index after it (``None`` if
    the bracket is never closed, in which case it is a literal ``[``)."""
    i = start + 1
    negate = i < len(segment) and segment[i] in "!^"
    if negate:
        i += 1
    body, first = "", True
    while i < len(segment):
        char = segment[i]
        if char == "]" and not first:
            return (f"[^/{body}]" if negate else f"[{body}]"), i + 1
        first = False
        if char == "[" and segment.startswith("[:", i):
            close = segment.find(":]", i + 2)
            name = segment[i + 2 : close] if close != -1 else ""
            if name in _POSIX_CLASSES:
                body += _POSIX_CLASSES[name]
                i = close + 2
                continue
        if char == "\\" and i + 1 < len(segment):
            i += 1
            char = segment[i]
        if char == "-" and body and i + 1 < len(segment) and segment[i + 1] != "]":
            body += "-"
        else:
            body += re.escape(char)
        i += 1
    return None, start + 1


def _normalise_excludes(root: Path, exclude: Iterable[str]) -> list[str]:
    entries = []
    for item in exclude:
        path = Path(item)
        if path.is_absolute():
            try:
                path = path.resolve().relative_to(root.resolve())
            except ValueError:
                continue  # outside the tree: nothing to leave out
        text = path.as_posix().strip("/")
        if text in ("", "."):
            raise UsageError(f"exclude entry {item!r} would leave out the whole tree")
        entries.append(text)
    return entries


def _is_excluded(rel: str, excluded: list[str]) -> bool:
    return any(rel == entry or rel.startswith(entry + "/") for entry in excluded)


def _content_digest(path: Path) -> bytes:
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            return hashlib.sha256(os.fsencode(os.readlink(path))).digest()
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        return digest.digest()
    except OSError as exc:
        raise UsageError(f"cannot read {path} for the fingerprint: {exc}") from exc
