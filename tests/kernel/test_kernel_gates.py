"""The kernel phase's gates: verify catches planted bugs, roofline arithmetic, metric names, the plan."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernel.reference import mla_verify_reference
from phases.common import kernel_timing as timing
from phases.common.roofline import (
    Ceilings,
    mla_verify_bytes,
    mla_verify_flops,
    roofline_time,
)
from phases.kernel import benchmark, build, verify
from phases.kernel.bench import peers
from phases.kernel.bench.cases import build_inputs
from phases.kernel.bench.shapes import BENCH_SHAPES

REPO_ROOT = Path(__file__).resolve().parents[2]
PLAN_PATH = REPO_ROOT / "plans" / "0002-mla-verify-kernel-defrag.md"
SMALL = 8  # interpret-profile cases per in-process gate run

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# --- stand-in attention functions (same signature as kernel.mla_verify_attention) ----------------


def correct_attention(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask=None, sm_scale=None,
                      v_head_dim=512, out=None):
    result = mla_verify_reference(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, v_head_dim)
    if out is None:
        return result
    out.copy_(result)
    return out


def ignores_tree_mask(*args, tree_mask=None, **kwargs):
    return correct_attention(*args, tree_mask=None, **kwargs)


def writes_half_the_output(*args, out=None, **kwargs):
    result = correct_attention(*args, **kwargs)
    half = result.shape[-1] // 2
    out[..., :half] = result[..., :half]
    return out


def returns_a_new_tensor(*args, out=None, **kwargs):
    return correct_attention(*args, **kwargs)


def adds_call_dependent_noise(*args, out=None, **kwargs):
    adds_call_dependent_noise.calls += 1
    result = correct_attention(*args, **kwargs)
    out.copy_(result + 1e-3 * adds_call_dependent_noise.calls)
    return out


adds_call_dependent_noise.calls = 0


def writes_past_the_end(*args, out=None, **kwargs):
    correct_attention(*args, out=out, **kwargs)
    spill = torch.empty(0, dtype=out.dtype, device=out.device)
    spill.set_(out.untyped_storage(), out.storage_offset(), (out.numel() + 1,))
    spill[-1] = 0.0
    return out


def scales_the_output(*args, out=None, **kwargs):
    """Right but 0.9% too large everywhere: within the fixed 1e-2 bound, far past the input precision."""
    correct_attention(*args, out=out, **kwargs)
    out.mul_(1.009)
    return out


def always_raises(*args, **kwargs):
    raise RuntimeError("planted failure")


def run_interpret(attention_fn, limit=SMALL):
    return verify.run(profile="interpret", limit=limit, attention_fn=attention_fn)


# --- the verify gate -------------------------------------------------------------------------


def test_verify_passes_a_correct_implementation():
    metrics = run_interpret(correct_attention)
    assert metrics["cases"] == SMALL
    assert metrics["cases_failed"] == 0
    assert metrics["nan_cases"] == metrics["nondeterministic"] == metrics["overrun_cases"] == 0
    assert 0 < metrics["max_rel_err"] < 1e-2  # bf16/fp16 output rounding, measured in float64
    assert metrics["max_err_ratio"] <= 2


def test_verify_catches_a_dropped_tree_mask():
    metrics = verify.run(profile="interpret", attention_fn=ignores_tree_mask)
    assert metrics["cases_failed"] > 0
    assert metrics["max_rel_err"] > 1e-2
    assert metrics["nan_cases"] == 0


def test_verify_judges_error_against_the_input_precision():
    metrics = run_interpret(scales_the_output)
    assert metrics["max_rel_err"] < 1e-2  # the fixed bound alone would pass it
    assert metrics["max_err_ratio"] > 2
    assert metrics["cases_failed"] > 0


def test_verify_catches_unwritten_output():
    metrics = run_interpret(writes_half_the_output)
    assert metrics["nan_cases"] == SMALL
    assert metrics["cases_failed"] == SMALL


def test_verify_requires_writing_into_out():
    metrics = run_interpret(returns_a_new_tensor)
    assert metrics["not_out_cases"] == SMALL
    assert metrics["cases_failed"] == SMALL


def test_verify_catches_nondeterminism():
    metrics = run_interpret(adds_call_dependent_noise)
    assert metrics["nondeterministic"] == SMALL
    assert metrics["cases_failed"] == SMALL


def test_verify_catches_writes_past_out():
    metrics = run_interpret(writes_past_the_end)
    assert metrics["overrun_cases"] == SMALL
    assert metrics["cases_failed"] == SMALL


def test_verify_counts_raising_cases_and_continues():
    metrics = run_interpret(always_raises, limit=3)
    assert metrics["cases"] == 3
    assert metrics["cases_failed"] == metrics["errors"] == 3
    assert math.isnan(metrics["max_rel_err"]) and math.isnan(metrics["max_err_ratio"])  # nothing measured is not 0.0


def test_verify_writes_progress_and_artifacts(tmp_path, monkeypatch):
    progress = tmp_path / "progress.jsonl"
    monkeypatch.setenv("RUNNER_PROGRESS", str(progress))
    (tmp_path / "artifacts").mkdir()  # the runner makes the folder
    monkeypatch.setenv("RUNNER_ARTIFACTS", str(tmp_path / "artifacts"))
    run_interpret(ignores_tree_mask, limit=4)
    lines = [json.loads(line) for line in progress.read_text().splitlines()]
    assert lines[-1] == {"done": 4, "total": 4} and len(lines) == 4
    per_case = json.loads((tmp_path / "artifacts" / "verify-interpret.json").read_text())
    assert len(per_case) == 4
    assert {"case", "max_rel_err", "ok", "error"} <= set(per_case[0])
    summary = (tmp_path / "artifacts" / "verify-interpret.md").read_text()
    assert "| cases | 4 |" in summary


def test_interpret_profile_refuses_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        verify.run(profile="interpret", limit=1)


def test_verify_rejects_unknown_profile():
    with pytest.raises(ValueError, match="profile"):
        verify.run(profile="nightly")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_full_profile_needs_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        verify.run(profile="full", attention_fn=correct_attention)


def run_verify_subprocess(*extra: str, interpret_env: bool = True) -> dict:
    """``python -m phases.kernel.verify --profile interpret --json`` (the CLI sets the interpreter
    itself when ``TRITON_INTERPRET`` is absent)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    if not interpret_env:
        env.pop("TRITON_INTERPRET")
    env.pop("RUNNER_ARTIFACTS", None)
    env.pop("RUNNER_PROGRESS", None)
    completed = subprocess.run(
        [sys.executable, "-m", "phases.kernel.verify", "--profile", "interpret", "--json", *extra],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert completed.stdout.strip(), completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_kernel_passes_verify_under_the_interpreter():
    metrics = run_verify_subprocess("--limit", "6")
    assert metrics["cases"] == 6
    assert metrics["cases_failed"] == 0, metrics
    assert metrics["max_rel_err"] <= 1e-2 and metrics["max_err_ratio"] <= 2


@pytest.mark.slow
def test_verify_cli_turns_the_interpreter_on_itself():
    metrics = run_verify_subprocess("--limit", "2", interpret_env=False)
    assert metrics["cases"] == 2 and metrics["cases_failed"] == 0, metrics


@pytest.mark.gpu
@requires_cuda
def test_kernel_passes_verify_on_the_gpu_subset():
    metrics = verify.run(profile="full", limit=24)
    assert metrics["cases_failed"] == 0, metrics


# --- roofline arithmetic ---------------------------------------------------------------------


def test_bytes_for_one_request_by_hand():
    # H=16, T=8, L=65536, D=576, DV=512, bf16:
    # KV 65536*576*2 = 75_497_472; q 8*16*576*2 = 147_456; out 8*16*512*2 = 131_072
    assert mla_verify_bytes([65536], [8], num_heads=16) == 75_776_000


def test_flops_for_one_request_by_hand():
    # 2 * T * H * L * (D + DV) = 2 * 8 * 16 * 65536 * 1088 = 18_253_611_008
    assert mla_verify_flops([65536], [8], num_heads=16) == 18_253_611_008


def test_bytes_and_flops_for_a_ragged_batch():
    # requests (T, L) = (1, 100) and (3, 10), H=2, D=64, DV=32, 2-byte elements
    # KV 110*64*2 = 14_080; q 4*2*64*2 = 1_024; out 4*2*32*2 = 512
    assert mla_verify_bytes([100, 10], [1, 3], num_heads=2, head_dim=64, v_head_dim=32) == 15_616
    # 2*2*96*(1*100 + 3*10) = 49_920
    assert mla_verify_flops([100, 10], [1, 3], num_heads=2, head_dim=64, v_head_dim=32) == 49_920


def test_roofline_time_takes_the_binding_ceiling():
    ceilings = Ceilings(copy_bw_bytes_per_s=4e12, bf16_flops_per_s=800e12)
    assert roofline_time(4e12, 8e14, ceilings) == pytest.approx(1.0)  # both exactly 1 s
    assert roofline_time(8e12, 8e14, ceilings) == pytest.approx(2.0)  # memory-bound
    assert roofline_time(4e12, 16e14, ceilings) == pytest.approx(2.0)  # compute-bound


def test_bound_classes_and_context_labels():
    assert [benchmark.bound_class(h * t) for h, t in BENCH_SHAPES] == [
        "memory", "mid", "memory", "mid", "compute", "compute", "compute", "compute"
    ]
    assert [benchmark.context_label(c) for c in (4096, 65536, 262144, 65537)] == ["4k", "64k", "256k", "65537"]


# --- benchmark metrics and the plan's thresholds ---------------------------------------------


def synthetic_row(name, kind, context, heads, drafts, time_us, oracle_us=None, frac=0.9):
    return benchmark.BenchRow(
        name=name, kind=kind, context=context, num_heads=heads, num_draft=drafts, batch_size=1,
        total_kv=context, time_us=time_us, eager_us=time_us + 10.0, call_us=time_us + 30.0, kv_GBps=1.0, tflops=1.0, roofline_us=time_us * frac, frac=frac,
        bound=benchmark.bound_class(heads * drafts), oracle_us=oracle_us,
        speedup=None if oracle_us is None else oracle_us / time_us, rel_err=2e-3,
    )


def synthetic_rows():
    return [
        synthetic_row("h16_t1_16k", "sweep", 16384, 16, 1, 10.0, oracle_us=90.0, frac=0.5),
        synthetic_row("h16_t1_64k", "sweep", 65536, 16, 1, 20.0, oracle_us=300.0, frac=0.85),
        synthetic_row("h16_t8_128k", "sweep", 131072, 16, 8, 40.0, oracle_us=400.0, frac=0.7),
        synthetic_row("h128_t8_128k", "sweep", 131072, 128, 8, 200.0, oracle_us=8000.0, frac=0.55),
        synthetic_row("b8_h16_t8", "batch", 131072, 16, 8, 50.0, frac=0.6),
        synthetic_row("h16_t8_64k_tree", "tree", 65536, 16, 8, 21.0),
        synthetic_row("h16_t8_64k_causal", "causal", 65536, 16, 8, 20.0),
        synthetic_row("h16_t1_64k_scattered", "scattered", 65536, 16, 1, 22.0),
        synthetic_row("h16_t1_64k_contiguous", "contiguous", 65536, 16, 1, 20.0),
    ]


def test_benchmark_summary_metrics():
    metrics = benchmark.summarize(synthetic_rows(), Ceilings(4.25e12, 690e12))
    assert metrics["copy_bw_TBps"] == 4.25 and metrics["bf16_TFLOPs"] == 690.0
    assert metrics["min_frac_memory_64k"] == 0.85
    assert metrics["min_frac_mid_64k"] == 0.7
    assert metrics["min_frac_compute_64k"] == 0.55
    assert metrics["min_frac_memory_16k"] == 0.5
    assert "min_frac_mid_16k" not in metrics  # no such row ran: absent, never 0.0
    assert metrics["min_frac_batch8"] == 0.6
    assert metrics["min_speedup_64k"] == pytest.approx(10.0)
    assert metrics["tree_mask_overhead"] == pytest.approx(0.05)
    assert metrics["scattered_overhead"] == pytest.approx(0.10)
    assert metrics["rows"] == 9
    assert metrics["frac_h16_t8_128k"] == 0.7 and metrics["us_h16_t8_128k"] == 40.0


def test_benchmark_decode_and_ragged_metrics():
    """min_frac_decode_16k: the batched T=1 rows at 16k only; frac_ragged: the ragged batch."""
    rows = synthetic_rows() + [
        synthetic_row("b16_h128_t1_16k", "decode", 16384, 128, 1, 100.0, frac=0.49),
        synthetic_row("b64_h16_t1_16k", "decode", 16384, 16, 1, 300.0, frac=0.87),
        synthetic_row("b64_h128_t1_4k", "decode", 4096, 128, 1, 300.0, frac=0.33),
    ]
    metrics = benchmark.summarize(rows, Ceilings(4.25e12, 690e12))
    assert metrics["min_frac_decode_16k"] == 0.49
    assert metrics["frac_ragged"] == 0.6
    assert metrics["frac_b64_h128_t1_4k"] == 0.33  # reported


def test_benchmark_covers_the_issue_decode_rows():
    from phases.kernel.bench.shapes import decode_batch_shapes

    shapes = set(decode_batch_shapes())
    assert {(16, 128, 16384), (64, 16, 16384), (64, 128, 16384), (64, 128, 4096), (16, 16, 16384)} <= shapes


def test_benchmark_table_lists_every_row():
    rows = synthetic_rows()
    table = benchmark.markdown_table(rows, Ceilings(4.25e12, 690e12), {"name": "test GPU", "sm_count": 1})
    assert "4.250 TB/s" in table and "690.0 TFLOP/s" in table
    assert all(f"| {row.name} |" in table for row in rows)
    assert "| n/a | n/a |" in table


def fake_time_us(fn, *, warmup_ms, rep_ms):
    fn()
    return float(rep_ms)  # kernel rows: 200 us; oracle: 60 us


TINY_SPEC = benchmark.BenchSpec(
    contexts=(1024, 2048), shapes=((2, 1), (4, 8)), batch_contexts=(40, 300, 77), decode_shapes=((3, 2, 64),),
    comparison_context=512, oracle_min_context=2048,
)


def test_benchmark_rows_on_cpu_with_a_stand_in_kernel():
    rows = benchmark.measure_rows(TINY_SPEC, correct_attention, Ceilings(4e12, 700e12), torch.device("cpu"),
                                  time_fn=fake_time_us)
    assert [r.name for r in rows] == [
        "h2_t1_1k", "h4_t8_1k", "h2_t1_2k", "h4_t8_2k", "b3_h16_t8", "b3_h2_t1_64",
        "h16_t8_512_tree", "h16_t8_512_causal", "h16_t1_512_scattered", "h16_t1_512_contiguous",
    ]
    assert rows[5].kind == "decode" and rows[5].batch_size == 3 and rows[5].oracle_us is None
    assert [r.oracle_us is None for r in rows[:4]] == [True, True, False, False]
    layers = benchmark.DEFAULT_LAYERS
    assert all(r.layers == layers for r in rows)
    # time_us: one layer of the layered step (fake time 200 / layers); the host-bound times 100
    assert all(r.time_us == round(200 / layers, 2) and r.eager_us == r.call_us == 100.0 for r in rows)
    assert all(r.isolated_us is None for r in rows)  # no planned call: nothing is replayed alone
    assert rows[2].speedup == pytest.approx(60 / (200 / layers))
    assert max(r.rel_err for r in rows) < 1e-2
    metrics = benchmark.summarize(rows, Ceilings(4e12, 700e12))
    assert metrics["tree_mask_overhead"] == 0.0 and metrics["scattered_overhead"] == 0.0
    assert metrics["min_frac_batch8"] == metrics["frac_ragged"] == rows[4].frac
    assert metrics["frac_b3_h2_t1_64"] == rows[5].frac  # a decode row, not at 16k
    assert "min_frac_decode_16k" not in metrics and metrics["layers"] == layers


def test_benchmark_times_each_row_as_one_layer_of_a_step_of_distinct_layers():
    """Every layer its own inputs (pool, q, slots, tree) and its own planned call; the layered time is
    one replay of all of them divided by the layers; layer 0 is the row's own case; the pools
    together are past twice the L2."""
    prepared_inputs, calls = [], []

    def prepare_recording_run(inputs, out):
        prepared_inputs.append(inputs)
        index = len(prepared_inputs) - 1

        def call():
            calls.append(index)
            return correct_attention(**inputs, out=out)
        return call

    timed = []

    def recording_time_us(fn, *, warmup_ms, rep_ms):
        calls.clear()
        fn()
        timed.append(sorted(calls))
        return float(rep_ms)

    spec = benchmark.BenchSpec(contexts=(256,), shapes=((2, 8),), batch_contexts=(20,), decode_shapes=(),
                               comparison_context=64, layers=3)
    bench = benchmark._Bench(correct_attention, Ceilings(4e12, 700e12), torch.device("cpu"), spec,
                             recording_time_us, prepare_recording_run)
    case = benchmark._single_case(2, 8, 256, seed=5)
    row = bench.measure("h2_t8_256", "sweep", case)
    assert len(prepared_inputs) == 3
    pools = [inputs["kv_cache"] for inputs in prepared_inputs]
    assert len({p.data_ptr() for p in pools}) == 3 and not torch.equal(pools[0][:10], pools[1][:10])
    assert not torch.equal(prepared_inputs[0]["q"], prepared_inputs[2]["q"])
    own = build_inputs(case, "cpu", pool_factor=benchmark.layer_pool_factor(case, 3))  # layer 0: the row's case
    assert torch.equal(prepared_inputs[0]["q"], own["q"]) and torch.equal(prepared_inputs[0]["kv_indices"], own["kv_indices"])
    assert sum(p.numel() * p.element_size() for p in pools) >= 2 * benchmark.L2_BYTES
    assert timed[0] == [0, 1, 2]  # the layered step: every layer once
    assert (row.layers, row.time_us, row.rel_err < 1e-2) == (3, round(200 / 3, 2), True)


def test_benchmark_catches_a_layer_whose_replayed_output_differs():
    """A layer whose call is not reproducible (here: layer 2 gives different bits each call) fails the row."""
    made = []

    def prepare_run(inputs, out):
        made.append(inputs)
        if len(made) % 3 != 0:
            return lambda: correct_attention(**inputs, out=out)
        return lambda: adds_call_dependent_noise(**inputs, out=out)

    spec = benchmark.BenchSpec(contexts=(256,), shapes=((2, 8),), batch_contexts=(20,), decode_shapes=(),
                               comparison_context=64, layers=3)
    rows = benchmark.measure_rows(spec, correct_attention, Ceilings(4e12, 700e12), torch.device("cpu"),
                                  time_fn=fake_time_us, prepare_run=prepare_run)
    assert rows[0].rel_err == float("inf")


def test_benchmark_artifacts(tmp_path):
    rows = [synthetic_row("h16_t1_64k", "sweep", 65536, 16, 1, 20.0, oracle_us=300.0)]
    ceilings = Ceilings(4e12, 700e12)
    metrics = benchmark.summarize(rows, ceilings)
    table = benchmark.markdown_table(rows, ceilings, {"name": "test GPU"})
    benchmark.write_artifacts(tmp_path, rows, ceilings, {"name": "test GPU"}, metrics, table)
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["ceilings"] == {"copy_bw_bytes_per_s": 4e12, "bf16_flops_per_s": 700e12}
    assert saved["rows"][0]["name"] == "h16_t1_64k" and saved["metrics"]["rows"] == 1
    assert (tmp_path / "bench.md").read_text() == table
    fraction = json.loads((tmp_path / "roofline-fraction.plot.json").read_text())
    assert fraction["format"] == "runner.plot/1" and fraction["x"]["scale"] == "log"
    assert fraction["series"] == [{"label": "H=16 T=1", "points": [[65536.0, 0.9]], "reference": False}]
    bandwidth = json.loads((tmp_path / "kv-bandwidth.plot.json").read_text())
    assert [(s["label"], s["reference"]) for s in bandwidth["series"]] == [
        ("H=16 T=1", False), ("naive oracle H=16 T=1", True)
    ]


def test_benchmark_artifacts_go_through_the_runner(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_ARTIFACTS", str(tmp_path))
    rows = synthetic_rows()
    ceilings = Ceilings(4e12, 700e12)
    metrics = benchmark.summarize(rows, ceilings)
    benchmark.write_artifacts(None, rows, ceilings, {}, metrics, "table")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bench.json", "bench.md", "fixed_cost.md", "kv-bandwidth.plot.json", "roofline-fraction.plot.json"
    ]


SMALL_SPEC = benchmark.BenchSpec(contexts=(256,), shapes=((2, 8),), batch_contexts=(20,), decode_shapes=((2, 2, 64),),
                                 comparison_context=64, layers=2)


def test_benchmark_rows_record_a_wrong_kernel():
    rows = benchmark.measure_rows(SMALL_SPEC, ignores_tree_mask, Ceilings(4e12, 700e12), torch.device("cpu"),
                                  time_fn=fake_time_us)
    assert rows[0].rel_err > 1e-2


def test_benchmark_checks_the_planned_call_it_times():
    def prepare_wrong_run(inputs, out):  # the eager planned call; on a GPU it is also replayed from a graph
        return lambda: ignores_tree_mask(**inputs, out=out)

    rows = benchmark.measure_rows(SMALL_SPEC, correct_attention, Ceilings(4e12, 700e12), torch.device("cpu"),
                                  time_fn=fake_time_us, prepare_run=prepare_wrong_run)
    assert rows[0].rel_err > 1e-2


interpreting_or_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="the kernel needs a GPU or TRITON_INTERPRET=1 set before it is imported",
)


