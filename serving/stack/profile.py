"""Where a decode step's time goes, next to the step's streaming limit measured in the same run.

``python -m serving profile`` (``serving.stack.cli``) and the ``end-to-end`` gate of phase
``cudagraph`` measure with this module. For requests of a given context, on the engine as it
serves (kernel backend, decode steps replayed from CUDA graphs):

- step time: engine steps timed by CUDA events (host preparation, replay and the result read,
  as a user gets them; median), and the captured graph replayed alone (median);
- the streaming limit: the bytes a step must read (``step_bytes``: every weight matrix once and
  every layer's latent rows of every request's context) over the device-to-device copy
  bandwidth measured in the same run (``copy_bandwidth``, a copy well past L2);
- a torch.profiler trace of a few replayed steps: kernels per step by class (``classify``), GPU
  µs per class, bytes/s per class where the bytes are known (weights for GEMM, latent rows for
  attention) and the GPU-busy share of the step (``summarize``).

Decisions:
- Kernels are classed by name alone (``KERNEL_CLASSES``, first match wins), a table of
  lower-case substrings: a new kernel is one pattern, and the classifier is a pure function that
  tests check on real names. The split merge is matched before attention (its kernel's name
  carries the attention kernel's prefix), attention before GEMM (cuDNN's flash kernels carry
  ``xmma``-like tags), copies before elementwise (PyTorch runs ``.to()`` and ``copy_`` as
  elementwise kernels named after ``direct_copy``).
- Bytes come from the config in closed form (``weight_bytes``, ``kv_bytes``), not from the
  tensors a model holds: the limit is what the architecture must read, whatever the engine
  keeps; the tests check the closed form against a count over the model's tensors.
  Counted: every projection (``kv_b_proj`` as the absorbed W_UK / W_UV, same bytes), norm,
  router and head of the target's layers. Not counted: the embeddings (a step gathers B rows),
  the MTP module (plain decoding does not run it), activations, indices and the plan.
- Routed experts count as the experts a batch must read: the expected number of distinct
  experts that B tokens choosing top-k of E uniformly touch, E (1 - (1 - k/E)^B), per rank's
  share; exactly k at B=1. (The engine's captured step reads every expert: for a MoE model the
  fraction shows that cost.)
- Block-FP8 projections (kept FP8 on CUDA) count one byte per element plus float32 scales per
  128x128 block, ``kv_b_proj`` in the model dtype (dequantized at load).
- Under tensor parallelism the bytes are one rank's (its heads, its share of every MLP, its
  experts, its vocab rows of the head) over that rank's copy bandwidth: the ranks read in
  parallel; the all-reduces are not part of the limit.
- Step time is the engine's (``Engine.step`` between two CUDA events), as tokens/s is; the
  graph replayed alone says how much of it is host work.
- On a CPU (no CUDA kernels) the trace's top-level operators stand in for kernels, so the path
  runs in tests; its numbers say nothing about a GPU.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from serving.configs.model import ModelConfig
from serving.engine.engine import Engine, Request
from serving.quant.fp8 import BlockFP8Weight

COPY_BYTES = 1 << 30  # per buffer: far past the L2 (50 MB on an H200), so the copy streams HBM
COPY_REPEATS = 10

# (class, lower-case substrings of kernel names); the first class with a matching pattern wins.
KERNEL_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("split merge", ("combine", "mergestate", "merge_state", "merge_attn")),
    ("attention", ("mla_verify", "flash", "fmha", "sdpa", "attention", "attn")),
    ("GEMM", ("gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas", "splitkreduce", "w8_stream",
              "aten::linear", "aten::matmul", "aten::mm", "aten::bmm", "aten::addmm")),
    ("collective", ("nccl",)),
    ("copy", ("memcpy", "memset", "copy", "move_rows", "aten::cat")),
    ("norm/rope/act/add", ("norm", "rope", "rotary", "silu", "elementwise", "aten::add", "aten::mul", "aten::rsqrt")),
)
OTHER = "other"
CLASSES = tuple(name for name, _ in KERNEL_CLASSES) + (OTHER,)


def classify(name: str) -> str:
    """The class of a kernel (one of ``CLASSES``) from its name."""
    lower = name.lower()
    for cls, patterns in KERNEL_CLASSES:
        if any(p in lower for p in patterns):
            return cls
    return OTHER


# ---- bytes a step must read ---------------------------------------------------------------


def _matrix_bytes(rows: int, cols: int, elem: int, fp8_block: int | None) -> int:
    """A [rows, cols] projection: FP8 elements plus float32 block scales, else ``elem`` bytes each."""
    if fp8_block is None:
        return rows * cols * elem
    return rows * cols + 4 * math.ceil(rows / fp8_block) * math.ceil(cols / fp8_block)


def expected_experts(experts: int, topk: int, batch: int) -> float:
    """Distinct experts that ``batch`` tokens, each choosing ``topk`` of ``experts`` uniformly, touch
    on average: ``experts * (1 - (1 - topk / experts) ** batch)`` (``topk`` at one token)."""
    if experts <= 0 or topk <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - min(topk, experts) / experts) ** batch)


def weight_bytes(cfg: ModelConfig, dtype: torch.dtype, *, batch: int = 1, tp_size: int = 1, fp8: bool = False) -> int:
    """Bytes of the weights one decode step of ``batch`` tokens reads, on one of ``tp_size`` ranks
    (see the module's decisions for what counts).

    fp8: the config's block-FP8 projections are held as FP8 (the engine does on CUDA).
    """
    if batch < 1 or tp_size < 1:
        raise ValueError(f"Expected batch >= 1 and tp_size >= 1, got batch {batch} and tp_size {tp_size}")
    e = torch.empty(0, dtype=dtype).element_size()
    block = cfg.quantization.block if fp8 and cfg.quantization is not None else None
    h, heads = cfg.hidden_size, cfg.num_attention_heads // tp_size
    r, rope, nope, v = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim

    def proj(rows: int, cols: int) -> int:
        return _matrix_bytes(rows, cols, e, block)

    attn = 2 * h * e  # input and post-attention norms
    if cfg.q_lora_rank is None:
        attn += proj(heads * (nope + rope), h)
    else:
        q = cfg.q_lora_rank
        attn += proj(q, h) + q * e + proj(heads * (nope + rope), q)
        attn += q * e if cfg.attention_bias else 0
    attn += proj(r + rope, h) + r * e  # kv_a_proj_with_mqa and kv_a_layernorm
    attn += heads * (nope + v) * r * e  # W_UK and W_UV: kv_b_proj, dense in the model dtype
    attn += proj(h, heads * v)  # o_proj
    attn += (r + rope + h) * e if cfg.attention_bias else 0
    dense_mlp = 3 * proj(cfg.intermediate_size // tp_size, h)
    moe = 0
    if cfg.n_routed_experts:
        experts, inter = cfg.n_routed_experts, cfg.moe_intermediate_size
        # this rank's share of the distinct experts the batch's tokens choose among all of them
        touched = expected_experts(experts, cfg.num_experts_per_tok, batch) / tp_size
        moe = 4 * (experts * h + experts)  # the router and its bias, float32 (every rank holds it whole)
        moe += round(touched * 3 * proj(inter, h))
        if cfg.n_shared_experts:
            moe += 3 * proj(inter * cfg.n_shared_experts // tp_size, h)
    layers = cfg.num_hidden_layers
    moe_layers = max(0, layers - cfg.first_k_dense_replace) if cfg.n_routed_experts else 0
    vocab_rows = -(-cfg.vocab_size // tp_size)
    head = h * e + vocab_rows * h * e  # final norm and this rank's rows of the (dense) head
    return layers * attn + (layers - moe_layers) * dense_mlp + moe_layers * moe + head


def kv_bytes(cfg: ModelConfig, keys: Iterable[int], pool_dtype: torch.dtype) -> int:
    """Bytes of the latent rows a step's attention reads: ``keys`` [B] rows per request, every
    target layer, ``latent_dim`` values each."""
    e = torch.empty(0, dtype=pool_dtype).element_size()
    return sum(int(k) for k in keys) * cfg.num_hidden_layers * cfg.latent_dim * e


@dataclass(frozen=True)
class StepBytes:
    """What a step must read: ``weights`` and ``kv`` (latent rows) bytes."""

    weights: int
    kv: int

    @property
    def total(self) -> int:
        return self.weights + self.kv

    def limit_s(self, copy_bytes_per_s: float) -> float:
        """The streaming limit: seconds to read ``total`` bytes at the copy bandwidth."""
        return self.total / copy_bytes_per_s


def step_bytes(cfg: ModelConfig, keys: Sequence[int], dtype: torch.dtype, pool_dtype: torch.dtype, *, tp_size: int = 1,
               fp8: bool = False) -> StepBytes:
    """``StepBytes`` of a decode step over requests attending ``keys`` [B] rows each."""
    return StepBytes(weight_bytes(cfg, dtype, batch=len(keys), tp_size=tp_size, fp8=fp8), kv_bytes(cfg, keys, pool_dtype))


def engine_step_bytes(engine: Engine, requests: Sequence[Request]) -> StepBytes:
    """``StepBytes`` of the next decode step of ``requests`` on ``engine`` (each reads its cached
    rows and its new one)."""
    model, pool = engine.model, engine.pool
    keys = [pool.table.length(r.req_id) + 1 for r in requests if not r.finished]
    fp8 = any(isinstance(w, BlockFP8Weight) for w in model.w.values())
    return step_bytes(model.cfg, keys, model.dtype, pool.dtype, tp_size=model.tp.size, fp8=fp8)


# ---- measurements ---------------------------------------------------------------------------


def copy_bandwidth(device: torch.device | str, nbytes: int = COPY_BYTES, repeats: int = COPY_REPEATS) -> float:
    """Bytes per second (read + written) of a device-to-device copy of ``nbytes``: the median of
    ``repeats`` copies after two warm-up ones (CUDA events; perf_counter on a CPU)."""
    device = torch.device(device)
    source = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    target = torch.empty_like(source)
    for _ in range(2):
        target.copy_(source)
    times = [_timed(lambda: target.copy_(source), device) for _ in range(repeats)]
    del source, target
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times)


def _timed(fn, device: torch.device) -> float:
    """Seconds ``fn()`` takes on ``device``'s stream (CUDA events), or on the host's clock."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def time_steps(engine: Engine, requests: list[Request], steps: int) -> list[float]:
    """Seconds of each of ``steps`` engine steps over ``requests``."""
    return [_timed(lambda: engine.step(requests), engine.model.device) for _ in range(steps)]


def time_replay(engine: Engine, repeats: int) -> list[float] | None:
    """Seconds of the last step's graph replayed alone ``repeats`` times (None without graphs).

    A replay re-runs the last step on the same buffers: it writes the same latent row and
    slot-table entry again, so the requests' state does not change."""
    graphs = engine.runner.graphs
    if graphs is None or getattr(graphs, "last_key", None) is None:
        return None
    cap = graphs.graphs[graphs.last_key]
    if cap.graph is not None:
        replay = cap.graph.replay
    else:  # static buffers without capture (a CPU): the same forward over them
        shape = graphs.last_key.family.shape
        replay = lambda: engine.runner.forward_step(cap.batch, shape)  # noqa: E731
    return [_timed(replay, engine.model.device) for _ in range(repeats)]


@dataclass(frozen=True)
class Kernel:
    """One kernel of a trace: its name, start and duration in µs."""

    name: str
    start_us: float
    dur_us: float


def kernels_of(events, cuda: bool) -> list[Kernel]:
    """The kernels (memcpys and memsets included) of a torch.profiler trace's ``events()``; on a CPU
    its top-level operators."""
    out = []
    for ev in events:
        if cuda:
            if ev.device_type != torch.autograd.DeviceType.CUDA:
                continue
        elif ev.device_type != torch.autograd.DeviceType.CPU or ev.cpu_parent is not None:
            continue
        out.append(Kernel(ev.name, float(ev.time_range.start), float(ev.time_range.elapsed_us())))
    return out


def trace_steps(engine: Engine, requests: list[Request], steps: int) -> list[Kernel]:
    """The kernels of ``steps`` engine steps under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    cuda = engine.model.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize(engine.model.device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step(requests)
        if cuda:
            torch.cuda.synchronize(engine.model.device)
    return kernels_of(prof.events(), cuda)


def busy_us(kernels: Iterable[Kernel]) -> float:
    """µs during which at least one kernel ran (the union of their intervals)."""
    total, end = 0.0, -math.inf
    for k in sorted(kernels, key=lambda k: k.start_us):
        stop = k.start_us + k.dur_us
        if k.start_us >= end:
            total += k.dur_us
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


@dataclass
class ClassTotals:
    """One kernel class over a trace, per step: kernels, GPU µs, and the bytes it must read (None:
    not known)."""

    kernels: float = 0.0
    gpu_us: float = 0.0
    bytes: int | None = None

    @property
    def GBps(self) -> float | None:
        return self.bytes / (self.gpu_us * 1e-6) / 1e9 if self.bytes is not None and self.gpu_us > 0 else None


@dataclass
class TraceSummary:
    """Per step: kernels, GPU-busy µs, each class's totals, the kernels that took the longest."""

    steps: int
    kernels: float
    busy_us: float
    classes: dict[str, ClassTotals] = field(default_factory=dict)
    top: list[tuple[str, str, float, float]] = field(default_factory=list)  # (name, class, calls, µs) per step


def summarize(kernels: Sequence[Kernel], steps: int, known_bytes: dict[str, int] | None = None, top: int = 12) -> TraceSummary:
    """Per-step totals of ``kernels`` traced over ``steps`` steps; ``known_bytes``: class -> the
    bytes a step's kernels of that class must read (GEMM: weights, attention: latent rows)."""
    if steps < 1:
        raise ValueError(f"Expected steps >= 1, got {steps}")
    classes = {c: ClassTotals(bytes=(known_bytes or {}).get(c)) for c in CLASSES}
    by_name: dict[str, list[float]] = {}
    for k in kernels:
        totals = classes[classify(k.name)]
        totals.kernels += 1 / steps
        totals.gpu_us += k.dur_us / steps
        calls = by_name.setdefault(k.name, [0.0, 0.0])
        calls[0] += 1 / steps
        calls[1] += k.dur_us / steps
    longest = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return TraceSummary(steps, len(kernels) / steps, busy_us(kernels) / steps, classes,
                        [(name, classify(name), calls, us) for name, (calls, us) in longest])


# ---- requests over a long context -------------------------------------------------------------


def start_requests(engine: Engine, batch: int, context: int, gen: torch.Generator,
                   prefill: bool = False) -> tuple[list[Request], float | None]:
    """``batch`` requests of a random ``context``-token prompt, each with ``context`` cached rows and
    one emitted token, ready to decode; returns them and the first one's time to first token
    (its prefill's seconds; None when not prefilled).

    prefill: the first request's prompt is prefilled and the others start from copies of its rows
    (``Engine.fork_prefix``, then the last prompt token's prefill); else the rows are whatever the
    pool holds (random, see ``randomize_pool``) and each request emits its prompt's last token.
    """
    if batch < 1 or context < 1:
        raise ValueError(f"Expected batch >= 1 and context >= 1, got batch {batch} and context {context}")
    pool, vocab = engine.pool, engine.model.cfg.vocab_size
    prompt = torch.randint(0, vocab, (context,), generator=gen).tolist()
    reqs, ttft = [], None
    for b in range(batch):
        req = engine.add_request(prompt, 10**9)
        if not prefill:
            pool.table.add(req.req_id)
            pool.table.append(req.req_id, pool.alloc(context))
            req.output.append(prompt[-1])
        else:
            if b:
                engine.fork_prefix(req, pool.table.slots(reqs[0].req_id)[: context - 1])
            t0 = time.perf_counter()
            engine.prefill(req)  # ends in a host sync: its first token is on the host
            if b == 0:
                ttft = time.perf_counter() - t0
            if req.error:
                raise RuntimeError(f"prefill of a {context}-token prompt failed: {req.error}")
        reqs.append(req)
    return reqs, ttft


def randomize_pool(engine: Engine, seed: int = 0) -> None:
    """Random latent rows in every slot: decode cost does not depend on their values."""
    gen = torch.Generator(device=engine.pool.kv.device).manual_seed(seed)
    engine.pool.kv.normal_(generator=gen)


def release(engine: Engine, requests: Iterable[Request]) -> None:
    for r in requests:
        if r.req_id in engine.pool.table:
            engine.pool.release_request(r.req_id)


# ---- one profiled decode row ----------------------------------------------------------------


def profile_decode(engine: Engine, requests: list[Request], copy_bytes_per_s: float, *, warmup: int = 3, steps: int = 10,
                   rounds: int = 1, trace: int = 5, replays: int = 10) -> dict:
    """Warm-up steps, then ``rounds`` rounds of ``steps`` timed engine steps, ``replays`` graph
    replays and a trace of ``trace`` steps over ``requests``; returns the row (``decode_row``)."""
    for _ in range(warmup):
        engine.step(requests)
    cached = [engine.pool.table.length(r.req_id) for r in requests]
    need = engine_step_bytes(engine, requests)
    times = [time_steps(engine, requests, steps) for _ in range(rounds)]
    replay = time_replay(engine, replays)
    kernels = trace_steps(engine, requests, trace)
    return decode_row(cached, need, times, replay, kernels, trace, copy_bytes_per_s, graphs=engine.runner.graphs is not None,
                      tp_size=engine.model.tp.size)


def decode_row(cached: Sequence[int], need: StepBytes, rounds: Sequence[Sequence[float]], replay: Sequence[float] | None,
               kernels: Sequence[Kernel], trace: int, copy_bytes_per_s: float, graphs: bool = True, tp_size: int = 1) -> dict:
    """The row of one profiled decode (``profile_decode``) from its measurements: ``cached`` [B]
    rows of each request when the timed steps began, the bytes of a step, each round's timed
    steps' seconds, the graph replays' seconds, the ``kernels`` of ``trace`` traced steps.

    ``frac_streaming_limit`` is the limit over the median step; ``frac_samples`` the same for
    each round's median (one sample per round)."""
    times = [t for r in rounds for t in r]
    step_s = statistics.median(times)
    limit_s = need.limit_s(copy_bytes_per_s)
    summary = summarize(kernels, trace, {"GEMM": need.weights, "attention": need.kv})
    batch = len(cached)
    return {
        "batch": batch,
        "context": min(cached),
        "context_max": max(cached),
        "cuda_graphs": graphs,
        "tensor_parallel": tp_size,
        "copy_GBps": copy_bytes_per_s / 1e9,
        "weight_GB": need.weights / 1e9,
        "kv_GB": need.kv / 1e9,
        "limit_ms": limit_s * 1e3,
        "step_ms": step_s * 1e3,
        "step_ms_samples": [t * 1e3 for t in times],
        "replay_ms": statistics.median(replay) * 1e3 if replay else None,
        "tokens_per_s": batch / step_s,
        "limit_tokens_per_s": batch / limit_s,
        "frac_streaming_limit": limit_s / step_s,
        "frac_samples": [limit_s / statistics.median(r) for r in rounds],
        "kernels_per_step": summary.kernels,
        "gpu_busy_ms": summary.busy_us / 1e3,
        "busy_share": summary.busy_us * 1e-6 / step_s,
        "classes": {c: {"kernels": t.kernels, "gpu_us": t.gpu_us, "bytes": t.bytes, "GBps": t.GBps}
                    for c, t in summary.classes.items()},
        "top_kernels": [{"name": n, "class": c, "calls": k, "gpu_us": us} for n, c, k, us in summary.top],
    }


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def markdown(row: dict, title: str | None = None) -> str:
    """A profiled row as Markdown: the step against its limit, then kernels per class."""
    lines = [f"### {title}", ""] if title else []
    lines += [
        "| B | context | tokens/s | step ms | replay ms | limit ms | fraction of limit | copy GB/s | weights GB | KV GB "
        "| kernels/step | GPU busy ms | busy share |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {row['batch']} | {row['context']} | {row['tokens_per_s']:.1f} | {row['step_ms']:.2f} | "
        f"{_num(row['replay_ms'], '.2f')} | {row['limit_ms']:.2f} | {row['frac_streaming_limit']:.2f} | "
        f"{row['copy_GBps']:.0f} | {row['weight_GB']:.2f} | {row['kv_GB']:.2f} | {row['kernels_per_step']:.0f} | "
        f"{row['gpu_busy_ms']:.2f} | {row['busy_share']:.2f} |",
        "",
        "| class | kernels/step | GPU µs/step | share of busy | bytes/step (GB) | GB/s |",
        "|---|---|---|---|---|---|",
    ]
    busy_us = row["gpu_busy_ms"] * 1e3
    for cls, t in row["classes"].items():
        if not t["kernels"]:
            continue
        share = t["gpu_us"] / busy_us if busy_us else 0.0
        gb = None if t["bytes"] is None else t["bytes"] / 1e9
        lines.append(f"| {cls} | {t['kernels']:.0f} | {t['gpu_us']:.0f} | {share:.2f} | {_num(gb, '.2f')} | "
                     f"{_num(t['GBps'], '.0f')} |")
    return "\n".join(lines) + "\n"


def top_kernels_markdown(row: dict) -> str:
    """The kernels that took the longest per step, as Markdown."""
    lines = ["| kernel | class | calls/step | GPU µs/step |", "|---|---|---|---|"]
    for k in row["top_kernels"]:
        name = k["name"] if len(k["name"]) <= 90 else k["name"][:87] + "..."
        lines.append(f"| `{name.replace('|', '/')}` | {k['class']} | {k['calls']:.0f} | {k['gpu_us']:.0f} |")
    return "\n".join(lines) + "\n"
