"""Measured tilings of the streaming GEMM: per device, weight kind, projection shape and row count.

A table is a JSON file ``tuned/<device name>.json`` (the name from ``torch.cuda.get_device_name``,
every character outside [A-Za-z0-9] as "_"), written by ``phases/backend/bench/stream_gemm.py``:

    {"device": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "torch": "2.11.0+cu130",
     "measured": "2026-12-06T13:46:21Z", "source": "...", "copy_bw_bytes_per_s": 3.02e12,
     "cells": [{"weight": "bf16" | "fp8", "n": 2112, "k": 7168, "rows": 1 | 2 | 4 | 8 | 16,
                "choice": {"block_n": ..., "block_k": ..., "num_warps": ..., "num_stages": ...,
                           "programs": ..., "dot": ...} | "torch"}, ...]}

"rows" is the bucket: M rounded up to a power of two. "torch" (dense weights only) means
cuBLAS's ``F.linear`` was the faster; an FP8 cell always names a tiling.

``SERVING_GEMM_TABLE=off`` turns every table off (the "before" of a measurement);
``SERVING_GEMM_TABLE=/path.json`` reads that file for every device instead.

Decisions:
- A malformed table raises ``TableError`` naming the file, what is wrong and how to fix it: a
  tiling silently dropped would measure as a regression nobody can place. A device with no
  table is simply untuned (``lookup`` returns None).
- Each table is read once per process and indexed by (kind, n, k, bucket): ``lookup`` runs
  on the decode hot path, once per projection per step.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Literal

import torch

from serving.quant.stream_gemm import StreamConfig, fp8_tiling_problem

TABLE_DIR = Path(__file__).with_name("tuned")
ENV = "SERVING_GEMM_TABLE"
ROW_BUCKETS = (1, 2, 4, 8, 16)
WEIGHT_KINDS = ("bf16", "fp8")
MAX_TABLE_BYTES = 4 << 20
HEADER_FIELDS = {"device": str, "capability": list, "torch": str, "measured": str, "source": str,
                 "copy_bw_bytes_per_s": (int, float), "preset": str, "cells": list}
REQUIRED_HEADER = ("device", "capability", "torch", "measured", "source", "cells")
CELL_FIELDS = ("weight", "n", "k", "rows", "choice")
CELL_NOTES = ("best_us", "torch_us", "names")  # provenance, not read
CONFIG_FIELDS = ("block_n", "block_k", "num_warps", "num_stages", "programs", "dot")
FIX = f"rewrite it with `python -m phases.backend.bench.stream_gemm --write-table`, or set {ENV}=off"

Choice = StreamConfig | Literal["torch"]


class TableError(ValueError):
    """A GEMM table that cannot be read as one."""


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def table_path(name: str) -> Path:
    """Where the table of the device called ``name`` lives."""
    return TABLE_DIR / (re.sub(r"[^A-Za-z0-9]", "_", name) + ".json")


def rows_bucket(m: int) -> int | None:
    """M rounded up to a power of two, or None past the table's 16 rows."""
    if m < 1 or m > ROW_BUCKETS[-1]:
        return None
    return 1 << (m - 1).bit_length()


def _fail(path: Path, what: str) -> TableError:
    return TableError(f"GEMM table {path}: {what}; {FIX}")


