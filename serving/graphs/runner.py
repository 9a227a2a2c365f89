"""CUDA-graph capture and replay of the engine's steps (SGLang's ``CudaGraphRunner``).

Per key (a step family at a bucket batch size, ``serving.graphs.buckets``): a pinned host
buffer and a device buffer in the bucket's fixed layout, an attention wrapper with its own
workspace (``init_forward_metadata_capture_cuda_graph``), and one graph of
``ModelRunner.forward_step`` captured over them. A replay packs the real step into the same
buffers (padding the rest), re-plans the attention into the same workspace, replays, and reads
the packed results back: one copy in, one plan upload, one replay, one copy out.

Decisions:
- ``CudaGraphs`` is the factory a ``ModelRunner`` is built with: the runner that captured the
  graphs owns them.
- Everything is captured before the first request (``capture``): the first step's kernels
  are compiled during capture's warm-up, so a user's first request runs as fast as the second.
  ``CaptureReport`` says how long it took and how much memory each bucket holds.
- All graphs share one memory pool and one ``kv_indices`` buffer (one graph runs at a time),
  captured largest first so smaller graphs reuse the pool's blocks.
- Capture runs on the padding row and slot 0: nothing live is read or written.
- No cycle collection during a capture (``serving.graphs.capture``): a dead engine's graph freed
  by the collector mid-capture invalidates the capture.
- Without CUDA (``capture_graphs=False``, the CPU tests) every piece but the capture runs:
  static buffers, bucket choice, padding and re-planning, with ``forward_step`` run eagerly
  over the static buffers where a replay would be.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import torch

from serving.device.capture_guard import collected_before_capture
from serving.engine.model_runner import ModelRunner, StepResult, unpack_outputs
from serving.graphs.buckets import (
    DEFAULT_BATCH_SIZES,
    GraphKey,
    families_for,
    key_for,
    keys_for,
    placeholder_step,
)
from serving.kv.batch import ForwardBatch, PackedStep, StepBatch, StepLayout, StepShape
from serving.speculation.drafters import Drafter


@dataclass
class Captured:
    """One captured graph and the static buffers it reads and writes."""

    graph: torch.cuda.CUDAGraph | None
    layout: StepLayout
    packed: PackedStep
    device_buffer: torch.Tensor
    batch: ForwardBatch
    outputs: tuple[torch.Tensor, torch.Tensor]
    copied: "torch.cuda.Event | None" = None  # the last copy of ``packed.host`` to the device


@dataclass
class CaptureReport:
    """What capture cost: seconds in all and per key, and device bytes per key (the memory pool's
    growth while capturing it plus its static buffers and attention workspace)."""

    seconds: float = 0.0
    per_key: dict[str, dict] = field(default_factory=dict)
    kernel_warmup_s: float = 0.0
    kernel_warmup_error: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(v["bytes"] for v in self.per_key.values())

    def table(self) -> str:
        lines = ["| graph | capture s | memory MiB |", "|---|---|---|"]
        lines += [f"| {k} | {v['seconds']:.2f} | {v['bytes'] / 2**20:.1f} |" for k, v in self.per_key.items()]
        return "\n".join(lines)


class CudaGraphRunner:
    """Captured steps for one ``ModelRunner``; ``try_start(step)`` serves what a bucket holds."""

    def __init__(self, runner: ModelRunner, keys: list[GraphKey], capture_graphs: bool = True) -> None:
        if capture_graphs and runner.device.type != "cuda":
            raise ValueError(f"Expected a CUDA device for CUDA graphs, got {runner.device}")
        if not runner.backend.supports_cuda_graph:
            raise ValueError(f"Expected an attention backend that can be captured, got {runner.backend.name!r}")
        self.runner = runner
        self.keys = keys
        self.graphs: dict[GraphKey, Captured] = {}
        pool = runner.pool
        self._sizes = (pool.num_slots, pool.table.max_context)
        kv = max(k.layout(*self._sizes).kv for k in keys)
        self.kv_indices = torch.zeros(kv, dtype=torch.int32, device=runner.device)
        self._pool = None
        self.capture_graphs = capture_graphs
        self.replays = 0
        self.eager_steps = 0
        self.last_key: GraphKey | None = None
        self.report = CaptureReport()  # set by capture()
        self._layouts: list[tuple[GraphKey, StepLayout]] = []

    def capture(self) -> CaptureReport:
        """Capture every key (largest first); returns the cost."""
        report = CaptureReport()
        start = time.perf_counter()
        backend = self.runner.backend
        backend.init_cuda_graph_state(max(k.batch for k in self.keys), max(k.batch * k.family.shape.width for k in self.keys))
        cuda = self.runner.device.type == "cuda"
        if cuda:
            torch.cuda.empty_cache()  # so the reserved memory grows by what capture takes, nothing else
        self._pool = torch.cuda.graph_pool_handle() if self.capture_graphs else None
        with collected_before_capture():  # one collection for every key's capture
            self._capture_all(report, backend, cuda)
        report.seconds = time.perf_counter() - start
        self._layouts = [(k, self.graphs[k].layout) for k in self.graphs]
        self.report = report
        return report

    def _capture_all(self, report: CaptureReport, backend, cuda: bool) -> None:
        for key in self.keys:
            t0 = time.perf_counter()
            before = torch.cuda.memory_reserved(self.runner.device) if cuda else 0
            self.graphs[key] = self._capture(key)
            if cuda:
                torch.cuda.synchronize(self.runner.device)
            report.per_key[key.describe()] = {
                "seconds": time.perf_counter() - t0,
                "bytes": max(0, torch.cuda.memory_reserved(self.runner.device) - before) if cuda else 0,
                "workspace_bytes": backend.graph_workspace_bytes().get(key, 0),
                "static_bytes": self.graphs[key].device_buffer.numel() * 8,
            }

    def _capture(self, key: GraphKey) -> Captured:
        layout = key.layout(*self._sizes)
        packed = PackedStep.allocate(layout, pin=self.runner.device.type == "cuda")
        device_buffer = torch.zeros_like(packed.host, device=self.runner.device)
        step = placeholder_step(key)
        batch = self.runner.prepare(step, packed, device_buffer, self.kv_indices)
        self.runner.backend.init_forward_metadata_capture_cuda_graph(key, key.batch, key.family.shape.width, batch,
                                                                     uniform=key.family.draft)
        shape = key.family.shape
        if not self.capture_graphs:
            return Captured(None, layout, packed, device_buffer, batch, self.runner.forward_step(batch, shape))
        side = torch.cuda.Stream(self.runner.device)
        side.wait_stream(torch.cuda.current_stream(self.runner.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # compile and settle every kernel the step launches
                self.runner.forward_step(batch, shape)
        torch.cuda.current_stream(self.runner.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):  # inside capture()'s collected_before_capture
            outputs = self.runner.forward_step(batch, shape)
        return Captured(graph, layout, packed, device_buffer, batch, outputs)

    def key_for(self, step: StepBatch) -> GraphKey | None:
        """The smallest captured bucket that holds ``step``."""
        if max(max(e.positions) for e in step.entries) >= self.runner.model.rope.size:
            return None  # past the rope tables the graphs read (a growth would move them)
        return key_for(step, self._layouts)

    def replay_into(self, step: StepBatch, key: GraphKey, adjust=None) -> Captured:
        """Host side and replay of ``step`` on ``key``'s graph, without reading the results (no
        host sync: the replay gate checks this under ``torch.cuda.set_sync_debug_mode``).
        ``adjust(batch)``: device work on the static fields between their copy and the replay."""
        cap = self.graphs[key]
        if cap.copied is not None and not cap.copied.query():
            # A step launched ahead of a read may leave its copy queued: refill the host buffer after it.
            cap.copied.synchronize()
        batch = self.runner.prepare(step, cap.packed, cap.device_buffer, self.kv_indices)
        if cap.graph is not None:
            cap.copied = torch.cuda.Event()
            cap.copied.record(torch.cuda.current_stream(self.runner.device))
        if adjust is not None:
            adjust(batch)
            if cap.graph is None and self.runner.device.type != "cuda":  # CPU: prepare() built them from the host's values
                self.runner.build_kv_indices_from_fields(batch)
        self.runner.backend.init_forward_metadata_replay_cuda_graph(key, batch)
        if cap.graph is None:
            cap.outputs = self.runner.forward_step(cap.batch, key.family.shape)
        else:
            cap.graph.replay()
        self.replays += 1
        return cap

    def read(self, step: StepBatch, key: GraphKey) -> StepResult:
        cap = self.graphs[key]
        ints, gap = cap.outputs
        return unpack_outputs(ints.cpu(), gap.cpu(), step, key.family.shape, cap.layout.tokens, cap.layout.batch)

    def try_start(self, step: StepBatch) -> tuple[torch.Tensor, torch.Tensor, StepShape, int, int] | None:
        """Replay ``step`` on its bucket's graph without reading it: (``pack_outputs``' tensors, the
        bucket's shape, rows and entries); None when no captured bucket holds it."""
        key = self.key_for(step)
        if key is None:
            self.eager_steps += 1
            return None
        cap = self.replay_into(step, key)
        self.last_key = key
        ints, gap = cap.outputs
        return ints, gap, key.family.shape, cap.layout.tokens, cap.layout.batch

    def try_launch(self, step: StepBatch, adjust=None, planned_on_device: bool = False) -> torch.Tensor | None:
        """Replay ``step`` on its bucket's graph without reading it: int64 [rows] on the device, each
        row's token (the graph's static output: valid until the bucket replays again); None when no
        captured bucket holds it, or with ``planned_on_device`` when its bucket plans on the host
        (nothing launched). ``adjust``: as ``replay_into``'s."""
        key = self.key_for(step)
        if key is None or (planned_on_device and not self.runner.backend.plans_on_device(key)):
            self.eager_steps += key is None and not planned_on_device  # a step the caller will run eagerly
            return None
        cap = self.replay_into(step, key, adjust)
        self.last_key = key
        return cap.outputs[0][: cap.layout.tokens]

    def plans_on_device(self, step: StepBatch) -> bool:
        """Whether the bucket that holds ``step`` plans its attention inside its graph (nothing of
        the step's lengths is read on the host); False when none holds it."""
        key = self.key_for(step)
        return key is not None and self.runner.backend.plans_on_device(key)

    def attention_graph(self, key: GraphKey, layers: int) -> torch.cuda.CUDAGraph:
        """A graph of only the attention calls of ``key``'s step (random queries, the plan and
        ``kv_indices`` of its last replay): timing it gives attention's share of a step."""
        cap, backend = self.graphs[key], self.runner.backend
        q = torch.randn(cap.layout.tokens, backend.num_heads, self.runner.pool.kv.shape[-1], device=self.runner.device,
                        dtype=self.runner.model.dtype)
        for i in range(layers):  # warm up outside the capture
            backend.forward_absorbed(q, i, cap.batch)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            for i in range(layers):
                backend.forward_absorbed(q, i, cap.batch)
        return graph


