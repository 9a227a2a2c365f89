"""The kernel beside its peers, in one process, on the same bytes: FlashMLA and FlashInfer's MLA.

The benchmark gate's peer thresholds (``min_peer_ratio_<class>``) are ratios against the best
peer timed here, by one method for all three kernels:

- FlashMLA: the prebuilt ``sgl-flash-mla`` 1.0.0 wheel's dense bf16 sm90 decode kernel
  (``flash_mla_with_kvcache(..., use_legacy=True)``), 64-token pages through a block table.
- FlashInfer: ``flashinfer.mla.BatchMLAPagedAttentionWrapper``, backend ``fa3``, page_size=1,
  planned once over the same rows as the project.
- the project: ``MLAVerifyWrapper``, planned once, ``run(tree_mask=None)`` (causal, as the peers:
  neither has a tree mask), through the default dispatch (the Hopper path on sm_90).

Inputs, per row: one bf16 pool of 64-token pages (``[num_pages, 64, 576]``, N(0, 1), at least
twice the L2), each request's pages drawn from ``torch.randperm`` of the pool; FlashMLA reads them
through its block table, the project and FlashInfer through ``kv_indices = page * 64 + offset``,
so all three move the same bytes. Request ``b`` has ``T_b`` queries and ``L_b`` keys, the last
``T_b`` of which are its drafts (the gate's ``Case`` convention); query ``t`` sees keys
``j <= L_b - T_b + t``. ``sm_scale = 1/sqrt(192)``.

Method: every kernel's call is checked against the fp32 oracle (eagerly, into a NaN-poisoned
output, FlashMLA's its own new one), then captured in a CUDA graph. The outputs are poisoned
again, and ``repetitions`` rounds follow; in each, every graph is replayed ``replays`` times, the
three interleaved (the order rotating replay by replay), each replay after a 256 MB zeroing L2
flush and timed with CUDA events; a round gives each kernel its median. What the replays left is
checked against the oracle again. A kernel whose output is off (relative error above
``MAX_REL_ERR`` per request) or that raises gets no time, and is named.

Ratios: the best peer of a row is the peer whose round medians have the lower median; the row's
ratio samples are, round by round, the best peer's median over the project's (above 1: the
project is faster). ``min_peer_ratio_<class>`` is the samples of the class's row whose median
ratio is lowest, so the runner judges it on the confidence interval of that median.

Peers are imported only inside ``load_peers``: importing this module needs neither.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kernel.reference import mla_verify_reference
from phases.common.kernel_timing import graph_replay, l2_flushes, planned_run
from phases.common.roofline import (
    Ceilings,
    mla_verify_bytes,
    mla_verify_flops,
    roofline_time,
)
from phases.kernel.bench.cases import (
    PRODUCTION_SM_SCALE,
    QUERY_SCALE,
    Case,
    max_request_rel_err,
)
from phases.kernel.bench.shapes import (
    BATCH8_CONTEXTS,
    BATCH8_SHAPE,
    HEAD_DIM,
    PEER_B1_CONTEXTS,
    PEER_B1_SHAPES,
    V_HEAD_DIM,
    bound_class,
    context_label,
    decode_batch_shapes,
)

PAGE_SIZE = 64  # FlashMLA's page (its kernels require 64-token blocks)
PEER_MODULES = ("flash_mla", "flashinfer")  # the `peers` extra: sgl-flash-mla, flashinfer-python
PEERS = ("flashmla", "flashinfer")
KERNELS = ("project", *PEERS)
PEER_CLASSES = ("memory", "mid", "compute", "decode", "ragged")
DEFAULT_REPETITIONS = 10  # ratio samples per row (the 0.95 interval of a median needs 6 or more)
DEFAULT_REPLAYS = 20  # replays of each kernel per repetition
MAX_REL_ERR = 1e-2
MIN_POOL_BYTES = 100 << 20  # twice the H200's 50 MB L2
POOL_FACTOR = 1.25  # pages in the pool per page read
FLASHINFER_WORKSPACE_BYTES = 256 << 20
SEED_BASE = 7_000  # row i of the comparison is seeded SEED_BASE + i (apart from the gate's rows)


@dataclass(frozen=True)
class PeerShape:
    """One row of the comparison: the gate's row ``name`` (``h16_t1_16k``, ``b16_h128_t1_4k``,
    ``b8_h16_t8``), its class (one of ``PEER_CLASSES``) and its ``Case`` (heads, ``T_b``, ``L_b``,
    seed; its tree is ignored: every kernel runs causal)."""

    name: str
    klass: str
    case: Case


def peer_shapes(seed: int = 0) -> list[PeerShape]:
    """The 17 rows: B=1 ``PEER_B1_SHAPES`` at ``PEER_B1_CONTEXTS`` (classed by packed rows H*T),
    every batched decode row, the ragged batch."""
    rows: list[tuple[str, str, int, tuple[int, ...], tuple[int, ...]]] = []
    for context in PEER_B1_CONTEXTS:
        for heads, drafts in PEER_B1_SHAPES:
            rows.append((f"h{heads}_t{drafts}_{context_label(context)}", bound_class(heads * drafts), heads,
                         (drafts,), (context,)))
    for batch_size, heads, context in decode_batch_shapes():
        rows.append((f"b{batch_size}_h{heads}_t1_{context_label(context)}", "decode", heads, (1,) * batch_size,
                     (context,) * batch_size))
    heads, drafts = BATCH8_SHAPE
    rows.append((f"b{len(BATCH8_CONTEXTS)}_h{heads}_t{drafts}", "ragged", heads, (drafts,) * len(BATCH8_CONTEXTS),
                 tuple(BATCH8_CONTEXTS)))
    return [
        PeerShape(name, klass, Case(num_heads=heads, draft_lens=drafts, context_lens=contexts, tree=False,
                                    sm_scale=PRODUCTION_SM_SCALE, seed=seed * 1000 + SEED_BASE + index))
        for index, (name, klass, heads, drafts, contexts) in enumerate(rows)
    ]


@dataclass
class PagedInputs:
    """One row's inputs, shared by the three kernels (``B`` requests, uniform ``T``, ``N = B * T``).

    q: bf16 ``[N, H, 576]``.  pool: bf16 ``[num_pages, 64, 576]``.
    block_table: int32 ``[B, max_pages]`` (unused entries 0).  seqlens: int32 ``[B]``, ``L_b``.
    qo_indptr / kv_indptr: int32 ``[B + 1]`` on the device, ``*_host`` on the CPU.
    kv_indices: int32 ``[sum_b L_b]``, ``page * 64 + offset`` of each request's keys in order.
    """

    q: torch.Tensor
    pool: torch.Tensor
    block_table: torch.Tensor
    seqlens: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    qo_indptr_host: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    num_draft: int

    @property
    def batch_size(self) -> int:
        return self.seqlens.shape[0]

    @property
    def slots(self) -> torch.Tensor:
        """The pool as one row per token: ``[num_pages * 64, 576]`` (a view)."""
        return self.pool.view(-1, self.pool.shape[-1])

    def project_inputs(self) -> dict:
        """The keyword arguments of ``kernel.mla_verify_attention`` (causal: ``tree_mask=None``)."""
        return {"q": self.q, "kv_cache": self.slots, "qo_indptr": self.qo_indptr, "kv_indptr": self.kv_indptr,
                "kv_indices": self.kv_indices, "tree_mask": None, "sm_scale": PRODUCTION_SM_SCALE,
                "v_head_dim": V_HEAD_DIM}


def paged_inputs(case: Case, device: torch.device | str, min_pool_bytes: int = MIN_POOL_BYTES) -> PagedInputs:
    """Random inputs for ``case`` in 64-token pages (see ``PagedInputs``); pages from a CPU generator,
    data from a generator on ``device``, both seeded by ``case.seed``."""
    if len(set(case.draft_lens)) != 1:
        raise ValueError(f"Expected one T for every request (FlashMLA's q is [B, T, H, D]), got {case.draft_lens}")
    if case.head_dim != HEAD_DIM or case.v_head_dim != V_HEAD_DIM or case.dtype != "bf16":
        raise ValueError(f"Expected bf16 576/512 (the peers' only layout), got {case.dtype} "
                         f"{case.head_dim}/{case.v_head_dim}")
    device = torch.device(device)
    index_generator = torch.Generator(device="cpu").manual_seed(case.seed)
    data_generator = torch.Generator(device=device).manual_seed(case.seed)
    pages_per_request = [-(-length // PAGE_SIZE) for length in case.context_lens]
    page_bytes = PAGE_SIZE * HEAD_DIM * 2
    num_pages = max(math.ceil(POOL_FACTOR * sum(pages_per_request)), -(-min_pool_bytes // page_bytes))
    chosen = torch.randperm(num_pages, generator=index_generator)[: sum(pages_per_request)].to(torch.int32)
    block_table = torch.zeros(case.batch_size, max(pages_per_request), dtype=torch.int32)
    indices, start = [], 0
    offsets = torch.arange(PAGE_SIZE, dtype=torch.int32)
    for b, (pages, length) in enumerate(zip(pages_per_request, case.context_lens)):
        mine = chosen[start : start + pages]
        start += pages
        block_table[b, :pages] = mine
        indices.append((mine[:, None] * PAGE_SIZE + offsets[None, :]).reshape(-1)[:length])  # [L_b]
    pool = torch.randn(num_pages, PAGE_SIZE, HEAD_DIM, generator=data_generator, device=device, dtype=torch.bfloat16)
    num_tokens = sum(case.draft_lens)
    q = torch.randn(num_tokens, case.num_heads, HEAD_DIM, generator=data_generator, device=device,
                    dtype=torch.bfloat16).mul_(QUERY_SCALE)
    qo_host, kv_host = _indptr(case.draft_lens), _indptr(case.context_lens)
    return PagedInputs(
        q=q, pool=pool, block_table=block_table.to(device), seqlens=torch.tensor(case.context_lens, dtype=torch.int32,
                                                                                 device=device),
        qo_indptr=qo_host.to(device), kv_indptr=kv_host.to(device), qo_indptr_host=qo_host, kv_indptr_host=kv_host,
        kv_indices=torch.cat(indices).to(device), num_draft=case.draft_lens[0],
    )


def _indptr(lengths: Sequence[int]) -> torch.Tensor:
    """int32 ``[len + 1]`` running sums, on the CPU."""
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


# --- the peers --------------------------------------------------------------------------------


@dataclass
class Peers:
    """The imported peer modules, a FlashInfer workspace, and their versions for the report."""

    flash_mla: object
    flashinfer: object
    workspace: torch.Tensor
    versions: dict[str, str]


def missing_peers() -> list[str]:
    """The modules of ``PEER_MODULES`` this interpreter cannot find."""
    return [name for name in PEER_MODULES if importlib.util.find_spec(name) is None]


def load_peers(device: torch.device) -> Peers:
    """Import FlashMLA and FlashInfer (the ``peers`` extra, or the carried builds of
    ``phases/kernel/bench/peer_builds``); RuntimeError naming each missing module."""
    missing = missing_peers()
    if missing:
        raise RuntimeError(
            f"Expected the peer libraries (pip install 'mla-gate[peers]', or the carried builds: "
            f"phases/kernel/bench/peer_builds/README.md), got no module {', '.join(missing)}"
        )
    _flashinfer_environment()
    flash_mla = importlib.import_module("flash_mla")
    flashinfer = importlib.import_module("flashinfer")
    importlib.import_module("flashinfer.mla")
    versions = {name: getattr(module, "__version__", "?") for name, module in
                (("flash_mla", flash_mla), ("flashinfer", flashinfer))}
    workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return Peers(flash_mla, flashinfer, workspace, versions)


def _flashinfer_environment() -> None:
    """What FlashInfer reads at import, set only where the caller left it unset: a writable JIT
    workspace, sm_90a, and (on a torch without the C DLPack exchange API) tvm-ffi's fallback."""
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", os.path.join(tempfile.gettempdir(), "flashinfer-workspace"))
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    if not any(hasattr(torch.Tensor, name) for name in ("__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__")):
        os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    nvcc = shutil.which("nvcc")
    if nvcc:  # only a JIT fallback compiles; the carried build brings its MLA modules compiled
        os.environ.setdefault("CUDA_HOME", os.path.dirname(os.path.dirname(nvcc)))


