"""Start of a ``call:`` gate's child process, run by its file path: ``python .../bootstrap.py
pkg.mod:func --args-json '{...}'``, from the repository root.

The child must run this runner's ``runner.gates.call`` even when the repository has a
``runner`` of its own (a ``runner/`` package or a ``runner.py``): ``python -m
runner.gates.call`` from the root would import the repository's ``runner`` (the root is
first on ``sys.path``) and die with ``No module named 'runner.gates'``.

Decisions:

- Imports nothing by the name ``runner``: this runner's ``runner`` and ``runner.gates``
  packages are made from their folders (next to this file), so ``runner.gates.call``,
  ``runner.gates.modules`` and ``runner.protocol`` load from here, whatever
  ``sys.path`` holds; no ``__init__`` runs.
- Python puts this file's folder first on ``sys.path`` (unless ``PYTHONSAFEPATH`` is set); it
  is removed before anything else is imported, so a gate's ``import log`` never finds
  ``runner/gates/log.py``.
- Once loaded, every ``runner`` module is dropped from ``sys.modules`` again: the gate's own
  imports then resolve as they would without the runner, so a repository's ``runner.checks``
  is the repository's, and an installed ``runner.gatekit`` is the installed one.
"""

import os  # already loaded by the interpreter's start-up: no search of sys.path
import sys

if sys.path and os.path.realpath(sys.path[0] or os.curdir) == os.path.dirname(os.path.realpath(__file__)):
    del sys.path[0]  # this file's folder (absent under PYTHONSAFEPATH), see the module docstring

import importlib  # noqa: E402 - after the path fix above
import importlib.machinery  # noqa: E402
import importlib.util  # noqa: E402


def _own_call_main():
    """``runner.gates.call.main`` of the runner this file belongs to."""
    gates = os.path.dirname(os.path.abspath(__file__))
    package = os.path.dirname(gates)
    saved = {name: module for name, module in sys.modules.items() if _is_runner(name)}
    for name in saved:
        del sys.modules[name]
    for name, folder in (("runner", package), ("runner.gates", gates)):
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [folder]
        sys.modules[name] = importlib.util.module_from_spec(spec)
    try:
        return importlib.import_module("runner.gates.call").main
    finally:
        for name in [name for name in sys.modules if _is_runner(name)]:
            del sys.modules[name]
        sys.modules.update(saved)


def _is_runner(name):
    return name == "runner" or name.startswith("runner.")


if __name__ == "__main__":
    sys.exit(_own_call_main()())
