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
    qo_indptr_host, kv_indptr_host: int32 [B+1] CPU copies of qo_indptr / kv_indptr (for
        host-side planning without a device sync).
    max_position: the largest position in the batch (host int).

    The device tensors may be views of one shared buffer: treat them as read-only.
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
    qo_indptr_host: torch.Tensor
    kv_indptr_host: torch.Tensor
    max_position: int = 0

    @property
    def batch_size(self) -> int:
        return len(self.qo_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.qo_lens)


def _words(n: int, per_word: int) -> int:
    """int64 words holding ``n`` items of ``per_word`` per word, rounded up to an even count so
    every region of the packed buffer starts 16-byte aligned."""
    w = -(-n // per_word)
    return w + (w & 1)


def build_batch(
    mode: str,
    tokens: list[list[int]],
    positions: list[list[int]],
    prefix_slots: list,
    new_slots: list[list[int]],
    tree_masks: list[torch.Tensor] | None,
    device: torch.device,
) -> ForwardBatch:
    """Pack per-request host lists into a ForwardBatch with one host-to-device copy.

    tokens/positions/new_slots: per request, its T_b new tokens; prefix_slots: its cached
    slots before them: a host list, an int32 device tensor (e.g. ``SlotTable.device_slots``) or
    a pair (device tensor, host list) of the two in that order; tree_masks: per request bool
    [T_b, T_b] (verify) or None.

    Every host-side field goes into one int64 host buffer (pinned on CUDA) of three regions:
    int64 [input_ids | positions | out_slots], int32 [kv segments | qo_indptr | kv_indptr] and
    bool [tree_mask]; the device fields are views of its single copy (no cast kernels). A kv
    segment is the host part of a request's prefix and its new slots, so a batch whose prefixes
    are all host lists needs no concatenation on the device.
    """
    if mode not in MODES:
        raise ValueError(f"Expected mode in {MODES}, got {mode!r}")
    qo_lens = [len(t) for t in tokens]
    if any(n < 1 for n in qo_lens):
        raise ValueError(f"Expected at least one new token per request, got lengths {qo_lens}")
    for b, (t, p, s) in enumerate(zip(tokens, positions, new_slots)):
        if not len(t) == len(p) == len(s):
            raise ValueError(f"Expected tokens, positions and new slots of one length for request {b}, got {len(t)}, {len(p)}, {len(s)}")
    mask = None
    if mode == "verify":
        if tree_masks is None:
            raise ValueError("Expected tree_masks for a verify batch, got None")
        mask = torch.cat([m.reshape(-1).to(torch.bool) for m in tree_masks])
    device = torch.device(device)
    longs = [x for rows in (tokens, positions, new_slots) for row in rows for x in row]
    ints: list[int] = []
    pieces: list = []  # kv_indices in order: device prefixes and (start, end) ranges of ``ints``
    kv_lens = []
    for p, n in zip(prefix_slots, new_slots):
        if isinstance(p, tuple):
            on_device, on_host = p
        elif isinstance(p, torch.Tensor):
            on_device, on_host = p, ()
        else:
            on_device, on_host = None, p
        start = len(ints)
        if on_device is not None:
            pieces.append(on_device)
        ints.extend(on_host)
        ints.extend(n)
        kv_lens.append(len(ints) - start + (0 if on_device is None else on_device.numel()))
        if pieces and isinstance(pieces[-1], tuple):  # segments are back to back: extend the run
            pieces[-1] = (pieces[-1][0], len(ints))
        else:
            pieces.append((start, len(ints)))
    total_kv = len(ints)
    qo_indptr = [0]
    kv_indptr = [0]
    for q, k in zip(qo_lens, kv_lens):
        qo_indptr.append(qo_indptr[-1] + q)
        kv_indptr.append(kv_indptr[-1] + k)
    ints += qo_indptr + kv_indptr
    w64, w32 = _words(len(longs), 1), _words(len(ints), 2)
    w8 = _words(mask.numel(), 8) if mask is not None else 0
    host = torch.empty(w64 + w32 + w8, dtype=torch.int64, pin_memory=device.type == "cuda")
    host[: len(longs)] = torch.tensor(longs, dtype=torch.int64)
    host_i32 = host[w64 : w64 + w32].view(torch.int32)
    host_i32[: len(ints)] = torch.tensor(ints, dtype=torch.int32)
    if mask is not None:
        host[w64 + w32 :].view(torch.bool)[: mask.numel()] = mask
    dev = host.to(device, non_blocking=True)
    i64, i32 = dev[:w64], dev[w64 : w64 + w32].view(torch.int32)
    pieces = [i32[x[0] : x[1]] if isinstance(x, tuple) else x.to(device=device, dtype=torch.int32) for x in pieces]
    n, b = len(longs) // 3, len(qo_lens)
    return ForwardBatch(
        mode=mode,
        input_ids=i64[:n],
        positions=i64[n : 2 * n],
        qo_indptr=i32[total_kv : total_kv + b + 1],
        kv_indptr=i32[total_kv + b + 1 : total_kv + 2 * b + 2],
        kv_indices=pieces[0] if len(pieces) == 1 else torch.cat(pieces),
        out_slots=i64[2 * n : 3 * n],
        tree_mask=None if mask is None else dev[w64 + w32 :].view(torch.bool)[: mask.numel()],
        qo_lens=qo_lens,
        kv_lens=kv_lens,
        qo_indptr_host=host_i32[total_kv : total_kv + b + 1],
        kv_indptr_host=host_i32[total_kv + b + 1 : total_kv + 2 * b + 2],
        max_position=max(max(p) for p in positions),
    )
