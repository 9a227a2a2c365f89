"""Prefill attention (``serving.attention.prefill``) against float64, and the engine's
prefill through it against the masked path it replaced.

Every method that runs here is checked on fresh random inputs in the engine's layouts, its output
buffer filled with NaN first, against a float64 reference: its error must stay within
``BOUND`` times the error of the same-precision materialized reference (``reference`` in q's
dtype), so a bf16 method is held to bf16's own accuracy, not to float64's. The CUDA methods
(cudnn, flash, efficient) run only on a GPU (``gpu`` marker).
"""

from __future__ import annotations

import math

import pytest
import torch

from serving.attention import prefill as pa
from serving.model.presets import random_model
from serving.stack import ServingConfig, build_engine

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

BOUND = 4.0  # a method's error over the same-precision materialized reference's, both against float64
SHAPES = [(40, 0), (33, 91), (1, 0), (1, 57), (50, 23)]  # (queries, prefix): n=50 spans four 16-query slices
CPU_METHODS = ("cpu", "masked")


@pytest.fixture(autouse=True)
def fresh_choice(monkeypatch):
    """Each test selects (and probes) again: no method chosen or skipped by another test."""
    monkeypatch.setattr(pa, "_chosen", {})
    monkeypatch.setattr(pa, "_skipped", {})


@pytest.fixture
def small_slices(monkeypatch):
    monkeypatch.setattr(pa, "QUERY_SLICE", 16)
    monkeypatch.setattr(pa, "MASKED_SLICE", 16)


def errors(method, n, prefix, dtype, device, seed, heads=2, qk=24, dv=16):
    """(method's max error, same-precision reference's max error), both against float64."""
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v = pa.engine_layout(n, prefix, heads, qk, dv, dtype, device, gen, nope=dv)
    scale = 1.0 / math.sqrt(qk)
    truth = pa.reference(q, k, v, prefix, scale, torch.float64)
    out = torch.full((heads, n, dv), float("nan"), dtype=dtype, device=device)
    got = pa.causal_prefill(q, k, v, prefix, scale, method, out=out)
    assert got.data_ptr() == out.data_ptr() and got.dtype == dtype and got.shape == (heads, n, dv)
    assert not torch.isnan(got).any(), f"{method} left rows unwritten or produced NaN"
    same = pa.reference(q, k, v, prefix, scale, dtype)
    return (got.double() - truth).abs().max().item(), (same.double() - truth).abs().max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,prefix", SHAPES)
@pytest.mark.parametrize("method", CPU_METHODS)
def test_cpu_methods_match_float64(method, n, prefix, dtype, small_slices):
    err, ref = errors(method, n, prefix, dtype, "cpu", seed=1000 * n + prefix)
    assert err <= BOUND * ref + 1e-12, f"{method} n={n} prefix={prefix} {dtype}: {err:.3g} against the reference's {ref:.3g}"


def test_float64_stays_float64():
    err, ref = errors("cpu", 33, 91, torch.float64, "cpu", seed=7)
    assert err <= 1e-12 and ref <= 1e-12