@interpreting_or_gpu
def test_planned_run_matches_the_one_call_api():
    from kernel import mla_verify_attention
    from phases.kernel.bench.cases import build_inputs, interpret_cases

    device = "cuda" if torch.cuda.is_available() else "cpu"
    case = next(c for c in interpret_cases(0) if c.batch_size > 1 and c.tree)
    inputs = build_inputs(case, device)
    one_call = mla_verify_attention(**inputs)
    out = torch.full_like(one_call, float("nan"))
    timing.planned_run(inputs, out)()  # on a GPU: a CUDA graph replay writing into `out`
    assert torch.equal(out, one_call)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graph capture)")
def test_planned_graph_replay_outlives_its_creator():
    """The replayed graph keeps the wrapper's plan and workspace alive: after the caller's
    references are gone and the allocator hands their memory to new tensors, replay is still right."""
    import gc

    from kernel import mla_verify_attention
    from phases.kernel.bench.cases import Case, build_inputs

    inputs = build_inputs(Case(num_heads=16, draft_lens=(1,), context_lens=(4096,)), "cuda")
    expected = mla_verify_attention(**inputs)
    out = torch.full_like(expected, float("nan"))
    replay = timing.planned_run(inputs, out)
    gc.collect()
    junk = [torch.full((1 << 20,), -1, dtype=torch.int32, device="cuda") for _ in range(64)]
    out.fill_(float("nan"))
    replay()
    torch.cuda.synchronize()
    del junk
    assert torch.equal(out, expected)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_benchmark_needs_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        benchmark.run(contexts=(4096,))


