"""Draft trees: tokens in topological order with parent links, built from candidate paths.

A draft may still be on the device: a drafter that launches its own step without reading it
(``ModelRunner.launch``) names each such draft by its row in that step's outputs (``source``),
as the negative id ``pending(row)``. The verify step copies those tokens into its input rows on
the device, queued behind the draft step, and reads them back with its own results: a
speculative step then waits for the device once, as a plain step does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernel import tree_mask_from_parents

MAX_VERIFY_TOKENS = 64  # the kernel's limit on T_b; the root (last accepted token) takes one
MAX_DRAFT_TOKENS = MAX_VERIFY_TOKENS - 1


def pending(row: int) -> int:
    """The token id that stands for a draft still on the device: row ``row`` of a tree's ``source``."""
    if row < 0:
        raise ValueError(f"Expected a source row >= 0, got {row}")
    return -1 - row


def pending_row(token: int) -> int:
    """The ``source`` row a pending token id (``pending``) names."""
    return -1 - token


@dataclass
class DraftTree:
    """tokens: int [T_d]; parents: int [T_d], parents[t] < t, or -1 for a child of the root.

    The root is the request's last emitted token, whose KV is not cached yet; the verify step
    runs it together with the drafts.

    source: int64 [S] on the device, the outputs of a draft step not read yet; a negative token
    is ``pending(row)``, the token in ``source[row]``. None: every token is known on the host.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    source: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def has_pending(self) -> bool:
        return self.source is not None and any(t < 0 for t in self.tokens)

    def cut(self, keep: int) -> "DraftTree":
        """The first ``keep`` drafts (a topological prefix: still a tree), the same source."""
        return DraftTree(self.tokens[:keep], self.parents[:keep], self.source)

    def read(self) -> "DraftTree":
        """This tree with its pending tokens read from the device (a device sync): for callers that
        need the values before the verify step, which reads them without one."""
        if not self.has_pending:
            return DraftTree(list(self.tokens), list(self.parents))
        values = self.source.tolist()
        return DraftTree([values[pending_row(t)] if t < 0 else t for t in self.tokens], list(self.parents))

    def depths(self) -> list[int]:
        """Depth of each draft below the root (children of the root have depth 1)."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    def verify_mask(self) -> torch.Tensor:
        """bool [1 + T_d, 1 + T_d]: the visibility of root + drafts (row 0 the root)."""
        return tree_mask_from_parents([-1] + [0 if p < 0 else p + 1 for p in self.parents])

    @staticmethod
    def from_paths(paths: list[list[int]], max_tokens: int = MAX_DRAFT_TOKENS) -> "DraftTree":
        """A trie of candidate continuations (shared prefixes merged), at most ``max_tokens`` drafts."""
        tree = DraftTree()
        children: dict[tuple[int, int], int] = {}
        for path in paths:
            parent = -1
            for tok in path:
                key = (parent, int(tok))
                if key not in children:
                    if len(tree.tokens) >= max_tokens:
                        break
                    children[key] = len(tree.tokens)
                    tree.tokens.append(int(tok))
                    tree.parents.append(parent)
                parent = children[key]
        return tree


def accept_greedy(tree: DraftTree, argmax: list[int]) -> tuple[list[int], list[int]]:
    """Longest path of drafts matching the target's argmax.

    argmax: the target's greedy token after each verify row (row 0 = root, row t+1 = draft t).
    Returns (accepted draft indices in path order, emitted tokens = accepted drafts' tokens +
    the bonus token after the last accepted node).
    """
    accepted: list[int] = []
    node_row = 0
    while True:
        want = argmax[node_row]
        parent = accepted[-1] if accepted else -1
        nxt = next((t for t, (tok, p) in enumerate(zip(tree.tokens, tree.parents)) if p == parent and tok == want), None)
        if nxt is None:
            break
        accepted.append(nxt)
        node_row = nxt + 1
    emitted = [tree.tokens[t] for t in accepted] + [argmax[node_row]]
    return accepted, emitted
