"""A step's packing: field values and dtypes, host copies of the indptrs, kv_indices built from
the slot table (torch on the CPU, the Triton kernel under the interpreter), inert padding in a
bucket's layout, and the kernel backend planning from the host copies."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from serving.attention.backends import KernelBackend
from serving.kv.batch import PackedStep, StepBatch, StepEntry, StepLayout, forward_batch
from serving.kv.indices import _build_kv_indices_kernel, build_kv_indices
from serving.kv.pool import KVPool

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def pool_with_prefixes(device="cpu"):
    """Requests 1 and 2 cached with slots [10, 11, 12] and [20, 21]."""
    pool = KVPool(1, 64, 576, torch.bfloat16, device, max_requests=4, max_context=16)
    for req, slots in ((1, [10, 11, 12]), (2, [20, 21])):
        pool.table.add(req)
        pool.table.append(req, slots)
    return pool


def mixed_step(pool, kind="verify"):
    """Three entries: a tree over request 1, a root over request 2, a chain with no table prefix
    (tail holds its earlier slot, as a drafter's chain does)."""
    t = pool.table
    parents = [[-1, 0, 1, 0], [-1], [-1, 0]] if kind == "verify" else [None, None, None]
    if kind == "decode":
        return StepBatch("decode", [
            StepEntry(t.row(1), 3, [13], [1], [3]),
            StepEntry(t.row(2), 2, [22], [1], [2]),
            StepEntry(0, 0, [30, 31], [8], [1]),
        ])
    return StepBatch("verify", [
        StepEntry(t.row(1), 3, [13, 14, 15, 16], [1, 5, 6, 7], [3, 4, 5, 4], parents[0]),
        StepEntry(t.row(2), 2, [22], [1], [2], parents[1]),
        StepEntry(0, 0, [30, 31], [1, 8], [0, 1], parents[2]),
    ])


def prepared(step, pool, device="cpu"):
    layout = StepLayout.exact(step)
    packed = PackedStep.allocate(layout, pin=False)
    packed.fill(step)
    buffer = packed.host.to(device)
    kv = torch.full((layout.kv,), -1, dtype=torch.int32, device=device)
    batch = forward_batch(step, packed.views(buffer), kv)
    return batch, packed


def build_on_host(batch, step, pool):
    return build_kv_indices(pool.table.rows, batch.fields["rows"], batch.fields["prefix_lens"], batch.kv_indptr,
                            batch.fields["tail_indptr"], batch.fields["tails"], batch.kv_indices,
                            host=([e.row for e in step.entries], [e.prefix_len for e in step.entries],
                                  [len(e.tail) for e in step.entries]))


def test_fields_of_a_mixed_verify_step():
    pool = pool_with_prefixes()
    step = mixed_step(pool)
    batch, _ = prepared(step, pool)
    want = {
        "input_ids": (torch.int64, [1, 5, 6, 7, 1, 1, 8]),
        "positions": (torch.int64, [3, 4, 5, 4, 2, 0, 1]),
        "out_slots": (torch.int64, [13, 14, 15, 16, 22, 30, 31]),
        "qo_indptr": (torch.int32, [0, 4, 5, 7]),
        "kv_indptr": (torch.int32, [0, 7, 10, 12]),
    }
    for name, (dtype, values) in want.items():
        t = getattr(batch, name)
        assert t.dtype == dtype and t.dim() == 1 and t.tolist() == values, name
    for name in ("qo_indptr_host", "kv_indptr_host"):
        t = getattr(batch, name)
        assert t.device.type == "cpu" and t.dtype == torch.int32
        assert t.tolist() == getattr(batch, name[: -len("_host")]).tolist()
    build_on_host(batch, step, pool)
    assert batch.kv_indices.tolist() == [10, 11, 12, 13, 14, 15, 16, 20, 21, 22, 30, 31]
    masks = [[1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 1], [1], [1, 0, 1, 1]]
    assert batch.tree_mask.dtype == torch.bool and batch.tree_mask.int().tolist() == sum(masks, [])
    assert batch.qo_lens == [4, 1, 2] and batch.kv_lens == [7, 3, 2] and batch.max_position == 5
    assert batch.fields["grid_depth"].view(3, 4).tolist() == [[0, 1, 2, 1], [0, 0, 0, 0], [0, 1, 0, 0]]
    assert batch.fields["grid_valid"].view(3, 4).tolist() == [[True] * 4, [True, False, False, False], [True, True, False, False]]


def test_decode_step_has_no_tree_mask_and_the_same_slots():
    pool = pool_with_prefixes()
    step = mixed_step(pool, "decode")
    batch, _ = prepared(step, pool)
    build_on_host(batch, step, pool)
    assert batch.tree_mask is None and batch.kv_indices.tolist() == [10, 11, 12, 13, 20, 21, 22, 30, 31]


def test_an_extend_step_packs_no_grid_or_mask_so_its_bytes_grow_linearly():
    """A prefill chunk accepts nothing: its layout has no tree mask and a one-cell grid, so the
    packed buffer (pinned and copied to the device every chunk) holds O(T) bytes, not T^2."""
    pool = KVPool(1, 8192, 576, torch.bfloat16, "cpu", max_requests=4, max_context=8192)
    pool.table.add(1)
    pool.table.append(1, [5, 6, 7])
    t = 5000
    step = StepBatch("extend", [StepEntry(pool.table.row(1), 3, list(range(100, 100 + t)), [1] * t, list(range(3, 3 + t)))])
    layout = StepLayout.exact(step)
    assert (layout.mask, layout.width, layout.tokens, layout.kv) == (0, 1, t, t + 3)
    batch, packed = prepared(step, pool)
    assert packed.host.numel() * packed.host.element_size() < 64 * t
    build_on_host(batch, step, pool)
    assert batch.tree_mask is None and batch.kv_indices.tolist() == [5, 6, 7] + list(range(100, 100 + t))
    assert batch.positions.tolist() == list(range(3, 3 + t)) and batch.out_slots.tolist() == list(range(100, 100 + t))
    assert not batch.fields["grid_valid"].any()


def test_triton_kv_indices_kernel_equals_the_host_build():
    """The kernel the CUDA path captures, run under the interpreter, against the torch build,
    with entries longer than one block and a chunk count that leaves programs idle."""
    pool = KVPool(1, 5000, 8, torch.float32, "cpu", max_requests=3, max_context=3000)
    gen = torch.Generator().manual_seed(0)
    perm = (torch.randperm(4999, generator=gen) + 1).tolist()
    pool.table.add(1)
    pool.table.append(1, perm[:2500])
    pool.table.add(2)
    pool.table.append(2, perm[2500:2510])
    step = StepBatch("decode", [
        StepEntry(pool.table.row(1), 2500, [perm[3000]], [1], [2500]),
        StepEntry(pool.table.row(2), 7, perm[3001:3004], [2], [9]),
        StepEntry(0, 0, [perm[4000]], [3], [0]),
    ])
    batch, _ = prepared(step, pool)
    want = build_on_host(batch, step, pool).clone()
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs it under Triton's interpreter
    f = {k: v.to(dev) for k, v in batch.fields.items()}
    out = torch.full_like(batch.kv_indices, -1, device=dev)
    rows = pool.table.rows.to(dev)
    _build_kv_indices_kernel[(3, 2)](rows, rows.stride(0), f["rows"], f["prefix_lens"], f["kv_indptr"], f["tail_indptr"],
                                     f["tails"], out, BLOCK=1024)
    assert out.tolist() == want.tolist()
    assert want[:2500].tolist() == perm[:2500] and want[2501:2508].tolist() == perm[2500:2507]


def test_bucket_layout_pads_inertly():
    """A step packed into a larger bucket's layout: padded tokens are id 0 at position 0
    writing slot 0, padded entries own no tokens and no KV, padded grid cells are invalid."""
    pool = pool_with_prefixes()
    step = mixed_step(pool, "decode")
    bucket = StepLayout(batch=8, tokens=8, tails=32, mask=8, width=1, kv=64)
    packed = PackedStep.allocate(bucket, pin=False)
    packed.fill(step)
    views = packed.views(packed.host.clone())
    assert views["input_ids"][3:].eq(0).all() and views["out_slots"][3:].eq(0).all() and views["positions"][3:].eq(0).all()
    assert views["qo_indptr"].tolist() == [0, 1, 2, 3, 3, 3, 3, 3, 3]
    assert views["kv_indptr"].tolist() == [0, 4, 7, 9, 9, 9, 9, 9, 9]
    assert views["rows"][3:].eq(0).all() and not views["grid_valid"][3:].any()
    with pytest.raises(ValueError, match="Expected a step within the layout"):
        PackedStep.allocate(dataclasses.replace(bucket, batch=2), pin=False).fill(step)


def test_bad_steps_are_refused():
    with pytest.raises(ValueError, match="one token per entry in a decode step"):
        StepBatch("decode", [StepEntry(0, 0, [1, 2], [1, 2], [0, 1])])
    with pytest.raises(ValueError, match="parents for each of entry 0"):
        StepBatch("verify", [StepEntry(0, 0, [1], [1], [0])])
    with pytest.raises(ValueError, match="tail holding the new tokens' slots"):
        StepBatch("extend", [StepEntry(0, 0, [], [1], [0])])
    with pytest.raises(ValueError, match="Expected kind"):
        StepBatch("prefill", [StepEntry(0, 0, [1], [1], [0])])


def test_kernel_backend_plans_from_host_copies():
    """The batch's device indptrs sit on the meta device, which the host cannot read: planning
    succeeds only from the host copies (as on a GPU, where reading the device ones syncs)."""
    pool = pool_with_prefixes()
    backend = KernelBackend(pool, num_heads=2, kv_lora_rank=512, sm_scale=0.1)
    batch, _ = prepared(mixed_step(pool), pool)
    meta = dataclasses.replace(batch, qo_indptr=batch.qo_indptr.to("meta"), kv_indptr=batch.kv_indptr.to("meta"))
    with pytest.raises(NotImplementedError, match="meta tensor"):
        meta.qo_indptr.tolist()
    backend.init_forward_metadata(meta)
    plan = backend.wrapper._plan
    assert plan.qo_lens == [4, 1, 2] and plan.kv_lens == [7, 3, 2]


@gpu
@needs_cuda
def test_kv_indices_on_cuda_match_the_host_build():
    pool = pool_with_prefixes()
    step = mixed_step(pool)
    batch, _ = prepared(step, pool)
    want = build_on_host(batch, step, pool).tolist()
    cuda_pool = pool_with_prefixes("cuda")
    cuda_batch, _ = prepared(step, cuda_pool, "cuda")
    f = cuda_batch.fields
    build_kv_indices(cuda_pool.table.rows, f["rows"], f["prefix_lens"], cuda_batch.kv_indptr, f["tail_indptr"],
                     f["tails"], cuda_batch.kv_indices)
    assert cuda_batch.kv_indices.tolist() == want


@pytest.mark.parametrize("bucket", [False, True])
def test_a_verify_step_without_drafts_lets_each_token_see_itself(bucket):
    """Every entry a bare root (T_b = 1): each [1, 1] mask block is true, in an exact layout
    (width 1, packed like a decode step) as in a bucket's wider one; a false block would hide
    the token's own key from it."""
    pool = pool_with_prefixes()
    t = pool.table
    step = StepBatch("verify", [StepEntry(t.row(1), 3, [13], [1], [3], [-1]), StepEntry(t.row(2), 2, [22], [1], [2], [-1])])
    layout = StepLayout.exact(step)
    if bucket:
        layout = dataclasses.replace(layout, batch=4, tokens=16, tails=16, mask=64, width=4, kv=32)
    packed = PackedStep.allocate(layout, pin=False)
    packed.fill(step)
    assert packed.numpy("tree_mask")[:2].tolist() == [True, True]
