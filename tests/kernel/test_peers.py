"""The peer comparison of the benchmark gate (``phases.kernel.bench.peers``) on a CPU: its rows,
the shared 64-token pages, how a row is checked and turned into ratio samples, the metrics, and
that the peers are imported only when asked for."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kernel.reference import mla_verify_reference
from phases.common.roofline import Ceilings
from phases.kernel.bench import peers
from phases.kernel.bench.cases import PRODUCTION_SM_SCALE, Case
from phases.kernel.bench.shapes import (
    BATCH8_CONTEXTS,
    BENCH_SHAPES,
    DEFAULT_CONTEXTS,
    context_label,
    decode_batch_shapes,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
CEILINGS = Ceilings(4e12, 700e12)


def test_the_17_rows_are_gate_rows_in_five_classes():
    shapes = peers.peer_shapes()
    gate_rows = {f"h{h}_t{t}_{context_label(c)}" for h, t in BENCH_SHAPES for c in DEFAULT_CONTEXTS}
    gate_rows |= {f"b{b}_h{h}_t1_{context_label(c)}" for b, h, c in decode_batch_shapes()}
    gate_rows.add(f"b{len(BATCH8_CONTEXTS)}_h16_t8")
    assert len(shapes) == 17 and {s.name for s in shapes} <= gate_rows
    counts = {klass: [s.name for s in shapes if s.klass == klass] for klass in peers.PEER_CLASSES}
    assert counts["memory"] == ["h16_t1_16k", "h16_t1_64k"]
    assert counts["compute"] == ["h128_t8_16k", "h128_t8_64k"]
    assert sorted(counts["mid"]) == ["h128_t1_16k", "h128_t1_64k", "h16_t8_16k", "h16_t8_64k"]
    assert len(counts["decode"]) == 8 and counts["ragged"] == ["b8_h16_t8"]
    assert all(not s.case.tree for s in shapes)  # the peers have no tree mask: every kernel runs causal
    assert len({s.case.seed for s in shapes}) == 17


def test_paged_inputs_give_all_three_kernels_the_same_rows():
    case = Case(num_heads=2, draft_lens=(3, 3), context_lens=(70, 130), tree=False, seed=4)
    inp = peers.paged_inputs(case, "cpu", min_pool_bytes=0)
    assert inp.pool.shape[1:] == (64, 576) and inp.q.shape == (6, 2, 576)
    assert inp.pool.shape[0] >= peers.POOL_FACTOR * (2 + 3)
    assert inp.seqlens.tolist() == [70, 130] and inp.kv_indptr_host.tolist() == [0, 70, 200]
    for b, length in enumerate(case.context_lens):
        positions = torch.arange(length)
        through_table = inp.block_table[b, positions // 64] * 64 + positions % 64  # FlashMLA's view
        assert torch.equal(inp.kv_indices[inp.kv_indptr_host[b]:inp.kv_indptr_host[b + 1]], through_table.int())
    used = torch.cat([inp.block_table[0, :2], inp.block_table[1, :3]])
    assert len(set(used.tolist())) == 5  # no page shared
    big = peers.paged_inputs(case, "cpu")
    assert big.pool.numel() * 2 >= peers.MIN_POOL_BYTES  # past twice the L2
    with pytest.raises(ValueError, match="Expected one T"):
        peers.paged_inputs(Case(num_heads=2, draft_lens=(1, 3), context_lens=(70, 130)), "cpu")


def _oracle(inp: peers.PagedInputs) -> torch.Tensor:
    return mla_verify_reference(inp.q, inp.slots, inp.qo_indptr_host, inp.kv_indptr_host, inp.kv_indices, None,
                                PRODUCTION_SM_SCALE, 512, compute_dtype=torch.float32, out_dtype=torch.float32)


def _small_shape(klass: str = "mid") -> tuple[peers.PeerShape, peers.PagedInputs]:
    shape = peers.PeerShape("h2_t2_100", klass, Case(num_heads=2, draft_lens=(2,), context_lens=(100,), tree=False,
                                                      seed=3))
    return shape, peers.paged_inputs(shape.case, "cpu", min_pool_bytes=0)


def _right(inp):
    """A maker of a call that writes the right output into its own ``out``."""
    right = _oracle(inp).to(torch.bfloat16)

    def make():
        out = torch.full_like(right, float("nan"))
        return peers._Call(lambda: out.copy_(right), lambda: out)
    return make


def _fixed_rounds(times: dict[str, list[float]]):
    """A time_fn that replays each call once and reports ``times`` as the rounds' medians."""
    seen = {}

    def time_fn(replays, flush, repetitions, per_repetition):
        for replay in replays.values():
            replay()
        seen.update(kernels=sorted(replays), repetitions=repetitions, per_repetition=per_repetition)
        return {k: times[k][:repetitions] for k in replays}
    return time_fn, seen


def test_a_row_is_ratio_samples_of_the_best_peer_over_the_project():
    shape, inp = _small_shape()
    time_fn, seen = _fixed_rounds({"project": [10.0, 10.0, 20.0], "flashmla": [12.0, 12.0, 12.0],
                                   "flashinfer": [11.0, 11.5, 30.0]})
    makers = {k: _right(inp) for k in peers.KERNELS}
    row = peers.measure_row(shape, inp, makers, CEILINGS, capture=lambda fn: fn, time_fn=time_fn, flush=lambda: None,
                            repetitions=3, replays=7)
    assert seen == {"kernels": ["flashinfer", "flashmla", "project"], "repetitions": 3, "per_repetition": 7}
    assert row.best_peer == "flashinfer"  # median 11.5 against FlashMLA's 12
    assert row.ratios == [1.1, 1.15, 1.5] and row.ratio == 1.15
    assert row.errors == {} and max(row.rel_err.values()) < 1e-2
    assert row.roofline_us > 0 and row.context_lens == [100]