# --- build gate aggregation ------------------------------------------------------------------


def test_build_aggregates_distinct_configs():
    def fake_compile_stats(num_heads, max_draft):
        block_m = 16 if num_heads * max_draft <= 16 else 64
        return [
            {"kernel": "split", "config": f"M{block_m}", "n_regs": 128 if block_m == 16 else 255,
             "n_spills": 0 if block_m == 16 else 48, "shared_bytes": 1000 * block_m},
            {"kernel": "combine", "config": "R16", "n_regs": 40, "n_spills": 0, "shared_bytes": 0},
        ]

    stats = build.collect_stats(fake_compile_stats, BENCH_SHAPES)
    assert [(s["kernel"], s["config"]) for s in stats] == [("split", "M16"), ("combine", "R16"), ("split", "M64")]
    assert build.aggregate(stats) == {"configs": 3, "spills": 48, "max_regs": 255, "max_shared_bytes": 64000,
                                      "configs_triton": 3, "spills_triton": 48, "configs_hopper": 0, "spills_hopper": 0}
    assert "| split | M64 | 255 | 48 | 64000 |" in build.markdown_table(stats)


def test_build_counts_spills_per_path():
    stats = [{"kernel": "split", "config": "M64", "n_regs": 255, "n_spills": 8, "shared_bytes": 100, "path": "triton"},
             {"kernel": "hopper", "config": "BN64_S2_sm90", "n_regs": 168, "n_spills": 4, "shared_bytes": 229924,
              "path": "hopper"}]
    metrics = build.aggregate(stats)
    assert (metrics["spills"], metrics["spills_triton"], metrics["spills_hopper"]) == (12, 8, 4)
    assert (metrics["configs"], metrics["configs_triton"], metrics["configs_hopper"]) == (2, 1, 1)
    assert metrics["max_shared_bytes"] == 229924