@dataclass
class _Call:
    """A kernel's zero-argument call and the output it leaves (``output()``: ``[N, H, 512]``)."""

    call: Callable[[], object]
    output: Callable[[], torch.Tensor]
    note: str = ""


def project_call(inp: PagedInputs) -> _Call:
    """The project's planned call into its own ``out`` (planned here, outside any timing)."""
    out = torch.full((inp.q.shape[0], inp.q.shape[1], V_HEAD_DIM), float("nan"), dtype=inp.q.dtype, device=inp.q.device)
    run = planned_run(inp.project_inputs(), out, graph=False)
    return _Call(run, lambda: out, note=getattr(run.wrapper, "path", None) or "")


def flashmla_call(flash_mla, inp: PagedInputs) -> _Call:
    """FlashMLA's dense decode over the block table; its output is the last call's (a new tensor
    each call, the graph pool's under capture)."""
    batch, heads = inp.batch_size, inp.q.shape[1]
    q = inp.q.view(batch, inp.num_draft, heads, HEAD_DIM)  # [B, T, H, 576]
    k_cache = inp.pool.view(inp.pool.shape[0], PAGE_SIZE, 1, HEAD_DIM)  # [pages, 64, 1, 576]
    meta = flash_mla.get_mla_metadata()[0]  # filled by the first (eager) call, reused by the replays
    last: list[torch.Tensor] = []

    def call() -> None:
        out, _ = flash_mla.flash_mla_with_kvcache(q, k_cache, inp.block_table, inp.seqlens, V_HEAD_DIM, meta,
                                                  softmax_scale=PRODUCTION_SM_SCALE, causal=inp.num_draft > 1,
                                                  use_legacy=True)
        last[:] = [out]

    return _Call(call, lambda: last[0].view(batch * inp.num_draft, heads, V_HEAD_DIM))


