"""Draft-tree visibility masks: the host-side form of a tree that the kernel's ``tree_mask`` takes.

Production code (the serving engine) and the oracle (``kernel.reference``) both build masks
here, so the engine never imports the oracle.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def causal_tree_mask(num_draft: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Mask of a chain of drafts: draft ``t`` sees drafts ``0 .. t``.

    Args:
        num_draft: ``T >= 1``, the number of draft tokens.
        device: where to build it (None: the CPU).
    Returns:
        bool ``[T, T]``, lower-triangular including the diagonal.
    """
    if num_draft < 1:
        raise ValueError(f"Expected num_draft >= 1, got {num_draft}")
    return torch.ones(num_draft, num_draft, dtype=torch.bool, device=device).tril()


def tree_mask_from_parents(parents: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Visibility mask of a draft tree given each draft's parent.

    Args:
        parents: int ``[T]``; ``parents[t]`` is the index of draft ``t``'s parent, which must be
            an earlier draft (``0 <= parents[t] < t``), or ``-1`` when draft ``t`` is a child of
            the prefix (the last accepted token).
    Returns:
        bool ``[T, T]``; ``mask[t, u]`` is true iff ``u == t`` or ``u`` is an ancestor of ``t``.
    """
    parent_list = [int(p) for p in (parents.tolist() if isinstance(parents, torch.Tensor) else parents)]
    num_draft = len(parent_list)
    if num_draft < 1:
        raise ValueError("Expected at least one draft token, got an empty parent list")
    mask = torch.zeros(num_draft, num_draft, dtype=torch.bool)
    for t, parent in enumerate(parent_list):
        if not -1 <= parent < t:
            raise ValueError(
                f"Expected parents[{t}] in [-1, {t - 1}] (drafts in topological order), got {parent}"
            )
        if parent >= 0:
            mask[t] = mask[parent]  # every ancestor of the parent, and the parent itself
        mask[t, t] = True
    return mask