@dataclass(frozen=True)
class CudaGraphs:
    """The replay factory a ``ModelRunner`` is built with (``ModelRunner(..., replay=CudaGraphs(...))``):
    called once by the runner, it captures every step the runner can be asked for (the
    drafter's included) at ``batch_sizes`` and returns the ``CudaGraphRunner`` the runner keeps.
    ``capture=False``: static buffers and re-planning without capture (CPU). ``sample``: the
    target's sampled steps too (an engine that serves sampled requests)."""

    drafter: Drafter | None = None
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    capture: bool = True
    sample: bool = False

    def __call__(self, runner: ModelRunner) -> CudaGraphRunner:
        families = families_for(self.drafter, runner.model.num_layers, self.sample)
        graphs = CudaGraphRunner(runner, keys_for(families, self.batch_sizes), self.capture)
        warmup_s, warmup_error = 0.0, None
        if self.capture:
            # The backend compiles what the steps can launch first (in parallel, kernel.warmup); the
            # captures then find it compiled.
            warmup_s, warmup_error = runner.backend.warmup(max(f.shape.width for f in families))
            if warmup_error is not None:
                warnings.warn(f"kernel warm-up failed: {warmup_error}", stacklevel=2)
        report = graphs.capture()
        report.kernel_warmup_s, report.kernel_warmup_error = warmup_s, warmup_error
        report.seconds += warmup_s
        graphs.report = report
        return graphs