def test_build_picks_the_dispatched_hopper_variants(monkeypatch):
    from kernel import hopper

    seen = []
    monkeypatch.setattr(build, "_hopper_variant_stats", lambda v, causal: seen.append((v, causal)) or
                        {"kernel": v.describe(), "config": str(causal), "n_regs": 1, "n_spills": 0, "shared_bytes": 1})
    stats = build.collect_stats(build.hopper_compile_stats, BENCH_SHAPES)
    assert {v for v, _ in seen} == {hopper.KEYS_AS_M_VARIANT, hopper.DEFAULT_VARIANT, hopper.SEESAW_VARIANT}
    assert len(stats) == 6


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_build_needs_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        build.run()


@pytest.mark.gpu
@requires_cuda
def test_build_gate_on_the_gpu():
    metrics = build.run()
    assert metrics["configs"] >= 1 and metrics["max_regs"] > 0


def test_tune_compile_sweep_table_and_config_names():
    from phases.kernel.bench import tune

    def fake_stats(cfg, causal):
        return {"n_regs": 200, "n_spills": 8 if causal else 0, "shared_bytes": cfg.block_n * 4096, "mma": "mma.sync"}

    rows = tune.compile_sweep((32,), (16, 64), (8,), (2,), stats=fake_stats)
    assert [r["config"] for r in rows] == ["BM32_BN16_w8_s2", "BM32_BN64_w8_s2"]
    assert [r["fits"] for r in rows] == [True, False]  # 64 * 4096 bytes > 227 KB
    assert "| BM32_BN16_w8_s2 | 200 / 200 | 0 / 8 | 65536 / 65536 | mma.sync | yes |" in tune.compile_table(rows)
    assert tune.parse_config("BM64_BN32_w4_s3", 132).describe() == "BM64_BN32_w4_s3"
    with pytest.raises(ValueError):
        tune.parse_config("BM64_BN32", 132)