def _read_json(path: Path) -> dict:
    try:  # non-blocking open, then fstat of what was opened: a FIFO never blocks, a swap cannot slip in
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise _fail(path, f"cannot be read ({error.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_TABLE_BYTES:
        os.close(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _fail(path, "is not a regular file")  # a FIFO or a directory cannot be parsed
        raise _fail(path, f"is {info.st_size} bytes, over the {MAX_TABLE_BYTES} a table may hold")
    with os.fdopen(fd, "rb") as f:
        try:
            raw = json.loads(f.read(MAX_TABLE_BYTES + 1))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise _fail(path, f"is not valid JSON ({error})") from None
    if not isinstance(raw, dict):
        raise _fail(path, f"expected a JSON object at the top, got {type(raw).__name__}")
    return raw


def _config(path: Path, where: str, raw: object, kind: str, rows: int) -> StreamConfig:
    if not isinstance(raw, dict) or set(raw) != set(CONFIG_FIELDS):
        got = sorted(raw) if isinstance(raw, dict) else repr(raw)
        raise _fail(path, f"{where}: expected choice \"torch\" or an object with exactly {list(CONFIG_FIELDS)}, got {got}")
    try:
        config = StreamConfig(**raw)
    except ValueError as error:
        raise _fail(path, f"{where}: {error}") from None
    if not config.dot and rows != 1:
        raise _fail(path, f"{where}: expected dot true past one row (the row sum takes M == 1), got rows {rows}")
    problem = fp8_tiling_problem(config) if kind == "fp8" else None
    if problem:
        raise _fail(path, f"{where}: expected {problem}")
    return config


def parse_table(path: Path, raw: dict) -> dict[tuple[str, int, int, int], Choice]:
    """The cells of a table's JSON object ``raw`` read from ``path``, keyed by (kind, n, k, bucket)."""
    for field in REQUIRED_HEADER:
        if field not in raw:
            raise _fail(path, f"missing field {field!r}")
    for field, value in raw.items():
        if field not in HEADER_FIELDS:
            raise _fail(path, f"unknown field {field!r} (expected {sorted(HEADER_FIELDS)})")
        want = HEADER_FIELDS[field]
        if not isinstance(value, want) or isinstance(value, bool):
            raise _fail(path, f"field {field!r}: expected {getattr(want, '__name__', 'a number')}, got {value!r}")
    cells: dict[tuple[str, int, int, int], Choice] = {}
    for i, cell in enumerate(raw["cells"]):
        where = f"cell {i}"
        if not isinstance(cell, dict) or not set(CELL_FIELDS) <= set(cell) or not set(cell) <= set(CELL_FIELDS + CELL_NOTES):
            got = sorted(cell) if isinstance(cell, dict) else repr(cell)
            raise _fail(path, f"{where}: expected an object with {list(CELL_FIELDS)} (and optionally {list(CELL_NOTES)}), got {got}")
        kind, n, k, rows, choice = (cell[f] for f in CELL_FIELDS)
        if kind not in WEIGHT_KINDS:
            raise _fail(path, f"{where}: expected weight in {list(WEIGHT_KINDS)}, got {kind!r}")
        for name, value in (("n", n), ("k", k)):
            if type(value) is not int or value < 1:
                raise _fail(path, f"{where}: expected {name} a positive int, got {value!r}")
        if type(rows) is not int or rows not in ROW_BUCKETS:
            raise _fail(path, f"{where}: expected rows in {list(ROW_BUCKETS)}, got {rows!r}")
        if choice == "torch":
            if kind == "fp8":
                raise _fail(path, f"{where}: expected a tiling for an fp8 cell (dequantizing for F.linear is not a choice), got \"torch\"")
            value: Choice = "torch"
        else:
            value = _config(path, where, choice, kind, rows)
        key = (kind, n, k, rows)
        if key in cells:
            raise _fail(path, f"{where}: a second cell for weight {kind} n {n} k {k} rows {rows}")
        cells[key] = value
    return cells


def load_table(path: Path) -> dict[tuple[str, int, int, int], Choice]:
    """The cells of the table at ``path``; ``TableError`` when it is not one."""
    return parse_table(path, _read_json(path))


_TABLES: dict[tuple[str | None, torch.device], dict | None] = {}


def _table_for(device: torch.device) -> dict | None:
    setting = os.environ.get(ENV)
    key = (setting, device)
    if key in _TABLES:
        return _TABLES[key]
    if setting == "off":
        table = None
    elif setting:
        table = load_table(Path(setting))
    else:
        name = device_name(device)
        path = table_path(name)
        table = None
        if path.exists() or path.is_symlink():
            raw = _read_json(path)
            table = parse_table(path, raw)
            if raw["device"] != name:
                raise _fail(path, f"expected the table of {name!r} (its file name), got one for {raw['device']!r}")
    _TABLES[key] = table
    return table


def clear_cache() -> None:
    """Forget the tables read (tests; a table rewritten while the process runs)."""
    _TABLES.clear()


def lookup(weight_kind: str, n: int, k: int, rows: int, device: torch.device | str) -> Choice | None:
    """The measured choice for a [rows, k] x [n, k]^T GEMM over ``weight_kind`` ("bf16" | "fp8")
    weights on ``device``: a ``StreamConfig``, "torch" (F.linear), or None (no table, no cell,
    or rows past 16)."""
    bucket = rows_bucket(rows)
    if bucket is None:
        return None
    table = _table_for(device if isinstance(device, torch.device) else torch.device(device))
    return None if table is None else table.get((weight_kind, n, k, bucket))

