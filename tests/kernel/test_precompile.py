"""kernel.warmup: the probes cover every tile configuration and combine shape a plan can dispatch,
run through the public wrapper (CPU interpreter: the Triton path; an H200: both paths, compiled)."""

from __future__ import annotations

import pytest
import torch

from kernel import hopper, warmup
from kernel.mla_verify import interpreting
from kernel.plan import HeadDims, default_tile_config

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def test_warmup_runs_the_triton_path_in_both_modes():
    """On the CPU interpreter: one tile configuration, tree and causal, eager and graph mode, each
    with a multi-split plan (so the combine runs too)."""
    if torch.cuda.is_available():
        pytest.skip("checks the interpreter's Triton-only probes")
    report = warmup("cpu", num_heads=2, max_draft=3)
    assert [(p.path, p.mask, p.mode) for p in report.probes] == [
        ("triton", "tree", "eager"), ("triton", "causal", "eager"), ("triton", "tree", "graph"), ("triton", "causal", "graph"),
    ]
    config = default_tile_config(6, HeadDims.of(576, 512), 4, interpreting()).describe()
    assert {p.config for p in report.probes} == {config}
    assert all(p.combine == ((32, 128),) for p in report.probes)  # every probe plan has several splits
    assert report.seconds > 0 and report.new_kernels == 0  # nothing compiles in the interpreter
    assert "4 probes" in report.summary()


def test_warmup_modes_and_argument_checks():
    if torch.cuda.is_available():
        pytest.skip("CPU-interpreter variant of the mode selection")
    eager = warmup("cpu", num_heads=1, max_draft=1, head_dim=64, v_head_dim=32, use_cuda_graph=False)
    graph = warmup("cpu", num_heads=1, max_draft=1, head_dim=64, v_head_dim=32, use_cuda_graph=True, max_batch=4)
    assert {p.mode for p in eager.probes} == {"eager"} and {p.mode for p in graph.probes} == {"graph"}
    with pytest.raises(ValueError, match="max_draft"):
        warmup("cpu", num_heads=16, max_draft=65)
    with pytest.raises(ValueError, match="kv_index_dtype"):
        warmup("cpu", num_heads=16, max_draft=1, kv_index_dtype=torch.int16)
    with pytest.raises(ValueError, match="workers"):
        warmup("cpu", num_heads=16, max_draft=1, workers=0)


def test_warmup_on_a_cpu_runs_its_probes_in_one_thread(monkeypatch):
    """The interpreter is not thread-safe: ``workers`` is ignored on a CPU device, and the probes
    come back in the order they were listed."""
    if torch.cuda.is_available():
        pytest.skip("CPU-interpreter variant")
    import threading

    from kernel import precompile

    seen = []
    real = precompile.run_probe

    def probe(*args, **kwargs):
        seen.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(precompile, "run_probe", probe)
    report = warmup("cpu", num_heads=1, max_draft=1, head_dim=64, v_head_dim=32, workers=4)
    assert seen == [threading.current_thread().name] * 4
    assert [(p.mask, p.mode) for p in report.probes] == [("tree", "eager"), ("causal", "eager"), ("tree", "graph"),
                                                         ("causal", "graph")]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_SM90, reason="needs an sm_90 (Hopper) GPU with Gluon")
@pytest.mark.parametrize("num_heads,max_draft", [(16, 1), (16, 8), (128, 8)])
def test_warmup_covers_every_hopper_variant_and_is_cheap_the_second_time(num_heads, max_draft):
    report = warmup("cuda", num_heads, max_draft)
    variants = {hopper.tile_config(132, hopper.choose_variant(t * num_heads)).describe() for t in range(1, max_draft + 1)}
    eager = [p for p in report.probes if p.mode == "eager"]
    assert {p.config for p in eager} == variants and all(p.path == "hopper" for p in report.probes)
    assert all(set(p.combine) == set(hopper.COMBINE_SHAPES) for p in eager)
    graph_shape = hopper.COMBINE_WIDE if max_draft * num_heads <= hopper.GRAPH_WIDE_MAX_ROWS else hopper.COMBINE_NARROW
    assert {p.combine for p in report.probes if p.mode == "graph"} == {(graph_shape,)}
    again = warmup("cuda", num_heads, max_draft)
    assert again.new_kernels == 0, again.summary()
    assert again.seconds < max(1.0, report.seconds)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_SM90, reason="needs an sm_90 (Hopper) GPU with Gluon")
def test_warmup_in_threads_runs_the_same_probes_as_one_thread():
    """The threads change when each probe compiles, not what it runs: the same probes, in the same
    order, with the same combine shapes, each output checked finite."""
    serial = warmup("cuda", 16, 8, workers=1)
    threaded = warmup("cuda", 16, 8, workers=4)
    assert threaded.probes == serial.probes
    assert threaded.new_kernels == 0, threaded.summary()