def test_tune_compile_only_compiles_for_sm90_on_a_cpu():
    """One real sm_90 compile through the CLI, in a child process (the conftest turns on the
    interpreter on CPU machines; compiling needs it off)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = ["--compile-only", "--block-m", "32", "--block-n", "16", "--warps", "8", "--stages", "2"]
    run = subprocess.run([sys.executable, "-m", "phases.kernel.bench.tune", *args], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    row = next(line for line in run.stdout.splitlines() if line.startswith("| BM32_BN16_w8_s2 |"))
    assert row.endswith("| mma.sync | yes |")


# --- the shipped plan ------------------------------------------------------------------------


def test_plan_kernel_phase_gates_point_at_real_callables_and_metrics():
    """Structural only: every gate's callable exists and every expected metric is one the gate produces."""
    from runner.plan import load as planfile

    kernel_phase = planfile.load_plan(PLAN_PATH).plan.phase("kernel")
    gates = {gate.name: gate for gate in kernel_phase.gates}
    assert set(gates) == {"interpret", "build", "verify", "benchmark"}
    for gate in gates.values():
        module_name, _, function_name = gate.call.partition(":")
        assert callable(getattr(importlib.import_module(module_name), function_name))
    produced = benchmark.summarize(synthetic_rows() + [
        synthetic_row("h16_t8_16k", "sweep", 16384, 16, 8, 10.0),
        synthetic_row("h64_t8_16k", "sweep", 16384, 64, 8, 10.0),
        synthetic_row("b64_h128_t1_16k", "decode", 16384, 128, 1, 10.0),
    ], Ceilings(4e12, 700e12))
    assert {"min_frac_decode_16k", "frac_ragged"} <= set(produced)
    assert set(gates["benchmark"].expect) <= set(produced)
    assert set(gates["benchmark"].targets) <= set(produced)
    assert set(kernel_phase.headline_metrics()) <= set(produced)
    verify_metrics = run_interpret(correct_attention, limit=1)
    for name in ("interpret", "verify"):
        assert set(gates[name].expect) <= set(verify_metrics)
    assert set(gates["build"].expect) <= set(build.aggregate([]))


