"""The verify machinery's best case with DeepSeek's MTP module: every draft accepted.

``AcceptAllMTP`` runs the MTP drafter's device work unchanged (the module on the target's steps
and its chain step), then replaces each request's first chain by the tokens plain greedy
decoding emitted there (``futures``, from a plain run of the same requests), so every draft of
it is accepted. Random models accept almost nothing; this measures what an MTP tree buys on a
random preset at a given acceptance, at the cost of the real drafter's work.
"""

from __future__ import annotations

from serving.engine.drafters import MTPDrafter
from serving.engine.tree import DraftTree


class AcceptAllMTP(MTPDrafter):
    """``MTPDrafter(width, depth)`` whose first chain is plain greedy's continuation.

    futures: request id -> the tokens plain decoding emits for it (its whole output).
    Requests must be the engine's ``Request`` objects (their ``output`` says where they are).
    """

    def __init__(self, width: int, depth: int, futures: dict[int, list[int]]) -> None:
        super().__init__(width, depth)
        self.futures = futures

    def propose(self, ctx, requests):
        trees = super().propose(ctx, requests)
        out = []
        for r, tree in zip(requests, trees):
            future = self.futures[r.req_id]
            done = len(r.output)
            oracle = future[done : done + self.depth]
            others = [p for p in _paths(tree) if p[:1] != oracle[:1]]
            out.append(DraftTree.from_paths([oracle] + others[: self.width - 1]) if oracle else tree)
        return out


def _paths(tree: DraftTree) -> list[list[int]]:
    """Root-to-leaf token paths of ``tree``."""
    children = {p for p in tree.parents if p >= 0}
    paths = []
    for leaf in range(len(tree)):
        if leaf in children:
            continue
        path, node = [], leaf
        while node >= 0:
            path.append(tree.tokens[node])
            node = tree.parents[node]
        paths.append(path[::-1])
    return paths
