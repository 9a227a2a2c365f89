"""The fused RMSNorm and rope kernels (Triton's interpreter on the CPU) against the torch
versions the CPU path runs, on random rows with strided views as the model passes them."""

from __future__ import annotations

import pytest
import torch

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