def test_plan_validates_against_the_runner_schema():
    from runner.plan import load as planfile

    document = planfile.load_plan(PLAN_PATH)
    assert document.status_section is not None
    kernel_phase = document.plan.phase("kernel")
    assert kernel_phase.headline_metrics() == [
        "min_speedup_64k", "tree_mask_overhead", "scattered_overhead", "min_frac_memory_64k", "min_frac_mid_64k",
        "min_frac_compute_64k",
    ]
    assert kernel_phase.gate("interpret").env == {"TRITON_INTERPRET": "1"}
    assert kernel_phase.gate("interpret").requires == []
    benchmark_gate = kernel_phase.gate("benchmark")
    assert benchmark_gate.required_devices() == ["cuda"]
    assert benchmark_gate.required_modules() == []  # the peers are phase frontier's (decision of 2026-12-06)
    frontier_peers = document.plan.phase("frontier").gate("peers")
    assert frontier_peers.required_modules() == list(peers.PEER_MODULES)  # blocked where the peers are missing
    assert all(gate.requires == ["cuda"] for phase in document.plan.phases for gate in phase.gates
               if (phase.id, gate.name) not in (("kernel", "interpret"), ("frontier", "peers")))


def test_plan_kernel_benchmark_is_the_seeds_phase_one_made_stricter():
    """Decision of 2026-12-06: speed over the oracle and the costs of the tree mask and scattered
    slots are thresholds, the fractions of the roofline targets; the peer ratios are frontier's."""
    from runner.plan import load as planfile

    gate = planfile.load_plan(PLAN_PATH).plan.phase("kernel").gate("benchmark")
    assert {name: str(value) for name, value in gate.expect.items()} == {
        "min_speedup_64k": ">= 5", "tree_mask_overhead": "<= 0.05", "scattered_overhead": "<= 0.10", "max_rel_err": "<= 1e-2"}
    assert not any(name.startswith(("min_frac_", "frac_", "min_peer_ratio")) for name in gate.expect)
    assert {name: str(gate.targets[name]) for name in ("min_frac_memory_64k", "min_frac_mid_64k",
                                                        "min_frac_compute_64k")} == {
        "min_frac_memory_64k": ">= 0.80", "min_frac_mid_64k": ">= 0.60", "min_frac_compute_64k": ">= 1.0"}


