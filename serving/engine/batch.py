"""One forward step's batch: the metadata every layer and the attention backend read.

Modes: ``extend`` (prefill, causal, any length), ``decode`` (one token per request) and
``verify`` (a draft tree per request, ``T_b <= 64``, with a tree mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MODES = ("extend", "decode", "verify")


@dataclass
class ForwardBatch:
    """Shapes (N new tokens over B requests, total_kv = sum_b L_b):

    mode: one of MODES.
    input_ids: int64 [N]; positions: int64 [N].
    qo_indptr: int32 [B+1]; request b's new tokens are rows qo_indptr[b]:qo_indptr[b+1].
    kv_indptr: int32 [B+1]; kv_indices: int32 [total_kv]; request b's slots in position order,
        the last T_b of them its new tokens.
    out_slots: int64 [N]; slot each new token's latent row is written to.
    tree_mask: bool [sum_b T_b^2] (verify) or None (causal).
    qo_lens, kv_lens: the same lengths as host lists (no device sync to read them).
    max_position: the largest position in the batch (host int).
    """

    mode: str
    input_ids: torch.Tensor
    positions: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    out_slots: torch.Tensor
    tree_mask: torch.Tensor | None
    qo_lens: list[int]
    kv_lens: list[int]
    max_position: int = 0

    @property
    def batch_size(self) -> int:
        return len(self.qo_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.qo_lens)


def build_batch(
    mode: str,
    tokens: list[list[int]],
    positions: list[list[int]],
    prefix_slots: list[list[int]],
    new_slots: list[list[int]],
    tree_masks: list[torch.Tensor] | None,
    device: torch.device,
) -> ForwardBatch:
    """Pack per-request host lists into a ForwardBatch (one host-to-device copy per field).

    tokens/positions/new_slots: per request, its T_b new tokens; prefix_slots: its cached
    slots before them (a host list or an int32 device tensor, e.g. ``SlotTable.device_slots``); tree_masks: per request bool [T_b, T_b] (verify) or None.
    """
    if mode not in MODES:
        raise ValueError(f"Expected mode in {MODES}, got {mode!r}")
    qo_lens = [len(t) for t in tokens]
    if any(n < 1 for n in qo_lens):
        raise ValueError(f"Expected at least one new token per request, got lengths {qo_lens}")
    for b, (t, p, s) in enumerate(zip(tokens, positions, new_slots)):
        if not len(t) == len(p) == len(s):
            raise ValueError(f"Expected tokens, positions and new slots of one length for request {b}, got {len(t)}, {len(p)}, {len(s)}")
    kv_lens = [int(len(p)) + len(n) for p, n in zip(prefix_slots, new_slots)]
    qo_indptr = [0]
    kv_indptr = [0]
    for q, k in zip(qo_lens, kv_lens):
        qo_indptr.append(qo_indptr[-1] + q)
        kv_indptr.append(kv_indptr[-1] + k)
    flat = lambda xs: [x for row in xs for x in row]
    new_dev = torch.tensor(flat(new_slots), dtype=torch.int32).to(device, non_blocking=True)
    pieces, offset = [], 0
    for p, n in zip(prefix_slots, new_slots):
        pieces.append(p.to(device=device, dtype=torch.int32) if isinstance(p, torch.Tensor) else torch.tensor(p, dtype=torch.int32, device=device))
        pieces.append(new_dev[offset : offset + len(n)])
        offset += len(n)
    kv_indices = torch.cat(pieces)
    mask = None
    if mode == "verify":
        if tree_masks is None:
            raise ValueError("Expected tree_masks for a verify batch, got None")
        mask = torch.cat([m.reshape(-1).to(torch.bool) for m in tree_masks]).to(device)
    i32 = dict(dtype=torch.int32, device=device)
    i64 = dict(dtype=torch.int64, device=device)
    return ForwardBatch(
        mode=mode,
        input_ids=torch.tensor(flat(tokens), **i64),
        positions=torch.tensor(flat(positions), **i64),
        qo_indptr=torch.tensor(qo_indptr, **i32),
        kv_indptr=torch.tensor(kv_indptr, **i32),
        kv_indices=kv_indices,
        out_slots=torch.tensor(flat(new_slots), **i64),
        tree_mask=mask,
        qo_lens=qo_lens,
        kv_lens=kv_lens,
        max_position=max(max(p) for p in positions),
    )
