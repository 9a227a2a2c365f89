"""The packed ForwardBatch: field values and dtypes, host copies of the indptrs, and the kernel
backend planning from those host copies."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from serving.engine import make_backend
from serving.engine.batch import build_batch
from serving.engine.kv_pool import KVPool
from serving.engine.tree import DraftTree

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def mixed_batch(device, mode="verify"):
    """Three requests: a host-list prefix, a device-tensor prefix, an empty host prefix."""
    trees = [DraftTree.from_paths([[5, 6], [7]]), DraftTree(), DraftTree.from_paths([[8]])]
    tokens = [[1] + t.tokens for t in trees]
    positions = [[3, 4, 5, 4], [2], [0, 1]]
    prefix = [[10, 11, 12], torch.tensor([20, 21], dtype=torch.int32, device=device), []]
    new = [[13, 14, 15, 16], [22], [30, 31]]
    masks = [t.verify_mask() for t in trees] if mode == "verify" else None
    return build_batch(mode, tokens, positions, prefix, new, masks, device), trees


def check_fields(batch, trees, device):
    dev = torch.device(device)
    want = {
        "input_ids": (torch.int64, [1, 5, 6, 7, 1, 1, 8]),
        "positions": (torch.int64, [3, 4, 5, 4, 2, 0, 1]),
        "out_slots": (torch.int64, [13, 14, 15, 16, 22, 30, 31]),
        "qo_indptr": (torch.int32, [0, 4, 5, 7]),
        "kv_indptr": (torch.int32, [0, 7, 10, 12]),
        "kv_indices": (torch.int32, [10, 11, 12, 13, 14, 15, 16, 20, 21, 22, 30, 31]),
    }
    for name, (dtype, values) in want.items():
        t = getattr(batch, name)
        assert t.dtype == dtype and t.device.type == dev.type and t.dim() == 1, name
        assert t.tolist() == values, name
    for name in ("qo_indptr_host", "kv_indptr_host"):
        t = getattr(batch, name)
        assert t.device.type == "cpu" and t.dtype == torch.int32
        assert t.tolist() == getattr(batch, name[: -len("_host")]).tolist()
    masks = torch.cat([t.verify_mask().reshape(-1) for t in trees])
    assert batch.tree_mask.dtype == torch.bool and batch.tree_mask.device.type == dev.type
    assert batch.tree_mask.tolist() == masks.tolist()
    assert batch.qo_lens == [4, 1, 2] and batch.kv_lens == [7, 3, 2] and batch.max_position == 5


def test_build_batch_packs_every_field():
    batch, trees = mixed_batch("cpu")
    check_fields(batch, trees, "cpu")
    decode, _ = mixed_batch("cpu", mode="decode")
    assert decode.tree_mask is None and decode.kv_indices.tolist() == batch.kv_indices.tolist()


def test_host_prefixes_need_no_concatenation():
    batch = build_batch("decode", [[1], [2]], [[2], [1]], [[4, 5], [6]], [[7], [8]], None, "cpu")
    assert batch.kv_indices.tolist() == [4, 5, 7, 6, 8] and batch.kv_indptr.tolist() == [0, 3, 5]


def test_prefix_split_between_device_and_host():
    """A (device tensor, host list) prefix: the device slots, then the host ones, then the new."""
    prefix = [(torch.tensor([4, 5], dtype=torch.int32), [9]), [6], (torch.tensor([3], dtype=torch.int32), [])]
    batch = build_batch("decode", [[1], [2], [3]], [[3], [1], [1]], prefix, [[7], [8], [10]], None, "cpu")
    assert batch.kv_indices.tolist() == [4, 5, 9, 7, 6, 8, 3, 10]
    assert batch.kv_lens == [4, 2, 2] and batch.kv_indptr_host.tolist() == [0, 4, 6, 8]


def test_kernel_backend_plans_from_host_copies():
    """The batch's device indptrs sit on the meta device, which the host cannot read: planning
    succeeds only from the host copies (as on a GPU, where reading the device ones syncs)."""
    pool = KVPool(1, 64, 576, torch.bfloat16, "cpu")
    backend = make_backend("kernel", pool, num_heads=2, kv_lora_rank=512, sm_scale=0.1)
    batch, _ = mixed_batch("cpu")
    meta = dataclasses.replace(batch, qo_indptr=batch.qo_indptr.to("meta"), kv_indptr=batch.kv_indptr.to("meta"))
    with pytest.raises(NotImplementedError, match="meta tensor"):
        meta.qo_indptr.tolist()
    backend.init_forward_metadata(meta)
    plan = backend.wrapper._plan
    assert plan.qo_lens == [4, 1, 2] and plan.kv_lens == [7, 3, 2]


@gpu
@needs_cuda
def test_build_batch_on_cuda_keeps_host_copies_on_the_host():
    batch, trees = mixed_batch("cuda")
    check_fields(batch, trees, "cuda")
    assert batch.qo_indptr_host.is_pinned() and batch.kv_indptr_host.is_pinned()
