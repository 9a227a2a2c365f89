"""The host path of a call: lengths checked once per plan, plans staged through pinned buffers,
host indptrs. The checks run anywhere; the staging ring needs a GPU."""

from __future__ import annotations

import math

import pytest
import torch

from kernel import MLAVerifyWrapper, mla_verify_attention
from tests.kernel.oracle import reference
from tests.kernel.test_mla_verify import DEVICE, ON_GPU, make_inputs

gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (pinned staging, queued device work)")


def test_vectorized_host_checks_still_name_the_bad_request():
    inp = make_inputs([2, 3], [10, 20], 2, 64, torch.bfloat16, tree=False, scattered=True, seed=1)
    bad = torch.tensor([0, 2, 24], dtype=torch.int32, device=DEVICE)  # request 1: T=22 > L=20
    with pytest.raises(ValueError, match="L_b >= T_b for request 1"):
        mla_verify_attention(inp["q"], inp["kv"], bad, inp["kv_indptr"], inp["kv_indices"], v_head_dim=32)


@pytest.mark.parametrize("where", ["device", "host"])
def test_host_indptrs_give_the_same_bits_as_device_ones(where):
    inp = make_inputs([1, 4, 2], [300, 77, 1000], 4, 64, torch.bfloat16, tree=True, scattered=True, seed=2)
    to = (lambda t: t.cpu()) if where == "host" else (lambda t: t)
    got = mla_verify_attention(inp["q"], inp["kv"], to(inp["qo_indptr"]), to(inp["kv_indptr"]), inp["kv_indices"],
                               inp["tree_mask"], v_head_dim=32)
    want = mla_verify_attention(inp["q"], inp["kv"], inp["qo_indptr"], inp["kv_indptr"], inp["kv_indices"],
                                inp["tree_mask"], v_head_dim=32)
    assert torch.equal(got, want) and not torch.isnan(got).any()


@pytest.mark.gpu
@gpu_only
def test_many_queued_plans_through_the_staging_ring_each_keep_their_own_metadata():
    """More plans than staging buffers, each run queued behind the last without a host sync:
    every output must be its own batch's attention (a reused buffer would mix plans)."""
    torch.manual_seed(0)
    wrapper = MLAVerifyWrapper(DEVICE)
    runs = []
    for i in range(24):
        lens = [1 + (i * 7) % 5, 1 + (i * 3) % 4]
        ctx = [lens[0] + 200 * (i + 1), lens[1] + 5000 + 977 * i]
        inp = make_inputs(lens, ctx, 16, 576, torch.bfloat16, tree=True, scattered=True, seed=100 + i)
        wrapper.plan(inp["qo_indptr"].cpu(), inp["kv_indptr"].cpu(), 16)
        out = wrapper.run(inp["q"], inp["kv"], inp["kv_indices"], inp["tree_mask"], 0.05)
        runs.append((inp, out))
    torch.cuda.synchronize()
    for inp, out in runs:
        want = reference(inp["q"], inp["kv"], inp["qo_indptr"], inp["kv_indptr"], inp["kv_indices"], inp["masks"], 0.05, 512)
        err = ((out.double() - want).norm() / want.norm()).item()
        assert math.isfinite(err) and err < 1e-2, err
