"""The uniform split planned on the device, inside a captured step (FlashMLA's ``get_mla_metadata``).

A replayed decode step spent about half of its host time planning the attention: reading the
lengths, ``plan_work`` in numpy, packing and uploading the metadata. ``plan_uniform_on_device``
writes the same metadata (``PlanLayout.pack(plan_work(..., schedule="uniform"))``, bit for bit)
from the step's device indptrs with one single-program kernel, so a CUDA graph can plan its
own attention and the host plans nothing.

Decisions:
- Only the uniform schedule: one chunk length for every request is a closed form (the work per
  program, in whole tiles), where "balanced" and "waves" search and simulate. It is the Hopper
  path's schedule for one request and the Triton path's for every batch.
- One program: a step holds at most a few hundred work items and row blocks; a grid would need
  a second launch for the prefix sums it shares.
- The indptrs may be a bucket's padded ones (entries past the real batch empty): empty entries
  get no work items and no row blocks, and the indptrs and mask offsets are written for the
  real entries alone (zeros after), as the host packs a plan of the real entries.
- Everything the layout holds is rewritten every time (zeros first): a replay never reads a
  previous step's leftovers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel.plan import PlanLayout, TileConfig, next_pow2

_BLOCK_ITEMS = 64  # work items / row blocks written per loop iteration


@triton.jit
def _prefix_of(incl, values, idx):
    """For each index in ``idx`` [I]: how many entries end at or before it (its entry) and the
    sum of ``values`` over those entries, from the entries' inclusive end offsets ``incl`` [B]."""
    before = incl[None, :] <= idx[:, None]
    entry = tl.sum(before.to(tl.int32), axis=1)
    offset = tl.sum(tl.where(before, values[None, :], 0), axis=1)
    return entry, offset