def flashinfer_call(flashinfer, workspace: torch.Tensor, inp: PagedInputs) -> _Call:
    """FlashInfer's fa3 MLA on page_size=1 over ``kv_indices`` (planned here)."""
    from flashinfer.mla import MLAPlanMetadata

    heads = inp.q.shape[1]
    out = torch.full((inp.q.shape[0], heads, V_HEAD_DIM), float("nan"), dtype=inp.q.dtype, device=inp.q.device)
    wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend="fa3")
    metadata = MLAPlanMetadata.csr(inp.qo_indptr, inp.kv_indptr, inp.kv_indices, inp.seqlens)
    wrapper.plan(metadata=metadata, num_heads=heads, head_dim_ckv=V_HEAD_DIM, head_dim_kpe=HEAD_DIM - V_HEAD_DIM,
                 page_size=1, causal=inp.num_draft > 1, sm_scale=PRODUCTION_SM_SCALE, q_data_type=inp.q.dtype,
                 kv_data_type=inp.pool.dtype, query_layout="packed", kv_cache_layout="packed")
    kv_cache = inp.slots.view(-1, 1, HEAD_DIM)  # [slots, 1, 576]

    def call() -> None:
        wrapper.run(query=inp.q, kv_cache=kv_cache, out=out)

    call.wrapper = wrapper  # the graph's buffers live as long as the call
    return _Call(call, lambda: out)