def test_fixed_cost_fit_recovers_a_planted_line_and_host_gaps_are_reported():
    """Rows on t = 7 µs + bytes / 3 TB/s give back a = 7 and BW = 3; the host-gap metrics are
    the largest eager and host-indptr one-call excesses over the replay time at B=1."""
    from phases.kernel.bench.fit import fit_fixed_cost, fit_table

    rows = []
    for context in (4096, 16384, 65536, 131072):
        t = 7.0 + context * 576 * 2 / 3e12 * 1e6
        row = synthetic_row(f"h16_t1_{context}", "sweep", context, 16, 1, t)
        row.call_host_us = t + (25.0 if context == 16384 else 5.0)
        rows.append(row)
    (fit,) = fit_fixed_cost(rows)
    assert (fit.num_heads, fit.num_draft, fit.points) == (16, 1, 4)
    assert abs(fit.a_us - 7.0) < 0.05 and abs(fit.bw_TBps - 3.0) < 0.01 and fit.max_resid_us < 0.05
    assert "| memory | 16 | 1 | 7.0 | 3.00 |" in fit_table([fit], 4.0)
    metrics = benchmark.summarize(rows, Ceilings(4.25e12, 690e12))
    assert metrics["max_eager_gap_us_b1"] == 10.0 and metrics["max_call_gap_us_b1"] == 25.0
