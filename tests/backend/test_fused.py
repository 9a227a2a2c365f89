"""The fused RMSNorm, attention-input and activation kernels (Triton's interpreter on the CPU)
against the torch versions the CPU path runs, on random rows with strided views as the model
passes them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from serving.model import fused
from serving.model.deepseek_v3 import rms_norm
from serving.model.presets import preset_config
from serving.model.rope import RotaryEmbedding

ROOT = Path(__file__).resolve().parents[2]
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


def test_model_norm_uses_the_torch_path_on_the_cpu():
    x = torch.randn(3, 8)
    assert torch.equal(rms_norm(x, torch.ones(8), 1e-6), torch_rms_norm(x, torch.ones(8), 1e-6))


def attention_inputs(n, heads, nope, width, rank, dtype, interleave, seed):
    """Random inputs of ``fused.rope_and_kv_rows`` as the model passes them: q's rope heads and
    the kv_a row (latent, then the key) as strided views of wider GEMM outputs."""
    cfg = preset_config("tiny", rope_interleave=interleave, qk_rope_head_dim=width)
    rope = RotaryEmbedding(cfg, torch.device("cpu"))
    rope.ensure(64)
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(n, heads, nope + width, generator=gen) * 2).to(dtype)
    rows = (torch.randn(n, 8 + rank + width, generator=gen) * 3).to(dtype)
    latent = rows[:, 8:]  # [N, rank + R]: the fused q_a / kv_a GEMM's output gives a view
    weight = (1 + torch.randn(rank, generator=gen) / 4).to(dtype)
    positions = torch.randint(0, 64, (n,), generator=gen)
    return rope, q, latent, weight, positions, rope.tables(positions, dtype)


def run_fused(q, latent, rank, weight, tables, interleave, slots, slots_total, absorbed=True):
    """The kernel into NaN-poisoned outputs: the absorbed input [N, H, rank + R] (or [N, H, R])
    and a pool of ``slots_total`` rows. Returns both on the CPU."""
    n, heads, _ = q.shape
    width = latent.shape[1] - rank
    q_in = torch.full((n, heads, rank + width if absorbed else width), float("nan"), dtype=q.dtype, device=DEVICE)
    pool = torch.full((slots_total, rank + width), float("nan"), dtype=q.dtype, device=DEVICE)
    q_dev = q.to(DEVICE)
    fused.rope_and_kv_rows(q_dev[..., q.shape[-1] - width :], q_in[..., -width:], pool, slots.to(DEVICE), latent.to(DEVICE),
                           rank, weight.to(DEVICE), 1e-6, *(t.to(DEVICE) for t in tables), interleave)
    return q_in.cpu(), pool.cpu()


@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [1, 3, 16])
def test_rope_and_kv_rows_match_the_torch_path(interleave, dtype, heads):
    n, nope, width, rank, slots_total = 5, 8, 16, 48, 12
    rope, q, latent, weight, positions, tables = attention_inputs(n, heads, nope, width, rank, dtype, interleave, seed=heads)
    slots = torch.randperm(slots_total - 1, generator=torch.Generator().manual_seed(7))[:n] + 1
    q_in, pool = run_fused(q, latent, rank, weight, tables, interleave, slots, slots_total)

    roped = rope.apply(torch.cat([q[..., nope:], latent[:, None, rank:]], dim=1), positions, tables)
    want_pool = torch.full_like(pool, float("nan")).index_copy_(
        0, slots, torch.cat([torch_rms_norm(latent[:, :rank], weight, 1e-6), roped[:, heads]], -1).to(dtype))
    assert q_in[..., :rank].isnan().all(), "the latent columns are the W_UK product's, not this kernel's"
    assert not q_in[..., rank:].isnan().any()
    untouched = torch.ones(slots_total, dtype=torch.bool)
    untouched[slots] = False
    assert pool[untouched].isnan().all(), "rows at other slots were written"
    assert not pool[slots].isnan().any()
    # bf16: the kernel rounds the rotation once (torch three times) and the norm's sum in another order
    tol = 1e-6 if dtype == torch.float32 else 2 ** -5
    torch.testing.assert_close(q_in[..., rank:].float(), roped[:, :heads].float(), rtol=tol, atol=tol)
    torch.testing.assert_close(pool[slots].float(), want_pool[slots].float(), rtol=tol, atol=tol)

    # against float64, each part (q's heads, the norm, the key): within twice the error of
    # torch's same-precision result plus one ulp of the part's largest value
    exact_rope = rope.apply(torch.cat([q[..., nope:], latent[:, None, rank:]], dim=1).double(), positions,
                            tuple(t.double() for t in tables))
    exact = torch.cat([exact_rope[:, :heads].flatten(1), torch_rms_norm(latent[:, :rank].double(), weight.double(), 1e-6),
                       exact_rope[:, heads]], -1)
    got = torch.cat([q_in[..., rank:].flatten(1), pool[slots]], -1).double()
    torch_same = torch.cat([roped[:, :heads].flatten(1), want_pool[slots]], -1).double()
    for part in (slice(0, heads * width), slice(heads * width, heads * width + rank), slice(heads * width + rank, None)):
        err_kernel = (got[:, part] - exact[:, part]).abs().max()
        err_torch = (torch_same[:, part] - exact[:, part]).abs().max()
        assert err_kernel <= 2 * err_torch + torch.finfo(dtype).eps * exact[:, part].abs().max()


def test_rope_and_kv_rows_into_a_separate_rope_tensor():
    """The extend path: q's roped heads into their own [N, H, R] tensor, the same values."""
    n, heads, nope, width, rank = 4, 2, 8, 16, 32
    _, q, latent, weight, _, tables = attention_inputs(n, heads, nope, width, rank, torch.float32, False, seed=9)
    slots = torch.tensor([3, 0, 5, 2])
    q_in, pool = run_fused(q, latent, rank, weight, tables, False, slots, 6)
    q_rope, pool_alone = run_fused(q, latent, rank, weight, tables, False, slots, 6, absorbed=False)
    assert torch.equal(q_rope, q_in[..., rank:])
    assert torch.equal(pool_alone[slots], pool[slots])