def test_the_default_slice_is_one_call_and_results_do_not_depend_on_slicing(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    q, k, v = pa.engine_layout(50, 23, 2, 24, 16, torch.float32, "cpu", gen, nope=16)
    whole = pa.causal_prefill(q, k, v, 23, 0.2, "cpu")
    monkeypatch.setattr(pa, "QUERY_SLICE", 16)
    sliced = pa.causal_prefill(q, k, v, 23, 0.2, "cpu")
    torch.testing.assert_close(sliced, whole, atol=2e-6, rtol=0)


def test_cpu_is_chosen_on_the_cpu_after_its_probe():
    assert pa.select_method("cpu", torch.float32, 24, 16) == "cpu"
    assert pa.skipped_methods("cpu", torch.float32, 24, 16) == {}
    assert pa.probe("cpu", torch.device("cpu"), torch.bfloat16, 192, 128) == (True, "")


def test_cuda_methods_fail_their_probe_on_the_cpu_with_a_reason():
    for method in pa.CUDA_ORDER:
        ok, why = pa.probe(method, torch.device("cpu"), torch.float32, 24, 16)
        assert not ok and why.startswith(("NotImplementedError", "RuntimeError"))


def test_a_method_failing_its_probe_is_skipped_with_a_warning(monkeypatch):
    real = pa._one_call

    def broken(q, k, v, prefix, scale, method):
        if method == "cpu":
            return real(q, k, v, prefix, scale, method) + 1.0  # wrong, not raising
        return real(q, k, v, prefix, scale, method)

    monkeypatch.setattr(pa, "_one_call", broken)
    with pytest.warns(UserWarning, match="cpu skipped"):
        assert pa.select_method("cpu", torch.float32, 24, 16) == "masked"
    assert "error" in pa.skipped_methods("cpu", torch.float32, 24, 16)["cpu"]


def test_a_chosen_method_that_raises_later_falls_back_and_the_call_still_answers(monkeypatch):
    real = pa._one_call

    def fails_on_long(q, k, v, prefix, scale, method):
        if q.shape[1] > 100:  # past every probe shape
            raise RuntimeError("no execution plan for this shape")
        return real(q, k, v, prefix, scale, method)

    monkeypatch.setattr(pa, "_one_call", fails_on_long)
    gen = torch.Generator().manual_seed(5)
    q, k, v = pa.engine_layout(120, 30, 2, 24, 16, torch.float32, "cpu", gen, nope=16)
    with pytest.warns(UserWarning, match="cpu skipped.*raised at n=120, prefix=30"):
        got = pa.causal_prefill(q, k, v, 30, 0.2)
    assert pa.select_method("cpu", torch.float32, 24, 16) == "masked"
    torch.testing.assert_close(got.double(), pa.reference(q, k, v, 30, 0.2), atol=1e-5, rtol=0)


def test_bad_shapes_are_refused():
    q, k, v = pa.engine_layout(8, 4, 2, 24, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="Expected 5 \\+ 8 keys"):
        pa.causal_prefill(q, k, v, 5, 0.2, "cpu")
    with pytest.raises(ValueError, match="Expected out \\[2, 8, 16\\]"):
        pa.causal_prefill(q, k, v, 4, 0.2, "cpu", out=torch.empty(2, 8, 24))
    with pytest.raises(ValueError, match="Expected a method in"):
        pa.causal_prefill(q, k, v, 4, 0.2, "sdpa")


# ---- the engine's prefill: the new path against the masked one it replaced ---------------------


@pytest.fixture(scope="module")
def model():
    return random_model("tiny", seed=11)


def prefill_logits(model, prompt, chunk, method):
    eng = build_engine(ServingConfig(backend="reference", pool_slots=512, prefill_chunk=chunk), model).engine
    eng.runner.backend.prefill_method = method
    req = eng.add_request(prompt, 6)
    logits = []
    real_extend = eng.runner.extend

    def keep(step):  # the last chunk's logits: the first token's
        out = real_extend(step)
        if out is not None:
            logits.append(out.clone())
        return out

    eng.runner.extend = keep
    eng.run([req])
    assert req.error is None and eng.pool.leaked_slots() == 0
    return logits[-1], req.output


@pytest.mark.parametrize("chunk", [32768, 7])
def test_engine_prefill_matches_the_masked_path(model, chunk):
    """Prefill of one chunk (prefix 0) and of 7-token chunks (every later chunk over a prefix):
    the same first-token logits within float32 noise, the same greedy tokens."""
    prompt = torch.randint(0, model.cfg.vocab_size, (45,), generator=torch.Generator().manual_seed(chunk)).tolist()
    new_logits, new_tokens = prefill_logits(model, prompt, chunk, None)
    old_logits, old_tokens = prefill_logits(model, prompt, chunk, "masked")
    assert pa.select_method("cpu", model.dtype, model.cfg.qk_head_dim, model.cfg.v_head_dim) == "cpu"
    torch.testing.assert_close(new_logits, old_logits, atol=1e-5, rtol=0)
    assert new_tokens == old_tokens


# ---- CUDA ------------------------------------------------------------------------------------


@gpu
@needs_cuda
@pytest.mark.parametrize("n,prefix", [(1000, 0), (777, 3001), (1, 500), (40, 23)])
@pytest.mark.parametrize("method", pa.CUDA_ORDER)
def test_cuda_methods_match_float64_on_the_engine_shapes(method, n, prefix):
    """dsv3-tp8's heads (16, qk 192, v 128) in bf16: within ``BOUND`` times the masked path's error."""
    ok, why = pa.probe(method, torch.device("cuda"), torch.bfloat16, 192, 128)
    if not ok:
        pytest.skip(f"{method} fails its probe here: {why}")
    gen = torch.Generator(device="cuda").manual_seed(n + prefix)
    q, k, v = pa.engine_layout(n, prefix, 16, 192, 128, torch.bfloat16, "cuda", gen, nope=128)
    scale = 1.0 / math.sqrt(192)
    truth = pa.reference(q, k, v, prefix, scale, torch.float64)
    out = torch.full((16, n, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    got = pa.causal_prefill(q, k, v, prefix, scale, method, out=out)
    assert not torch.isnan(got).any()
    err = (got.double() - truth).abs().max().item()
    base = (pa.masked_prefill(q, k, v, prefix, scale).double() - truth).abs().max().item()
    assert err <= BOUND * base, f"{method}: {err:.3g} against the masked path's {base:.3g}"


@gpu
@needs_cuda
def test_a_fused_method_is_chosen_on_cuda():
    chosen = pa.select_method("cuda", torch.bfloat16, 192, 128)
    assert chosen in pa.CUDA_ORDER, pa.skipped_methods("cuda", torch.bfloat16, 192, 128)


# ---- the benchmark's host side ---------------------------------------------------------------


def test_bench_flops_table_and_refusals(capsys):
    from phases.backend.bench import prefill_attention as bench

    assert bench.chunk_flops(2, 3, heads=1, qk=1, dv=1) == 2 * 2 * (2 * 3 + 3)  # keys seen: 4 + 5
    assert bench.chunk_flops(8192, 0) == 2 * 16 * 320 * 8192 * 8193 // 2
    row = dict(ms=2.0, first_ms=40.0, tflops=300.0, frac_bf16_mm=0.45, err_vs_masked=1.1, exact=True)
    result = dict(device="GPU", torch="2.11", cudnn=91000, bf16_flops_per_s=6.9e14, avoid_recompile=None,
                  engine_choice="cudnn", engine_skipped={}, ttft=[],
                  chunks=[dict(prefix=0, winner="cudnn", methods={"masked": dict(row, ms=4.0), "cudnn": row,
                                                                 "flex": dict(method="flex", skipped="RuntimeError: no")})])
    text = bench.table(result)
    assert "| 0 | cudnn **fastest exact** | 2.00 | 40.0 | 300 | 0.45 | 1.10 | yes | 2.00x |" in text
    assert "| 0 | flex | skipped: RuntimeError: no |" in text
    assert bench.main(["--methods", "cudnn,sdpa"]) == 2
    if not torch.cuda.is_available():
        assert bench.main([]) == 3
    assert "Expected methods of" in capsys.readouterr().err
