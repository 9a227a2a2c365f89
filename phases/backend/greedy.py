"""Gate ``greedy``: tree speculation through the kernel backend emits plain greedy's tokens.

Per context length, a group of requests (prompt = a shared random context + a random suffix
of its own) is decoded three times on one model and pool:

1. plain greedy decoding through the reference backend: the oracle; each emitted token's
   top-two logit gap is recorded;
2. tree speculation through the reference backend;
3. tree speculation through the kernel backend.

Run 3's tokens are compared with run 1's. Where the outputs first differ, a reference gap
of at most one bf16 ulp of its top logit makes the divergence a *near tie* (counted in
``near_tie_divergences``, and the rest of that request is not compared: after a different
token the continuations are unrelated); any other divergence counts every token from there
on in ``mismatched_tokens``. ``near_ties`` counts every near-tie step of run 1.
``accepted_length_delta`` is the relative difference of mean accepted drafts per step
between runs 3 and 2. After the groups, every slot of the pool must be free again.

The model computes in float32 with a bf16 pool (the kernel's input dtype), so the only
difference between runs 2 and 3 is the attention.

Gate: ``call: phases.backend.greedy:run`` (CUDA, full profile). CPU profile (tests, CI):
``run(prompts=2, max_new_tokens=6, contexts=[8, 24], preset="tiny", speculate="tree:2x2")``.
Standalone: ``python -m phases.backend.greedy --cpu`` or with JSON keyword arguments.
"""

from __future__ import annotations

import argparse
import json

from phases.common.greedy import greedy_check

try:
    from runner import gatekit
except ImportError:  # the gate also runs where the runner is not importable
    gatekit = None


def run(**kwargs) -> dict:
    """Run the gate (keyword arguments: ``phases.common.greedy.greedy_check``'s); returns its metrics."""
    return greedy_check(**kwargs, gatekit=gatekit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the small CPU profile")
    parser.add_argument("--args", default="{}", help="JSON keyword arguments for run()")
    ns = parser.parse_args()
    kwargs = dict(prompts=2, max_new_tokens=6, contexts=[8, 24], preset="tiny", speculate="tree:2x2", device="cpu") if ns.cpu else {}
    kwargs.update(json.loads(ns.args))
    print(json.dumps(run(**kwargs), indent=1))


if __name__ == "__main__":
    main()