def test_a_wrong_or_raising_peer_is_named_and_not_timed():
    shape, inp = _small_shape()
    time_fn, _ = _fixed_rounds({"project": [10.0], "flashmla": [5.0], "flashinfer": [9.0]})
    wrong = torch.zeros(2, 2, 512, dtype=torch.bfloat16)

    def raising():
        raise RuntimeError("shape refused")

    makers = {"project": _right(inp), "flashmla": lambda: peers._Call(lambda: None, lambda: wrong),
              "flashinfer": raising}
    row = peers.measure_row(shape, inp, makers, CEILINGS, capture=lambda fn: fn, time_fn=time_fn, flush=lambda: None,
                            repetitions=1, replays=1)
    assert "relative error" in row.errors["flashmla"] and "shape refused" in row.errors["flashinfer"]
    assert set(row.rounds_us) == {"project"} and row.best_peer is None and row.ratios == []


def test_a_project_whose_replays_do_not_write_gives_the_row_no_ratio():
    """Right eagerly, but its captured call writes nothing: the output is still the poison after the
    timed replays, so the project's rounds are dropped and the row has no ratio."""
    shape, inp = _small_shape()
    time_fn, _ = _fixed_rounds({"project": [10.0], "flashmla": [12.0], "flashinfer": [11.0]})
    project = _right(inp)()
    makers = {"project": lambda: project, "flashmla": _right(inp), "flashinfer": _right(inp)}
    captured_writes_nothing = lambda fn: (lambda: None) if fn is project.call else fn  # noqa: E731
    row = peers.measure_row(shape, inp, makers, CEILINGS, capture=captured_writes_nothing, time_fn=time_fn,
                            flush=lambda: None, repetitions=1, replays=1)
    assert row.ratios == [] and set(row.rounds_us) == {"flashmla", "flashinfer"}
    assert "after its replays" in row.errors["project"] and row.rel_err["project"] == float("inf")


def _row(name, klass, ratios, project_err=1e-3):
    row = peers.PeerRow(name=name, klass=klass, batch_size=1, num_draft=1, num_heads=16, context_lens=[16384],
                        roofline_us=5.0, ratios=list(ratios), rel_err={"project": project_err})
    if ratios:
        row.best_peer = "flashmla"
        row.rounds_us = {"project": [10.0] * len(ratios), "flashmla": [10.0 * r for r in ratios]}
    return row


def test_class_metrics_are_the_samples_of_the_worst_row_of_the_class():
    rows = [_row("h16_t1_16k", "memory", [0.45, 0.46, 0.44]), _row("h16_t1_64k", "memory", [0.58, 0.57, 0.59]),
            _row("h128_t8_64k", "compute", [1.14, 1.15, 1.13], project_err=4e-3),
            _row("b8_h16_t8", "ragged", [])]
    metrics = peers.summarize_peers(rows)
    assert metrics["min_peer_ratio_memory"] == [0.45, 0.46, 0.44]
    assert metrics["min_peer_ratio_compute"] == [1.14, 1.15, 1.13]
    assert "min_peer_ratio_ragged" not in metrics and "min_peer_ratio_mid" not in metrics  # never 0.0
    assert metrics["peer_ratio_h16_t1_64k"] == [0.58, 0.57, 0.59] and "peer_ratio_b8_h16_t8" not in metrics
    assert metrics["peer_rows"] == 3 and metrics["max_rel_err_peer_rows"] == 4e-3
    table = peers.peers_table(rows, {"flash_mla": "1.0.0", "flashinfer": "0.7.2.post1"})
    assert all(f"| {r.name} |" in table for r in rows)
    assert "| 0.450 [0.440, 0.460] |" in table and "sgl-flash-mla 1.0.0" in table


def test_the_benchmark_imports_the_peers_only_when_asked(tmp_path):
    """Planted ``flash_mla``/``flashinfer`` that record their import: importing the gate touches
    neither; ``load_peers`` imports both, sets FlashInfer's defaults, and names a missing one."""
    site = tmp_path / "site"
    (site / "flashinfer").mkdir(parents=True)
    (site / "flash_mla.py").write_text("import os\n__version__ = '1.0.0'\nos.environ['IMPORTED_FLASH_MLA'] = '1'\n")
    (site / "flashinfer" / "__init__.py").write_text("__version__ = '0.7.2.post1'\n")
    (site / "flashinfer" / "mla.py").write_text("")
    script = textwrap.dedent("""
        import os, sys
        import phases.kernel.benchmark
        from phases.kernel.bench import peers
        assert "flash_mla" not in sys.modules and "flashinfer" not in sys.modules
        loaded = peers.load_peers(__import__("torch").device("cpu"))
        assert os.environ["IMPORTED_FLASH_MLA"] == "1" and os.environ["FLASHINFER_CUDA_ARCH_LIST"] == "9.0a"
        assert loaded.versions == {"flash_mla": "1.0.0", "flashinfer": "0.7.2.post1"}
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER")}
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                         env={**env, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(site)])})
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]
    (site / "flash_mla.py").unlink()
    missing = subprocess.run([sys.executable, "-c", "from phases.kernel.bench import peers; peers.load_peers(None)"],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                             env={**env, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(site)])})
    assert missing.returncode != 0 and "got no module flash_mla" in missing.stderr
    assert "flashinfer" not in missing.stderr.splitlines()[-1]