# --- timing -----------------------------------------------------------------------------------


def interleaved_us(
    replays: dict[str, Callable[[], object]], flush: Callable[[], object], repetitions: int, per_repetition: int
) -> dict[str, list[float]]:
    """Per kernel, the median µs of each of ``repetitions`` rounds. A round replays every kernel
    ``per_repetition`` times, the order rotating replay by replay, each replay after ``flush``
    between CUDA events (one round of warm-up first, not counted)."""
    names = list(replays)
    for name in names:
        flush()
        replays[name]()
    events = {name: [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(per_repetition)] for _ in range(repetitions)] for name in names}
    for rep in range(repetitions):
        for i in range(per_repetition):
            shift = (rep * per_repetition + i) % len(names)
            for name in names[shift:] + names[:shift]:
                start, end = events[name][rep][i]
                flush()
                start.record()
                replays[name]()
                end.record()
    torch.cuda.synchronize()
    return {name: [statistics.median(s.elapsed_time(e) * 1e3 for s, e in rounds) for rounds in events[name]]
            for name in names}


# --- one row ----------------------------------------------------------------------------------


@dataclass
class PeerRow:
    """One row's result. ``rounds_us[k]``: kernel k's median µs per round (absent: not timed, see
    ``errors[k]``); ``rel_err[k]``: its largest per-request error against the fp32 oracle;
    ``ratios``: best peer / project per round (empty without the project or any peer)."""

    name: str
    klass: str
    batch_size: int
    num_draft: int
    num_heads: int
    context_lens: list[int]
    roofline_us: float
    rounds_us: dict[str, list[float]] = field(default_factory=dict)
    rel_err: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    best_peer: str | None = None
    ratios: list[float] = field(default_factory=list)
    project_path: str = ""

    def median_us(self, kernel: str) -> float | None:
        rounds = self.rounds_us.get(kernel)
        return statistics.median(rounds) if rounds else None

    @property
    def ratio(self) -> float | None:
        """The median of ``ratios`` (None without any)."""
        return statistics.median(self.ratios) if self.ratios else None


