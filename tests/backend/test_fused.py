"""The fused RMSNorm and rope kernels (Triton's interpreter on the CPU) against the torch
versions the CPU path runs, on random rows with strided views as the model passes them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from serving.model import fused
from serving.model.deepseek_v3 import rms_norm
from serving.model.presets import preset_config
from serving.model.rope import RotaryEmbedding

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs the kernels under Triton's interpreter


def torch_rms_norm(x, weight, eps):
    x32 = x.float()
    x32 = x32 * x32.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
    return weight * x32.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_kernel_matches_torch(dtype, residual):
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(5, 96, generator=gen).to(dtype) * 3
    x = wide[:, 16:80]  # a strided view, as the latent row's first part is
    weight = (1 + torch.randn(64, generator=gen) / 4).to(dtype)
    if residual:
        r = torch.randn(5, 64, generator=gen).to(dtype)
        got, total = (t.cpu() for t in fused.rms_norm(x.to(DEVICE), weight.to(DEVICE), 1e-6, residual=r.to(DEVICE)))
        if dtype == torch.float32:
            assert torch.equal(total, x + r)
        else:  # Triton's interpreter truncates float32 -> bf16 (a GPU rounds to nearest): one ulp apart at most
            torch.testing.assert_close(total.float(), (x + r).float(), rtol=2 ** -7, atol=0)
        want = torch_rms_norm(x + r, weight, 1e-6)
    else:
        got = fused.rms_norm(x.to(DEVICE), weight.to(DEVICE), 1e-6).cpu()
        want = torch_rms_norm(x, weight, 1e-6)
    tol = 1e-6 if dtype == torch.float32 else 2 ** -5  # bf16: up to three roundings (sum, cast, weight), one ulp each
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_kernel_matches_the_torch_rotation(interleave, dtype):
    cfg = preset_config("tiny", rope_interleave=interleave)
    rope = RotaryEmbedding(cfg, torch.device("cpu"))
    rope.ensure(64)
    gen = torch.Generator().manual_seed(1)
    heads, nope, width = 3, 8, cfg.qk_rope_head_dim
    q = torch.randn(6, heads, nope + width, generator=gen).to(dtype)
    latent = torch.randn(6, 32 + width, generator=gen).to(dtype)
    positions = torch.randint(0, 64, (6,), generator=gen)
    tables = rope.tables(positions, dtype)
    want = rope.apply(torch.cat([q[..., nope:], latent[:, None, 32:]], dim=1), positions, tables)
    got = fused.rope_q_and_key(q.to(DEVICE)[..., nope:], latent.to(DEVICE)[:, 32:], *(t.to(DEVICE) for t in tables), interleave).cpu()
    tol = 1e-6 if dtype == torch.float32 else 2 ** -6  # bf16: one rounding in the kernel against three in torch
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_model_norm_uses_the_torch_path_on_the_cpu():
    x = torch.randn(3, 8)
    assert torch.equal(rms_norm(x, torch.ones(8), 1e-6), torch_rms_norm(x, torch.ones(8), 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_row_write_matches_norm_cat_and_index_copy(dtype):
    gen = torch.Generator().manual_seed(2)
    rank, rope, n, slots_total = 48, 16, 5, 12
    rows = torch.randn(n, 8 + rank + rope, generator=gen).to(dtype) * 3
    latent = rows[:, 8 : 8 + rank]  # a strided view, as the fused q_a / kv_a GEMM's output gives it
    key = torch.randn(n, 3, rope, generator=gen).to(dtype)[:, 2]  # the roped key: one head of [N, H + 1, R]
    weight = (1 + torch.randn(rank, generator=gen) / 4).to(dtype)
    slots = torch.randperm(slots_total - 1, generator=gen)[:n] + 1
    poison = torch.full((slots_total, rank + rope), float("nan"), dtype=dtype)
    want = poison.clone().index_copy_(0, slots, torch.cat([torch_rms_norm(latent, weight, 1e-6), key], -1).to(dtype))
    got = poison.to(DEVICE)
    fused.write_kv_rows(got, slots.to(DEVICE), latent.to(DEVICE), weight.to(DEVICE), 1e-6, key.to(DEVICE))
    got = got.cpu()
    untouched = torch.ones(slots_total, dtype=torch.bool)
    untouched[slots] = False
    assert got[untouched].isnan().all(), "rows at other slots were written"
    assert not got[slots].isnan().any()
    assert torch.equal(got[slots][:, rank:], key), "the key is copied as it is"
    tol = 1e-6 if dtype == torch.float32 else 2 ** -5  # as the norm kernel's
    torch.testing.assert_close(got[slots].float(), want[slots].float(), rtol=tol, atol=tol)
    # against float64: within twice the error of torch's own same-precision row, plus one ulp
    exact = torch_rms_norm(latent.double(), weight.double(), 1e-6)
    err_kernel = (got[slots][:, :rank].double() - exact).abs().max()
    err_torch = (want[slots][:, :rank].double() - exact).abs().max()
    assert err_kernel <= 2 * err_torch + torch.finfo(dtype).eps * exact.abs().max()


def test_kv_row_write_refuses_a_pool_of_another_width():
    pool = torch.zeros(4, 10)
    with pytest.raises(ValueError, match="Expected pool rows of 12"):
        fused.write_kv_rows(pool, torch.tensor([1]), torch.zeros(1, 8), torch.ones(8), 1e-6, torch.zeros(1, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 2 * 40), (2, 3, 2 * 1500)])  # [N, 2I] and the experts' [G, N, 2I], I past one block
def test_silu_mul_matches_torch(dtype, shape):
    gen = torch.Generator().manual_seed(3)
    gate_up = (torch.randn(shape, generator=gen) * 4).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    want = F.silu(gate) * up
    got = fused.silu_mul(gate_up.to(DEVICE)).cpu()
    assert got.shape == want.shape and not got.isnan().any()
    exact = F.silu(gate.double()) * up.double()
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    else:  # two roundings, as torch's; the interpreter truncates where a GPU rounds: one ulp each at most
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -6, atol=2 ** -6)
    # elementwise against float64: twice torch's error plus the kernel's own: four ulps (a GPU's
    # float32 exp and division are approximate, two ulps each; bf16 rounds twice) and |gate| ulps
    # more, as tl.exp scales its argument by log2(e) in float32 (exp(-g) off by up to |g| * 2^-24)
    ulps = 4 + gate.double().abs()
    bound = 2 * (want.double() - exact).abs() + ulps * torch.finfo(dtype).eps * exact.abs() + 1e-30
    assert ((got.double() - exact).abs() <= bound).all()


def test_silu_mul_refuses_a_strided_input():
    with pytest.raises(ValueError, match="Expected a contiguous"):
        fused.silu_mul(torch.zeros(4, 6)[:, :4])
