"""Where a ``call:`` gate's module comes from: the user's repository first.

``call: phases.second:run`` names the repository's ``phases/second.py``. Python's own search
does not always find it: a folder without ``__init__.py`` is a namespace package, and a regular
package of the same name anywhere later on ``sys.path`` (an installed ``phases``) wins over it,
so the gate's file would be hidden. The runner therefore looks the call's top-level name up in
the repository root first, and only when the root has nothing of that name anywhere else.

Decisions:

- Only the call's own top-level name is resolved this way. Putting the root first for every
  import would let a stray ``logging/`` folder in a repository replace the standard library's.
- Standard library only: the gate's child process (``runner.gates.call``) imports this before
  anything of the user's.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path


def root_spec(top_level: str, root: Path | str) -> ModuleSpec | None:
    """The spec of ``top_level`` (a module, a package or a namespace folder) in ``root``
    itself, or ``None`` when the root has nothing of that name."""
    return importlib.machinery.PathFinder.find_spec(top_level, [str(root)])


class RepositoryFirst(importlib.abc.MetaPathFinder):
    """A finder, first on ``sys.meta_path``, that answers for one top-level name only, from the
    repository root; for every other name (and when the root has none) it defers."""

    def __init__(self, top_level: str, root: Path | str) -> None:
        self.top_level = top_level
        self.root = str(root)

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - the finder protocol
        if fullname != self.top_level:
            return None
        return root_spec(fullname, self.root)


def import_from_root_first(module_name: str, root: Path | str) -> None:
    """Make the next import of ``module_name`` take its top-level package from ``root`` when
    ``root`` has it (see the module docstring); a no-op otherwise."""
    top_level = module_name.partition(".")[0]
    if top_level in sys.modules or root_spec(top_level, root) is None:
        return
    sys.meta_path.insert(0, RepositoryFirst(top_level, root))
