"""The MTP chain's draft step launched ahead: queued right behind the verify step it depends on,
before the host reads that step.

A chain step (``MTPDrafter``) needs, per request, the length after the verify step (its prefix
length, its rows' positions) and the module's first draft there (its first row's token). Both
are outputs of the verify step, still on the device when the host could launch the chain. So
the chain step is packed on the host with the lengths *before* the verify step and a
placeholder first token, and ``shift_by_acceptance`` adds each entry's accepted drafts + 1 to
its prefix length, positions and kv offsets and writes its first token, on the device, between
the copy of its fields and its replay. The host reads the verify step while the device drafts,
and the next proposal takes the drafts from there (``ChainAhead``): a speculative step then
costs the device no idle time for the draft step's host preparation.

Decisions:
- Only where the chain step's capture plans its attention on the device
  (``ModelRunner.plans_on_device``): a host plan would be of the lengths before the verify
  step. Elsewhere (buckets planned on the host, eager steps) the drafter proposes after the
  read, as before.
- The launched step is the one a proposal after the read would make (same rows, lengths, first
  tokens, scratch layout), so outputs never change (verification is exact), and neither do drafts
  or acceptance while the same requests go on. When one finished in the verify step, the others'
  chains ran beside its dropped ones, in a bucket wider than a proposal after the read would
  take, where a near tie can turn a draft.
- A launch ahead serves the next proposal only if it came from the same runner, nothing ran on
  that runner in between (``ModelRunner.generation``: a prefill may take a finished request's
  table row) and every request proposed for was in it.
- The chain's scratch slots are allocated while the verify step still holds its own (so none
  is a slot it may accept) and freed at once: whatever reuses them is queued behind.
- On CUDA the shift is one Triton program: a launched-ahead chain step is host-bound (0.99 ms of
  device time in a 1.38 ms step at 2k, H100), and the shift's ten torch kernels and index copy
  were about 0.3 ms of its traced host time. In the drafter's entry order (each request's
  candidates in turn) it needs no index from the host; its sizes are not specialized on, so no
  bucket compiles it mid-run. The torch version stays for the CPU and for wider steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from serving.speculation.tree import pending

if TYPE_CHECKING:
    from serving.engine.model_runner import StepOutputs
    from serving.kv.batch import ForwardBatch


@dataclass(frozen=True)
class ChainAhead:
    """A chain step launched behind a verify step: its outputs (``source``, int64 on the device),
    the runner that ran both and its ``generation`` then, each table row's first chain entry (a
    row's chains are consecutive entries) and the rows of a chain entry (``chain``: the drafter's
    depth - 1)."""

    source: torch.Tensor
    runner: object
    generation: int
    first_chain: dict[int, int]
    chain: int

    def serves(self, runner, rows: list[int]) -> bool:
        """Whether the next proposal, through ``runner`` for requests at table ``rows``, may take
        these drafts."""
        return runner is self.runner and runner.generation == self.generation and all(r in self.first_chain for r in rows)

    def paths(self, row: int, firsts: list[int]) -> list[list[int]]:
        """The chains of table row ``row`` as draft paths: its first tokens (the host's copy of the
        verify step's MTP candidates) then the pending drafts of its chain rows."""
        start = self.first_chain[row]
        return [[t] + [pending((start + w) * self.chain + j) for j in range(self.chain)] for w, t in enumerate(firsts)]


def shift_by_acceptance(outputs: "StepOutputs", owners: list[int], choices: list[int], chain: int,
                        fused: bool | None = None) -> Callable[["ForwardBatch"], None]:
    """The device work that turns a chain step packed with a verify step's lengths before it into
    the step after it: for chain entry i (``owners[i]``: its verify entry; ``choices[i]``: which of
    that entry's MTP candidates it starts from; ``chain`` rows each), ``d = n_accepted + 1`` added
    to its prefix length, to each of its rows' positions and to the kv offsets from it on, and its
    first row's token set to the candidate. Padded entries and rows are left as they are (``d``
    is 0 there). No host sync. ``fused`` (None: on CUDA): one Triton program (``_shift_kernel``),
    and no host-to-device copy where the entries are each owner's candidates in order (the
    drafter's layout); else a few torch kernels after one copy of indices."""
    acc_at = outputs.offset("n_accepted")
    mtp_at = outputs.offset("mtp_topk")
    topk = outputs.shape.topk
    if len(owners) != len(choices) or any(not 0 <= c < topk for c in choices):
        raise ValueError(f"Expected one candidate index in [0, {topk}) per chain entry, got {choices} for {len(owners)} entries")
    if any(not 0 <= o < len(outputs.step.entries) for o in owners):
        raise ValueError(f"Expected owners among the verify step's {len(outputs.step.entries)} entries, got {owners}")
    e = len(owners)
    # The drafter's layout: entry i is owner i // width's candidate i % width (no index to copy).
    width = next((i for i, o in enumerate(owners) if o != 0), e) or 1
    if e % width or any(o != i // width or c != i % width for i, (o, c) in enumerate(zip(owners, choices))):
        width = 0

    def shift(batch: "ForwardBatch") -> None:
        f = batch.fields
        padded = f["prefix_lens"].shape[0]
        rows = f["positions"].shape[0]
        if e > padded or e * chain > rows:
            raise ValueError(f"Expected a chain step of {e} entries of {chain} rows, got a batch of {padded} entries, {rows} rows")
        device = f["positions"].device
        if (fused if fused is not None else device.type == "cuda") and padded <= _SHIFT_ENTRIES:
            index = outputs.ints  # any int64 tensor on the device: unread when the layout is closed-form
            if not width:
                index = _to_device(torch.tensor(owners + choices, dtype=torch.long), device)
            _shift_kernel[(1,)](
                outputs.ints, acc_at, mtp_at, topk, index, f["prefix_lens"], f["positions"], f["kv_indptr"], f["input_ids"],
                e, max(width, 1), chain, padded, rows, CLOSED=bool(width), BLOCK_E=_SHIFT_ENTRIES, BLOCK_R=256, num_warps=4,
            )
            return
        pad_entry = e if e < padded else 0  # padded rows belong to padded entries (d = 0)
        index = ([acc_at + o for o in owners] + [acc_at] * (padded - e)
                 + [1] * e + [0] * (padded - e)
                 + [i for i in range(e) for _ in range(chain)] + [pad_entry] * (rows - e * chain)
                 + [i * chain for i in range(e)]
                 + [mtp_at + o * topk + c for o, c in zip(owners, choices)])
        index_d = _to_device(torch.tensor(index, dtype=torch.long), device)
        acc, real, row_entry, first_rows, firsts = index_d.split([padded, padded, rows, e, e])
        d = outputs.ints.index_select(0, acc).add_(1).mul_(real)
        f["prefix_lens"].add_(d)
        f["positions"].add_(d.index_select(0, row_entry))
        f["kv_indptr"][1:].add_(d.cumsum(0).to(torch.int32))
        f["input_ids"].index_copy_(0, first_rows, outputs.ints.index_select(0, firsts))

    return shift


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    return (host.pin_memory() if device.type == "cuda" else host).to(device, non_blocking=True)


_SHIFT_ENTRIES = 256  # one block of entries (the kv offsets' prefix sum); wider steps take the torch path


# Sizes are not specialized on: one compile per layout kind serves every bucket (no compile mid-run).
@triton.jit(do_not_specialize=["acc_at", "mtp_at", "topk", "entries", "width", "chain", "padded", "rows"])
def _shift_kernel(INTS, acc_at, mtp_at, topk, INDEX, PREFIX, POS, KV_INDPTR, IDS, entries, width, chain, padded, rows,
                  CLOSED: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_R: tl.constexpr):
    # One program: a chain step has at most a few hundred entries and rows.
    i = tl.arange(0, BLOCK_E)
    real = i < entries
    if CLOSED:
        owner = i // width
        choice = i % width
    else:
        owner = tl.load(INDEX + i, mask=real, other=0)
        choice = tl.load(INDEX + entries + i, mask=real, other=0)
    d = tl.where(real, tl.load(INTS + acc_at + owner, mask=real, other=0) + 1, 0)
    live = i < padded
    tl.store(PREFIX + i, tl.load(PREFIX + i, mask=live, other=0) + d, mask=live)
    kv = tl.load(KV_INDPTR + 1 + i, mask=live, other=0)
    tl.store(KV_INDPTR + 1 + i, kv + tl.cumsum(d, 0).to(tl.int32), mask=live)
    first = tl.load(INTS + mtp_at + owner * topk + choice, mask=real, other=0)
    tl.store(IDS + i * chain, first, mask=real)
    for r0 in range(0, rows, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        entry = r // chain
        mine = (r < rows) & (entry < entries)
        if CLOSED:
            row_owner = entry // width
        else:
            row_owner = tl.load(INDEX + entry, mask=mine, other=0)
        dr = tl.where(mine, tl.load(INTS + acc_at + row_owner, mask=mine, other=0) + 1, 0)
        live_r = r < rows
        tl.store(POS + r, tl.load(POS + r, mask=live_r, other=0) + dr, mask=live_r)