def test_a_planted_rotation_bug_is_caught():
    """The comparison above fails on a kernel that rotates the key with the other layout."""
    n, heads, nope, width, rank = 3, 2, 8, 16, 32
    rope, q, latent, weight, positions, tables = attention_inputs(n, heads, nope, width, rank, torch.float32, True, seed=4)
    slots = torch.tensor([0, 1, 2])
    _, wrong = run_fused(q, latent, rank, weight, tables, False, slots, 3)  # the non-interleaved layout
    roped = rope.apply(torch.cat([q[..., nope:], latent[:, None, rank:]], dim=1), positions, tables)
    assert not torch.allclose(wrong[:, rank:], roped[:, heads], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("change", "message"), [
    ("q_out dtype", "Expected q_out of shape"),
    ("q_out shape", "Expected q_out of shape"),
    ("pool width", "Expected latent"),
    ("slots", "Expected slots"),
    ("strided key", "Expected unit last strides"),
])
def test_rope_and_kv_rows_refuse_mismatched_inputs(change, message):
    n, heads, width, rank = 2, 2, 4, 8
    q_rope = torch.zeros(n, heads, width)
    q_out = torch.zeros(n, heads, width)
    pool = torch.zeros(4, rank + width)
    slots = torch.tensor([0, 1])
    latent = torch.zeros(n, rank + width)
    if change == "q_out dtype":
        q_out = q_out.bfloat16()
    elif change == "q_out shape":
        q_out = torch.zeros(n, heads + 1, width)
    elif change == "pool width":
        pool = torch.zeros(4, rank + width + 2)
    elif change == "slots":
        slots = torch.tensor([0, 1, 2])
    else:
        latent = torch.zeros(n, 2 * (rank + width))[:, ::2]
    with pytest.raises(ValueError, match=message):
        fused.rope_and_kv_rows(q_rope, q_out, pool, slots, latent, rank, torch.ones(rank), 1e-6,
                               torch.zeros(n, width // 2), torch.zeros(n, width // 2), False)


# Compiled in a child process: the suite runs Triton's interpreter, which never compiles.
_COMPILE_FOR_HOPPER = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from serving.model.fused import _rope_and_kv_row_kernel as kernel
types = {"Q": "*bf16", "QOut": "*bf16", "Latent": "*bf16", "W": "*bf16", "Cos": "*bf16", "Sin": "*bf16", "Slots": "*i64",
         "Pool": "*bf16", "eps": "fp32"}
signature = {n: types.get(n, "i32") for n in kernel.arg_names}
for interleave in (True, False):
    constexprs = dict(INTERLEAVE=interleave, NORM_DTYPE=triton.language.bfloat16, BLOCK_H=16, BLOCK_D=32, BLOCK_R=512)
    signature.update({n: "constexpr" for n in constexprs})
    triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
"""


def test_attention_input_kernel_compiles_for_hopper():
    """DeepSeek-V3's shapes (16 heads a rank, rope 64, rank 512) compile for sm_90, no GPU needed."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_HOPPER], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_absorbed_products_are_written_in_place_on_the_gpu():
    """On a GPU the W_UK product lands in the input's latent columns with no copy after it, its
    rope columns kept; the W_UV product lands token-major with no copy: both within torch's
    error of the float64 product."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, heads, nope, rank, width = 4, 16, 128, 512, 64
    q_nope = torch.randn(n, heads, nope, generator=gen, device="cuda", dtype=torch.bfloat16)
    w_uk = torch.randn(heads, nope, rank, generator=gen, device="cuda", dtype=torch.bfloat16) / 16
    q_rope = torch.randn(n, heads, width, generator=gen, device="cuda", dtype=torch.bfloat16)
    want = torch.cat([torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1), q_rope], dim=-1)
    q_in = torch.full((n, heads, rank + width), float("nan"), device="cuda", dtype=torch.bfloat16)
    q_in[..., rank:] = q_rope
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.bmm(q_nope.transpose(0, 1), w_uk, out=q_in[..., :rank].transpose(0, 1))
        torch.cuda.synchronize()
    assert_no_copy(prof)
    exact = torch.bmm(q_nope.transpose(0, 1).double(), w_uk.double()).transpose(0, 1)
    assert torch.equal(q_in[..., rank:], q_rope)
    assert_within_torch_error(q_in[..., :rank], want[..., :rank], exact)

    latent_out = torch.randn(n, heads, rank, generator=gen, device="cuda", dtype=torch.bfloat16)
    w_uv = torch.randn(heads, nope, rank, generator=gen, device="cuda", dtype=torch.bfloat16) / 16
    want = torch.bmm(latent_out.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)
    out = torch.full((n, heads, nope), float("nan"), device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.bmm(latent_out.transpose(0, 1), w_uv.transpose(1, 2), out=out.transpose(0, 1))
        torch.cuda.synchronize()
    assert_no_copy(prof)
    assert_within_torch_error(out, want, torch.bmm(latent_out.transpose(0, 1).double(), w_uv.transpose(1, 2).double()).transpose(0, 1))


def assert_no_copy(prof):
    """The profiled product ran its GEMM and no copy or elementwise kernel after it."""
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert kernels and not any("copy" in k.lower() or "elementwise" in k.lower() for k in kernels), kernels


def assert_within_torch_error(got, torch_same, exact):
    """No NaN, and within twice the error of torch's own product plus one ulp of the largest."""
    assert not got.isnan().any()
    err, err_torch = (got.double() - exact).abs().max(), (torch_same.double() - exact).abs().max()
    assert err <= 2 * err_torch + torch.finfo(got.dtype).eps * exact.abs().max()


@pytest.mark.parametrize("spec", [None, "mtp:2x2"])
def test_the_model_through_the_fused_kernels_decodes_as_through_torch(monkeypatch, spec):
    """The tiny MTP model's greedy tokens, decode and verify steps, with every fused kernel run
    (Triton's interpreter on the CPU) against the torch path: the in-place attention input
    (the bmm into its latent columns) included."""
    from serving.model.presets import random_model
    from serving.stack import ServingConfig, build_engine

    model = random_model("tiny", seed=3, num_nextn_predict_layers=1)
    prompts = [[1, 2, 3, 4, 5], [9, 9, 4], list(range(20, 41))]

    def tokens():
        stack = build_engine(ServingConfig(backend="reference", speculate=spec, pool_slots=512), model)
        return [r.output for r in stack.engine.generate(prompts, 10)]

    want = tokens()
    calls = []
    real = fused.rope_and_kv_rows
    monkeypatch.setattr(fused, "available", lambda x: True)
    monkeypatch.setattr(fused, "rope_and_kv_rows", lambda *a: calls.append(1) or real(*a))
    assert tokens() == want
    assert calls, "the fused path did not run"


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