@triton.jit
def _uniform_plan_kernel(
    QO_INDPTR, KV_INDPTR, META, batch, numel, max_work, max_row_blocks,
    num_heads, block_m, block_n, programs, min_chunk,
    OFF_COUNTS, OFF_QO, OFF_KV, OFF_MASK,
    OFF_W_REQ, OFF_W_MBLK, OFF_W_START, OFF_W_END, OFF_W_FULL, OFF_W_NSPLIT,
    OFF_MB_REQ, OFF_MB_MBLK, OFF_MB_WSTART, OFF_MB_NSPLIT, OFF_MB_STRIDE,
    BLOCK_B: tl.constexpr, BLOCK_I: tl.constexpr,
):
    # Zero the whole layout first (entries past the plan, and the contiguity views: none).
    for z in range(0, numel, BLOCK_I):
        offs = z + tl.arange(0, BLOCK_I)
        tl.store(META + offs, tl.zeros([BLOCK_I], dtype=tl.int32), mask=offs < numel)
    tl.debug_barrier()

    b = tl.arange(0, BLOCK_B)
    in_batch = b < batch
    qo_lo = tl.load(QO_INDPTR + b, mask=in_batch, other=0).to(tl.int64)
    qo_hi = tl.load(QO_INDPTR + b + 1, mask=in_batch, other=0).to(tl.int64)
    kv_lo = tl.load(KV_INDPTR + b, mask=in_batch, other=0).to(tl.int64)
    kv_hi = tl.load(KV_INDPTR + b + 1, mask=in_batch, other=0).to(tl.int64)
    t = tl.where(in_batch, qo_hi - qo_lo, 0)
    l = tl.where(in_batch, kv_hi - kv_lo, 0)
    real = t > 0  # a bucket's padded entries are empty
    num_real = tl.sum(real.to(tl.int32), axis=0)

    # The uniform chunk: the work per program in keys, at least min_chunk, in whole tiles.
    mblocks = (t * num_heads + block_m - 1) // block_m
    tile_work = tl.sum(mblocks * l, axis=0)
    chunk = tl.maximum(min_chunk, (tile_work + programs - 1) // programs)
    chunk = (chunk + block_n - 1) // block_n * block_n
    nsplit = (l + chunk - 1) // chunk
    works = nsplit * mblocks
    works_incl = tl.cumsum(works, axis=0)
    mblocks_incl = tl.cumsum(mblocks, axis=0)
    num_work = tl.sum(works, axis=0)
    num_row_blocks = tl.sum(mblocks, axis=0)

    two = tl.arange(0, 2)
    tl.store(META + OFF_COUNTS + two, tl.where(two == 0, num_work, num_row_blocks).to(tl.int32))
    # Indptrs of the real entries (B + 1 values), mask offsets (B values): exclusive sums.
    qo_excl = tl.cumsum(t, axis=0) - t
    kv_excl = tl.cumsum(l, axis=0) - l
    tl.store(META + OFF_QO + b, qo_excl.to(tl.int32), mask=b <= num_real)
    tl.store(META + OFF_KV + b, kv_excl.to(tl.int32), mask=b <= num_real)
    tl.store(META + OFF_QO + b + 1, (qo_excl + t).to(tl.int32), mask=b == num_real - 1)
    tl.store(META + OFF_KV + b + 1, (kv_excl + l).to(tl.int32), mask=b == num_real - 1)
    tt = t * t
    tl.store(META + OFF_MASK + b, (tl.cumsum(tt, axis=0) - tt).to(tl.int32), mask=b < num_real)

    # Work items, request-major, then split, then M-block (``plan._pieces``).
    for w0 in range(0, max_work, BLOCK_I):
        i = w0 + tl.arange(0, BLOCK_I).to(tl.int64)
        req, first = _prefix_of(works_incl, works, i)
        live = i < num_work
        tr = (tl.load(QO_INDPTR + req + 1, mask=live, other=1) - tl.load(QO_INDPTR + req, mask=live, other=0)).to(tl.int64)
        lr = (tl.load(KV_INDPTR + req + 1, mask=live, other=1) - tl.load(KV_INDPTR + req, mask=live, other=0)).to(tl.int64)
        mr = tl.maximum((tr * num_heads + block_m - 1) // block_m, 1)
        local = i - first
        split = local // mr
        start = split * chunk
        end = tl.minimum(lr, start + chunk)
        full_end = start + tl.maximum(0, tl.minimum(end, lr - tr) - start) // block_n * block_n
        tl.store(META + OFF_W_REQ + i, req.to(tl.int32), mask=live)
        tl.store(META + OFF_W_MBLK + i, (local % mr).to(tl.int32), mask=live)
        tl.store(META + OFF_W_START + i, start.to(tl.int32), mask=live)
        tl.store(META + OFF_W_END + i, end.to(tl.int32), mask=live)
        tl.store(META + OFF_W_FULL + i, full_end.to(tl.int32), mask=live)
        tl.store(META + OFF_W_NSPLIT + i, ((lr + chunk - 1) // chunk).to(tl.int32), mask=live)

    # Row blocks: each (request, M-block) with its first work item, split count and stride.
    for r0 in range(0, max_row_blocks, BLOCK_I):
        j = r0 + tl.arange(0, BLOCK_I).to(tl.int64)
        req, mb_first = _prefix_of(mblocks_incl, mblocks, j)
        # The request's first work item: its exclusive work sum, picked by index (a second
        # _prefix_of over ``works`` here does not compile at B = 32 and 64 with Triton 3.6).
        work_first = tl.sum(tl.where(b[None, :] == req[:, None], (works_incl - works)[None, :], 0), axis=1)
        live = j < num_row_blocks
        tr = (tl.load(QO_INDPTR + req + 1, mask=live, other=1) - tl.load(QO_INDPTR + req, mask=live, other=0)).to(tl.int64)
        lr = (tl.load(KV_INDPTR + req + 1, mask=live, other=1) - tl.load(KV_INDPTR + req, mask=live, other=0)).to(tl.int64)
        mblk = j - mb_first
        tl.store(META + OFF_MB_REQ + j, req.to(tl.int32), mask=live)
        tl.store(META + OFF_MB_MBLK + j, mblk.to(tl.int32), mask=live)
        tl.store(META + OFF_MB_WSTART + j, (work_first + mblk).to(tl.int32), mask=live)
        tl.store(META + OFF_MB_NSPLIT + j, ((lr + chunk - 1) // chunk).to(tl.int32), mask=live)
        tl.store(META + OFF_MB_STRIDE + j, ((tr * num_heads + block_m - 1) // block_m).to(tl.int32), mask=live)


def plan_uniform_on_device(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, metadata: torch.Tensor, layout: PlanLayout,
                           num_heads: int, config: TileConfig) -> None:
    """Write ``layout.pack(plan_work(qo_lens, kv_lens, num_heads, dims, config, "uniform"))`` into
    ``metadata`` on the device, the lengths read there from ``qo_indptr`` / ``kv_indptr``.

    qo_indptr, kv_indptr: int32 [B + 1] on ``metadata``'s device, B <= ``layout.max_batch``;
    entries past the real batch may be empty (a bucket's padding). metadata: int32 [>= layout.numel].
    The caller keeps the plan within ``layout`` (``max_work_items`` bounds the uniform split for
    any lengths, ``max_row_blocks`` for up to the drafts the layout was sized for). Queues one
    kernel; no host sync (capturable).
    """
    batch = qo_indptr.numel() - 1
    if kv_indptr.numel() != batch + 1 or batch < 1:
        raise ValueError(f"Expected qo_indptr and kv_indptr of B + 1 >= 2 entries each, got {qo_indptr.numel()} and "
                         f"{kv_indptr.numel()}")
    if batch > layout.max_batch:
        raise ValueError(f"Expected at most the layout's {layout.max_batch} requests, got {batch}")
    if qo_indptr.dtype != torch.int32 or kv_indptr.dtype != torch.int32 or metadata.dtype != torch.int32:
        raise ValueError(f"Expected int32 indptrs and metadata, got {qo_indptr.dtype}, {kv_indptr.dtype} and {metadata.dtype}")
    if metadata.numel() < layout.numel:
        raise ValueError(f"Expected metadata of at least {layout.numel} elements for the layout, got {metadata.numel()}")
    off = layout.offsets()
    _uniform_plan_kernel[(1,)](
        qo_indptr, kv_indptr, metadata, batch, layout.numel, layout.max_work, layout.max_row_blocks,
        num_heads, config.block_m, config.block_n, max(1, config.target_programs), config.min_chunk,
        off["counts"], off["qo_indptr"], off["kv_indptr"], off["mask_offsets"],
        off["work_req"], off["work_mblk"], off["work_kv_start"], off["work_kv_end"], off["work_full_end"],
        off["work_nsplit"],
        off["mb_req"], off["mb_mblk"], off["mb_work_start"], off["mb_nsplit"], off["mb_stride"],
        BLOCK_B=max(2, next_pow2(batch)), BLOCK_I=_BLOCK_ITEMS, num_warps=4,
    )
