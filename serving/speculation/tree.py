"""Draft trees: tokens in topological order with parent links, built from candidate paths."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernel import tree_mask_from_parents

MAX_VERIFY_TOKENS = 64  # the kernel's limit on T_b; the root (last accepted token) takes one
MAX_DRAFT_TOKENS = MAX_VERIFY_TOKENS - 1


@dataclass
class DraftTree:
    """tokens: int [T_d]; parents: int [T_d], parents[t] < t, or -1 for a child of the root.

    The root is the request's last emitted token, whose KV is not cached yet; the verify step
    runs it together with the drafts.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

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
