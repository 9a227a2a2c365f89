"""A step's ``kv_indices`` built on the device from the slot table (SGLang's
``create_flashinfer_kv_indices_triton``): entry b's slots are ``table[rows[b], :prefix_lens[b]]``
followed by its tail slots, written at ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``.

Decisions:
- One Triton kernel, used eagerly and inside CUDA graphs alike: it reads every length from
  device memory, its grid is fixed by the layout (entries x chunks), and programs past an
  entry's length do nothing, so a captured launch serves any later batch of its bucket.
- On a CPU device the same result comes from torch slicing over the host lists (the
  interpreter would be slower and nothing is captured there); a test holds the two equal.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
MAX_CHUNKS = 32  # programs per entry at batch 1: a 128k context in 32 pieces of 4k slots


@triton.jit
def _build_kv_indices_kernel(Table, table_stride, Rows, PrefixLens, KvIndptr, TailIndptr, Tails, Out,
                             BLOCK: tl.constexpr):
    b = tl.program_id(0)
    chunk = tl.program_id(1)
    chunks = tl.num_programs(1)
    kv_start = tl.load(KvIndptr + b)
    length = tl.load(KvIndptr + b + 1) - kv_start
    prefix = tl.load(PrefixLens + b).to(tl.int32)
    row = tl.load(Rows + b).to(tl.int64)
    tail_start = tl.load(TailIndptr + b)
    for start in range(chunk * BLOCK, length, chunks * BLOCK):
        j = start + tl.arange(0, BLOCK)
        live = j < length
        in_table = j < prefix
        from_table = tl.load(Table + row * table_stride + j, mask=live & in_table, other=0)
        from_tail = tl.load(Tails + tail_start + (j - prefix), mask=live & (j >= prefix), other=0)
        tl.store(Out + kv_start + j, tl.where(in_table, from_table, from_tail), mask=live)


def chunks_for(batch: int) -> int:
    """Programs per entry for a launch over ``batch`` entries (fixed per graph bucket)."""
    return max(1, min(MAX_CHUNKS, 256 // max(1, batch)))


def build_kv_indices(
    table: torch.Tensor,
    rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    tail_indptr: torch.Tensor,
    tails: torch.Tensor,
    out: torch.Tensor,
    host: tuple[list[int], list[int], list[int]] | None = None,
) -> torch.Tensor:
    """Fill ``out`` (int32 [>= total]) with every entry's slots; returns ``out``.

    table: int32 [R, max_context]; rows, prefix_lens: int64 [B]; kv_indptr, tail_indptr:
    int32 [B+1]; tails: int32 [sum of tails]. ``host``: (rows, prefix_lens, tail lengths) as
    lists, required on a CPU device (torch slicing), ignored on CUDA (the Triton kernel).
    Launches only device work on CUDA, so it can be captured.
    """
    if out.device.type == "cuda":
        batch = rows.shape[0]
        _build_kv_indices_kernel[(batch, chunks_for(batch))](
            table, table.stride(0), rows, prefix_lens, kv_indptr, tail_indptr, tails, out, BLOCK=BLOCK,
        )
        return out
    if host is None:
        raise ValueError("Expected the host lists (rows, prefix_lens, tail lengths) on a CPU device, got none")
    pieces, tail_at = [], 0
    for row, prefix, tail_len in zip(*host):
        pieces.append(table[row, :prefix])
        pieces.append(tails[tail_at : tail_at + tail_len])
        tail_at += tail_len
    flat = torch.cat(pieces) if pieces else out[:0]
    out[: flat.numel()] = flat
    return out
