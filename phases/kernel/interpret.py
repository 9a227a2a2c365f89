"""Gate ``interpret``: the verify gate's tiny profile, the Triton kernels in Triton's CPU interpreter.

32 seeded cases (D <= 64, L <= 80, ragged batches, trees and chains, both slot layouts, int32
and int64 indices) against the float64 oracle, on any machine: the indexing, masking and
split/merge logic are checked before a GPU is spent on them. The checks and metrics are the
``verify`` gate's (``phases.kernel.verify``); only the profile differs.

Gate: ``call: phases.kernel.interpret:run`` with ``env: {TRITON_INTERPRET: "1"}``.
Standalone: ``TRITON_INTERPRET=1 python -m phases.kernel.interpret [--limit N]``.
"""

from __future__ import annotations

import argparse
import json

from phases.kernel import verify


def run(seed: int = 0, limit: int | None = None) -> dict:
    """``phases.kernel.verify.run`` on the interpreter profile (``TRITON_INTERPRET=1`` set)."""
    return verify.run(profile="interpret", seed=seed, limit=limit)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="only the first N cases")
    ns = parser.parse_args()
    print(json.dumps(run(ns.seed, ns.limit), indent=1))