TimeFn = Callable[[dict[str, Callable[[], object]], Callable[[], object], int, int], dict[str, list[float]]]


def measure_peers(
    shapes: Sequence[PeerShape],
    ceilings: Ceilings,
    device: torch.device,
    peers: Peers,
    *,
    repetitions: int = DEFAULT_REPETITIONS,
    replays: int = DEFAULT_REPLAYS,
    on_row: Callable[[PeerRow], None] | None = None,
) -> list[PeerRow]:
    """Every row of ``shapes`` on ``device`` (CUDA), in order; see the module docstring."""
    if repetitions < 1 or replays < 1:
        raise ValueError(f"Expected repetitions >= 1 and replays >= 1, got {repetitions} and {replays}")
    flush = l2_flushes(device)["zero"]
    rows = []
    for shape in shapes:
        inp = paged_inputs(shape.case, device)
        makers = {
            "project": lambda: project_call(inp),
            "flashmla": lambda: flashmla_call(peers.flash_mla, inp),
            "flashinfer": lambda: flashinfer_call(peers.flashinfer, peers.workspace, inp),
        }
        row = measure_row(shape, inp, makers, ceilings, capture=graph_replay, time_fn=interleaved_us, flush=flush,
                          repetitions=repetitions, replays=replays)
        rows.append(row)
        if on_row is not None:
            on_row(row)
        del inp, makers
        torch.cuda.empty_cache()
    return rows


def measure_row(
    shape: PeerShape,
    inp: PagedInputs,
    makers: dict[str, Callable[[], _Call]],
    ceilings: Ceilings,
    *,
    capture: Callable[[Callable[[], object]], Callable[[], object]],
    time_fn: TimeFn,
    flush: Callable[[], object],
    repetitions: int,
    replays: int,
) -> PeerRow:
    """One row: each kernel made (``makers[k]()``), checked, captured (``capture``), then all timed
    together by ``time_fn(replays_by_kernel, flush, repetitions, replays)``, then checked again."""
    case = shape.case
    num_bytes = mla_verify_bytes(case.context_lens, case.draft_lens, case.num_heads, HEAD_DIM, V_HEAD_DIM)
    flops = mla_verify_flops(case.context_lens, case.draft_lens, case.num_heads, HEAD_DIM, V_HEAD_DIM)
    row = PeerRow(name=shape.name, klass=shape.klass, batch_size=case.batch_size, num_draft=case.draft_lens[0],
                  num_heads=case.num_heads, context_lens=list(case.context_lens),
                  roofline_us=round(roofline_time(num_bytes, flops, ceilings) * 1e6, 2))
    oracle = mla_verify_reference(inp.q, inp.slots, inp.qo_indptr_host, inp.kv_indptr_host, inp.kv_indices, None,
                                  PRODUCTION_SM_SCALE, V_HEAD_DIM, compute_dtype=torch.float32,
                                  out_dtype=torch.float32)
    calls: dict[str, _Call] = {}
    graphs: dict[str, Callable[[], object]] = {}
    for kernel, make in makers.items():
        try:
            made = make()
            made.call()  # eager first: FlashMLA fills its schedule here, outside the graph
            _check(row, kernel, made, oracle, inp)
            graphs[kernel] = capture(made.call)
            calls[kernel] = made
            if kernel == "project":
                row.project_path = made.note
        except Exception as exc:  # noqa: BLE001 - a kernel that refuses a shape is a row with the reason
            row.errors.setdefault(kernel, f"{type(exc).__name__}: {str(exc)[:300]}")
    if graphs:
        for made in calls.values():  # what the replays leave is what gets checked after them
            made.output().fill_(float("nan"))
        rounds = time_fn(graphs, flush, repetitions, replays)
        for kernel, made in calls.items():  # the replayed outputs must be right
            if _check(row, kernel, made, oracle, inp, replayed=True):
                row.rounds_us[kernel] = [round(t, 3) for t in rounds[kernel]]
    _ratios(row)
    return row


def _check(row: PeerRow, kernel: str, made: _Call, oracle: torch.Tensor, inp: PagedInputs,
           replayed: bool = False) -> bool:
    """Record ``kernel``'s error against ``oracle``; False (with the reason) when it is over ``MAX_REL_ERR``."""
    out = made.output()
    finite = bool(torch.isfinite(out).all())
    err = max_request_rel_err(out, oracle, inp.qo_indptr_host) if finite else float("inf")
    row.rel_err[kernel] = max(row.rel_err.get(kernel, 0.0), err)
    if err <= MAX_REL_ERR:
        return True
    when = "after its replays" if replayed else "eagerly"
    row.errors[kernel] = f"relative error {err:.3g} {when} (over {MAX_REL_ERR:g}): not timed"
    if not replayed:
        raise RuntimeError(row.errors[kernel])
    return False


