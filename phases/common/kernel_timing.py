"""The timing harness: ``do_bench`` medians, CUDA-graph replay and CUDA-event timing after an
explicit L2 flush, plus the planned serving-engine call the benchmark times.

Each method moves short-row answers by a few microseconds (``do_bench`` zeroes a 256 MB
buffer between repetitions, so the kernel's first reads write back dirty L2 lines); compare
kernels only under one method, and say which.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernel import MLAVerifyWrapper

FLUSH_BYTES = 256 << 20  # > the H200's 50 MB L2


def bench_us(fn: Callable[[], object], *, warmup_ms: int = 25, rep_ms: int = 200) -> float:
    """Median microseconds of ``fn`` under ``triton.testing.do_bench`` (L2 zeroed between reps)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e3


def graph_replay(fn: Callable[[], object]) -> Callable[[], None]:
    """Capture ``fn`` (device work only, no host syncs) in a CUDA graph; return its replay.

    Warm-up runs once on a side stream first, so compiles and allocations happen outside the capture.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()

    def replay() -> None:
        graph.replay()

    # The graph reads the buffers ``fn`` closes over (a wrapper's plan and workspace): they must
    # live as long as the graph, or their memory is reused under it.
    replay.captured = fn
    return replay


def l2_flushes(device: torch.device) -> dict[str, Callable[[], object]]:
    """``zero`` (writes: dirty lines, as ``do_bench``) and ``read`` (a read-only sweep) L2 flushes."""
    scratch = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    sink = torch.empty((), dtype=torch.int64, device=device)
    return {"zero": lambda: scratch.zero_(), "read": lambda: torch.sum(scratch, dim=0, out=sink)}


def event_us(fn: Callable[[], object], flush: Callable[[], object], reps: int = 50, warmup: int = 5) -> float:
    """Median microseconds of ``fn`` between CUDA events, with ``flush`` run before each rep."""
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for _ in range(warmup):
        fn()
    for i in range(reps):
        flush()
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) for s, e in zip(start, end))[reps // 2] * 1e3


def planned_run(inputs: dict, out: torch.Tensor, *, graph: bool = True) -> Callable[[], object]:
    """The serving-engine call: ``MLAVerifyWrapper.plan`` once here, then ``run(out=)`` per call.

    ``inputs``: the keyword arguments of ``mla_verify_attention`` (``phases.kernel.bench.cases.build_inputs``).
    With ``graph`` (and a CUDA ``q``) the call is captured in a CUDA graph and the replay is
    returned, as an engine running under graph capture pays it; otherwise the eager ``run``
    (with a ``wrapper`` attribute: the ``MLAVerifyWrapper``, whose ``path`` names the
    kernel path, "hopper" or "triton", that the default dispatch chose).
    """
    q = inputs["q"]
    wrapper = MLAVerifyWrapper(q.device)
    wrapper.plan(
        inputs["qo_indptr"], inputs["kv_indptr"], num_heads=q.shape[1], head_dim=q.shape[2],
        v_head_dim=inputs["v_head_dim"], dtype=q.dtype,
    )
    args = (q, inputs["kv_cache"], inputs["kv_indices"], inputs["tree_mask"], inputs["sm_scale"])
    run = lambda: wrapper.run(*args, out=out)  # noqa: E731
    run.wrapper = wrapper  # its ``path`` says which kernel path the call used
    return graph_replay(run) if graph and q.is_cuda else run
