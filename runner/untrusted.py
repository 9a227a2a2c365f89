"""Reading files the runner did not write (a gate's outputs, an imported results file) without
trusting them.

Each read is bounded in every direction: a file is opened with ``O_NONBLOCK | O_NOFOLLOW`` (a
FIFO or device never blocks the open, a symbolic link is refused), must be a regular file by
``fstat`` of that descriptor (no race with a rename), and at most ``limit`` bytes are read. JSON
is parsed with a nesting limit, integers with more than ``MAX_INT_DIGITS`` digits or beyond the
range of a float are refused, and so are strings with lone surrogates (``"\\ud800"``). Every
refusal is an ``UntrustedFileError`` whose message is one line; nothing here raises anything else
for any file content.
"""

from __future__ import annotations

import json
import os
import sys
import stat
from pathlib import Path
from typing import Any

MAX_JSON_DEPTH = 32
MAX_INT_DIGITS = 400  # a float's range ends near 1.8e308

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class UntrustedFileError(Exception):
    """A file that cannot be used; ``str()`` says why, on one line."""


def read_bounded(path: Path, limit: int, *, what: str = "file", tail: bool = False) -> bytes | None:
    """The bytes of the regular file ``path`` (``None`` when it does not exist).

    ``UntrustedFileError`` when it is a symbolic link, not a regular file (FIFO, device, folder,
    socket), unreadable, or over ``limit`` bytes. With ``tail`` an over-long file is not an
    error: its last ``limit`` bytes are returned.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise UntrustedFileError(f"{what} is a symbolic link; write a regular file") from None
        raise UntrustedFileError(f"{what} cannot be opened: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFileError(f"{what} is {_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            if not tail:
                raise UntrustedFileError(f"{what} is {info.st_size} bytes, over the {limit}-byte limit")
            os.lseek(fd, info.st_size - limit, os.SEEK_SET)
        chunks: list[bytes] = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            if not tail:
                raise UntrustedFileError(f"{what} grew past the {limit}-byte limit while it was read")
            data = data[-limit:]
        return data
    except OSError as exc:
        raise UntrustedFileError(f"{what} unreadable: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def parse_json(
    data: bytes | str, *, what: str = "file", max_depth: int = MAX_JSON_DEPTH, unique_keys: bool = False
) -> Any:
    """``data`` parsed as JSON with the limits of the module docstring (``UntrustedFileError``)."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UntrustedFileError(f"{what} is not UTF-8 (byte {exc.start}: {exc.reason})") from None
    else:
        text = data
    try:
        value = json.loads(text, parse_int=_parse_int, object_pairs_hook=_unique if unique_keys else None)
    except _DuplicateKey as exc:
        raise UntrustedFileError(f"{what} repeats the key {exc} in one object") from None
    except _IntTooBig as exc:
        raise UntrustedFileError(f"{what} holds an integer {exc}") from None
    except json.JSONDecodeError as exc:
        raise UntrustedFileError(f"{what} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:  # the decoder stops at the interpreter's recursion limit
        raise UntrustedFileError(
            f"{what} nests JSON more than {sys.getrecursionlimit()} levels deep, over the limit of {max_depth}"
        ) from None
    except ValueError as exc:
        raise UntrustedFileError(f"{what} is not valid JSON ({exc})") from None
    depth = _max_depth(value)
    if depth > max_depth:
        raise UntrustedFileError(f"{what} nests JSON {depth} levels deep, over the limit of {max_depth}")
    bad = _lone_surrogate(value)
    if bad is not None:
        raise UntrustedFileError(f"{what} holds a string with a lone surrogate ({bad!r}); write valid Unicode")
    return value


class _IntTooBig(ValueError):
    pass


class _DuplicateKey(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(repr(key)[:80])
        result[key] = value
    return result


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _IntTooBig(f"of {digits} digits (at most {MAX_INT_DIGITS})")
    value = int(text)
    try:
        float(value)
    except OverflowError:
        raise _IntTooBig(f"beyond the range of a float ({text[:12]}...)") from None
    return value


def _max_depth(value: Any) -> int:
    """The deepest nesting of arrays and objects in a parsed value (``{"a": [1]}``: 2), walked
    without recursion. Walking what the decoder made costs a step per container and item, not
    per byte: a file of a few large strings (artifacts, string metrics) is not scanned again."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in item.values() if isinstance(child, (dict, list)))
        elif isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in item if isinstance(child, (dict, list)))
    return deepest


def _lone_surrogate(value: Any) -> str | None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return item.encode("utf-8", "backslashreplace").decode("ascii", "replace")[:40]
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"