def _ratios(row: PeerRow) -> None:
    """Best peer (lower median) and its per-round ratio over the project."""
    project = row.rounds_us.get("project")
    timed = [peer for peer in PEERS if row.rounds_us.get(peer)]
    if not project or not timed:
        return
    row.best_peer = min(timed, key=row.median_us)
    row.ratios = [round(p / k, 4) for p, k in zip(row.rounds_us[row.best_peer], project)]


# --- metrics and report -----------------------------------------------------------------------


def summarize_peers(rows: Sequence[PeerRow]) -> dict:
    """``min_peer_ratio_<class>`` (the samples of the class's row with the lowest median ratio),
    ``peer_ratio_<row>`` (every row's samples), ``peer_rows`` (rows with a ratio) and
    ``max_rel_err_peer_rows`` (the project's largest error in these rows). A class without a
    ratio has no metric (never 0.0)."""
    metrics: dict = {}
    with_ratio = [r for r in rows if r.ratios]
    for klass in PEER_CLASSES:
        of_class = [r for r in with_ratio if r.klass == klass]
        if of_class:
            metrics[f"min_peer_ratio_{klass}"] = list(min(of_class, key=lambda r: r.ratio).ratios)
    for r in with_ratio:
        metrics[f"peer_ratio_{r.name}"] = list(r.ratios)
    metrics["peer_rows"] = len(with_ratio)
    project_errs = [r.rel_err["project"] for r in rows if "project" in r.rel_err]
    if project_errs:
        metrics["max_rel_err_peer_rows"] = max(project_errs)
    return metrics


def peers_table(rows: Sequence[PeerRow], versions: dict[str, str]) -> str:
    """The comparison as Markdown: medians over every round, the ratio's median and range."""
    lines = [
        "# The kernel beside FlashMLA and FlashInfer",
        "",
        f"FlashMLA (sgl-flash-mla {versions.get('flash_mla', '?')}, 64-token pages, block table) and FlashInfer "
        f"{versions.get('flashinfer', '?')} (BatchMLAPagedAttentionWrapper, fa3, page_size=1) beside the project "
        "(MLAVerifyWrapper, causal) on the same pages; each call replayed from a CUDA graph, the three interleaved, "
        "L2 zeroed before every replay; µs are medians over every round. ratio = best peer / project, median "
        "[lowest, highest] of the rounds (> 1: the project is faster). frac = roofline / time.",
        "",
        "| row | class | B | T | H | L | roofline µs | project µs | FlashMLA µs | FlashInfer µs | best peer "
        "| ratio | frac project | frac FlashMLA | frac FlashInfer | rel err P / FM / FI | path | notes |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|---|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        lengths = r.context_lens
        context = str(lengths[0]) if len(set(lengths)) == 1 else f"{min(lengths)}..{max(lengths)}"
        us = {k: r.median_us(k) for k in KERNELS}
        frac = {k: None if us[k] is None else r.roofline_us / us[k] for k in KERNELS}
        ratio = "n/a" if r.ratio is None else f"{r.ratio:.3f} [{min(r.ratios):.3f}, {max(r.ratios):.3f}]"
        errs = " / ".join(_cell(r.rel_err.get(k), ".1e") for k in KERNELS)
        notes = "; ".join(f"{k}: {e}" for k, e in r.errors.items()).replace("|", "/")
        lines.append(
            f"| {r.name} | {r.klass} | {r.batch_size} | {r.num_draft} | {r.num_heads} | {context} "
            f"| {r.roofline_us:.1f} | {_cell(us['project'])} | {_cell(us['flashmla'])} | {_cell(us['flashinfer'])} "
            f"| {r.best_peer or 'n/a'} | {ratio} | {_cell(frac['project'], '.3f')} | {_cell(frac['flashmla'], '.3f')} "
            f"| {_cell(frac['flashinfer'], '.3f')} | {errs} | {r.project_path or 'n/a'} | {notes} |"
        )
    return "\n".join(lines) + "\n"


def _cell(value: float | None, spec: str = ".1f") -> str:
    return "n/a" if value is None else format(value, spec)
