"""The weight-streaming block-FP8 GEMM (Triton; the CPU runs it under Triton's interpreter,
which loads and converts float8_e4m3fn) against a float64 reference, and the GEMM dispatch.

Triton 3.6's interpreter multiplies bf16 ``tl.dot`` operands as their raw uint16 bits (its
``create_dot`` converts only 8-bit floats), so bf16 activations are checked on a GPU only;
fp16 and fp32 run the same kernel code on the CPU.

Tolerance: the kernel's largest error against float64 is at most twice a same-precision torch
reference's own (``F.linear`` on the weight dequantized into the activations' dtype), plus a
few ulps of the output's scale; float32 activations: within 1e-5 relative (fp32 sums in another order).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from serving.quant import fp8_gemm, gemm, stream_gemm
from serving.quant.fp8 import BlockFP8Weight, quantize
from tests.backend.fp8_models import block_dequantize, block_quantize, random_block_fp8

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs the kernel under Triton's interpreter


def fp8_weight(n: int, k: int, seed: int) -> BlockFP8Weight:
    return random_block_fp8(n, k, seed, DEVICE)


@pytest.mark.parametrize("m", [1, 5, 17, 64])
@pytest.mark.parametrize("n, k", [(96, 128), (200, 300), (256, 384), (1, 129)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_streaming_kernel_against_float64(m, n, k, dtype):
    if dtype == torch.bfloat16 and not torch.cuda.is_available():
        pytest.skip("Triton 3.6's interpreter runs tl.dot on bf16 operands as raw uint16 bits; bf16 is checked on a GPU")
    w = fp8_weight(n, k, seed=m * 1000 + n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + k)).to(device=DEVICE, dtype=dtype)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)  # poisoned: every element must be written
    got = fp8_gemm.w8_linear(x, w, out=out, programs=8)
    assert got is out and not torch.isnan(out).any()
    truth = x.cpu().double() @ block_dequantize(w.q.cpu(), w.scale_inv.cpu()).T
    err = (out.cpu().double() - truth).abs().max().item()
    if dtype == torch.float32:
        assert err <= 1e-5 * truth.abs().max().item() + 1e-30
        return
    ref = F.linear(x, w.dequantize(dtype)).cpu().double()  # same precision: bf16 weight, torch's GEMM
    ref_err = (ref - truth).abs().max().item()
    ulp = (2.0**-7 if dtype == torch.bfloat16 else 2.0**-10) * truth.abs().max().item()  # one ulp of the largest output
    assert err <= 2 * ref_err + 4 * ulp, (err, ref_err)


def test_split_k_sums_the_same_products():
    w, x = fp8_weight(64, 1024, seed=1), torch.randn(3, 1024).to(DEVICE)
    one = fp8_gemm.w8_linear(x, w, programs=1)
    eight = fp8_gemm.w8_linear(x, w, programs=8)  # one N tile, 8 programs along K
    assert stream_gemm.split_k(64, 1024, 64, 128, 8) == 8
    torch.testing.assert_close(one, eight, atol=1e-5, rtol=1e-5)


def test_split_k_sum_is_deterministic_and_leaves_the_counters_zero():
    """The last program of each N tile sums the partials and zeroes the tile's arrival counter:
    a second GEMM over the same counters (as a replayed graph's) writes every element again,
    bit for bit the same."""
    w, x = fp8_weight(200, 1024, seed=3), torch.randn(2, 1024).to(DEVICE)
    assert stream_gemm.split_k(200, 1024, 64, 128, 16) == 4
    outs = []
    for _ in range(2):
        out = torch.full((2, 200), float("nan"), device=DEVICE)  # poisoned: the sum must write it whole
        outs.append(fp8_gemm.w8_linear(x, w, out=out, programs=16))
        assert not torch.isnan(out).any()
        assert not stream_gemm.COUNTERS[x.device].any()
    assert torch.equal(outs[0], outs[1])
    truth = x.cpu().double() @ block_dequantize(w.q.cpu(), w.scale_inv.cpu()).T
    assert (outs[0].cpu().double() - truth).abs().max().item() <= 1e-5 * truth.abs().max().item()


def test_bad_inputs_are_refused():
    w = fp8_weight(64, 128, seed=2)
    with pytest.raises(ValueError, match="Expected 1 <= M <= 64 rows for the streaming kernel, got 65"):
        fp8_gemm.w8_linear(torch.randn(65, 128, device=DEVICE), w)
    with pytest.raises(ValueError, match=r"Expected a block-128 float8_e4m3fn weight \[N, 256\]"):
        fp8_gemm.w8_linear(torch.randn(2, 256, device=DEVICE), w)


def test_dispatch_on_the_cpu_is_the_dequantized_linear():
    w = quantize(torch.randn(200, 300))
    x, bias = torch.randn(7, 300), torch.randn(200)
    assert torch.equal(gemm.linear(x, w, bias), F.linear(x, w.dequantize(), bias))
    stacked = quantize(torch.randn(3, 200, 300))
    assert torch.equal(gemm.expert_matmul(x, stacked), torch.matmul(x, stacked.dequantize().transpose(1, 2)))
    assert torch.equal(stacked.dequantize()[1], stacked[1].dequantize())


def test_quantize_matches_the_block_reference():
    w = torch.randn(200, 300)
    held = quantize(w)
    q, s = block_quantize(w)
    assert torch.equal(held.scale_inv, s) and torch.equal(held.q.view(torch.uint8), q.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the dispatch runs the streaming kernel only on CUDA")
@pytest.mark.parametrize("m", [1, 8, 64, 65, 300])
def test_cuda_dispatch_against_float64(m):
    w = fp8_weight(7168 // 4, 2048, seed=m)
    x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    got = gemm.linear(x, w).double().cpu()
    truth = x.cpu().double() @ block_dequantize(w.q.cpu(), w.scale_inv.cpu()).T
    ref_err = (F.linear(x, w.dequantize(torch.bfloat16)).double().cpu() - truth).abs().max().item()
    assert (got - truth).abs().max().item() <= 2 * ref_err + 4 * 2.0**-7 * truth.abs().max().item()
