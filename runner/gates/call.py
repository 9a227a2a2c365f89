"""Child process of a callable gate: ``python -m runner.gates.call pkg.mod:func --args-json '{...}'``
(the runner starts it through ``runner/gates/bootstrap.py``, so a repository's own ``runner``
never replaces this module).

Imports ``pkg.mod`` from the current directory (the repository root) first: the root is first
on ``sys.path``, and ``pkg`` is taken from the root when the root has it, also as a folder
without ``__init__.py`` (``runner.gates.modules``). Then it calls ``func(**args)`` and writes the returned metrics dict as a JSON object to the file named
by ``$RUNNER_METRICS`` (to stdout when it is unset). NaN and infinities are written as the
``NaN`` / ``Infinity`` literals, so the runner sees them and fails their thresholds.

Protocol with the runner: when ``$RUNNER_STATUS`` names a file, one line of JSON
``{"status": ..., "message": ...}`` is written to it before exiting, and the exit code says
the same thing:

==============  ====  ==============================================================
status          exit  meaning
==============  ====  ==============================================================
``ok``          0     the function returned a dict of metrics; they were written
``raised``      1     the function raised; its traceback is on stderr
``bad_return``  2     it returned something other than a dict of JSON scalars and lists of numbers
``not_loaded``  3     the callable could not be imported, found or called with ``args``
==============  ====  ==============================================================

The runner only trusts the status file (a gate may itself exit with 3), so ``not_loaded``
(an ERROR: the gate never ran) is told apart from a gate that failed.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from runner.gates.modules import import_from_root_first
from runner.protocol import METRICS_ENV, STATUS_ENV

STATUS_OK = "ok"
STATUS_RAISED = "raised"
STATUS_BAD_RETURN = "bad_return"
STATUS_NOT_LOADED = "not_loaded"

EXIT_CODES = {STATUS_OK: 0, STATUS_RAISED: 1, STATUS_BAD_RETURN: 2, STATUS_NOT_LOADED: 3}


class _Stop(Exception):
    """Ends the child with a status and a one-line message."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def main(argv: Sequence[str] | None = None) -> int:
    """Run one callable gate; return the exit code (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m runner.gates.call", description=__doc__.split("\n")[0])
    parser.add_argument("target", help="the callable, as pkg.module:function")
    parser.add_argument("--args-json", default="{}", help="keyword arguments, a JSON object")
    options = parser.parse_args(argv)

    cwd = os.getcwd()
    if not sys.path or sys.path[0] != cwd:
        sys.path.insert(0, cwd)
    import_from_root_first(options.target.partition(":")[0], cwd)
    try:
        func, args = _load(options.target, options.args_json)
        try:
            returned = func(**args)
        except Exception as exc:
            traceback.print_exc()
            raise _Stop(STATUS_RAISED, f"raised {_one_line(exc)}") from exc
        metrics = _metrics_of(returned)
        _write_metrics(metrics)
    except _Stop as stop:
        print(f"runner.gates.call: {options.target}: {stop.message}", file=sys.stderr)
        _write_status(stop.status, stop.message)
        return EXIT_CODES[stop.status]
    _write_status(STATUS_OK, f"reported {len(metrics)} metric(s)")
    return EXIT_CODES[STATUS_OK]


def _load(target: str, args_json: str) -> tuple[Callable[..., object], dict[str, object]]:
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise _Stop(STATUS_NOT_LOADED, f"expected pkg.module:function, got {target!r}")
    try:
        args = json.loads(args_json)
    except json.JSONDecodeError as exc:
        raise _Stop(STATUS_NOT_LOADED, f"--args-json is not valid JSON: {exc}") from exc
    if not isinstance(args, dict):
        raise _Stop(STATUS_NOT_LOADED, f"--args-json must be a JSON object, got {type(args).__name__}")
    try:
        obj: object = importlib.import_module(module_name)
    except BaseException as exc:  # a module may raise anything at import, even SystemExit
        traceback.print_exc()
        raise _Stop(STATUS_NOT_LOADED, f"could not import {module_name}: {_one_line(exc)}") from exc
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise _Stop(STATUS_NOT_LOADED, f"{module_name} has no attribute {attr_path!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise _Stop(STATUS_NOT_LOADED, f"{target} is a {type(obj).__name__}, not callable")
    try:
        inspect.signature(obj).bind(**args)
    except TypeError as exc:
        raise _Stop(STATUS_NOT_LOADED, f"cannot call {target} with args {sorted(args)}: {exc}") from exc
    except ValueError:
        pass  # no signature available (some builtins); let the call itself decide
    return obj, args


def _metrics_of(returned: object) -> dict[str, object]:
    if not isinstance(returned, dict):
        raise _Stop(
            STATUS_BAD_RETURN,
            f"returned {type(returned).__name__}, expected a dict of metrics",
        )
    metrics: dict[str, object] = {}
    for key, value in returned.items():
        if not isinstance(key, str):
            raise _Stop(STATUS_BAD_RETURN, f"metric name {key!r} is not a string")
        metric = _scalar(value)
        if metric is None:
            metric = _samples(value)
        if metric is None:
            raise _Stop(
                STATUS_BAD_RETURN,
                f"metric {key!r} is a {type(value).__name__}; metrics are numbers, strings, booleans "
                "or lists of numbers (samples)",
            )
        metrics[key] = metric
    return metrics


def _samples(value: object) -> list[int | float] | None:
    """``value`` as a list of numbers (a list, a tuple, or an array with ``tolist``), or ``None``."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and not isinstance(value, (list, tuple)):
        try:
            value = tolist()
        except Exception:
            return None
    if not isinstance(value, (list, tuple)):
        return None
    items = [_scalar(item) for item in value]
    if any(isinstance(item, bool) or not isinstance(item, (int, float)) for item in items):
        return None
    return items  # type: ignore[return-value]


def _scalar(value: object) -> bool | int | float | str | None:
    """``value`` as a JSON scalar (numpy / torch scalars unwrapped), or ``None`` if it is not one."""
    if isinstance(value, (bool, int, float, str)):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            unwrapped = item()
        except Exception:
            return None
        if isinstance(unwrapped, (bool, int, float, str)):
            return unwrapped
    return None


def _write_metrics(metrics: dict[str, object]) -> None:
    text = json.dumps(metrics, allow_nan=True, sort_keys=False)
    target = os.environ.get(METRICS_ENV)
    if target:
        Path(target).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    nonfinite = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
    if nonfinite:
        print(f"runner.gates.call: non-finite metric(s): {', '.join(nonfinite)}", file=sys.stderr)


def _write_status(status: str, message: str) -> None:
    target = os.environ.get(STATUS_ENV)
    if target:
        line = json.dumps({"status": status, "message": message})
        Path(target).write_text(line + "\n", encoding="utf-8")


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first if len(first) <= 300 else first[:297] + "..."


if __name__ == "__main__":
    sys.exit(main())
