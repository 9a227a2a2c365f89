"""MLA tree-verify attention: the public function and its plan()/run() halves.

``mla_verify_attention`` is the one-call API. A serving engine that captures CUDA graphs
uses the halves instead: ``MLAVerifyWrapper.plan`` reads the batch's lengths on the host,
decides the work decomposition and uploads it (into a new buffer, or under ``use_cuda_graph``
into the caller's fixed one); ``run`` only launches device work into ``out``, so under
``use_cuda_graph`` it can be captured once and replayed across re-plans.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass

import torch

from kernel import hopper
from kernel.device_plan import plan_uniform_on_device
from kernel.plan import (
    SCHEDULES,
    HeadDims,
    MLAVerifyPlan,
    PlanLayout,
    TileConfig,
    default_tile_config,
    max_row_blocks,
    max_work_items,
    plan_work,
    with_contiguity,
)
from kernel.staging import upload_plan
from kernel.triton_kernels import launch_combine, launch_split
from kernel.validation import (
    check_dims,
    check_inputs,
    check_lengths,
    check_planned_inputs,
    check_sizes,
    kv_rows,
)

LOG2E = 1.4426950408889634
COMBINE_SPLITS = 32  # splits merged per load in the combine kernel
COMBINE_COLS = 128  # output columns per combine program
BACKENDS = ("auto", "triton", "hopper")


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


if interpreting():
    from kernel import _interpreter_compat

    _interpreter_compat.install()


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
    return 4


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@dataclass
class Workspace:
    """Device buffers of the split kernel, flat so one allocation serves every tile configuration.

    partial_o: fp32 [capacity * BLOCK_M * BLOCK_DV elements] and partial_lse: fp32
    [capacity * BLOCK_M] (split partials, read as [num_work, BLOCK_M, BLOCK_DV] and
    [num_work, BLOCK_M]).
    For ``MLAVerifyWrapper(use_cuda_graph=True)`` also: metadata, int32 [layout.numel], the
    fixed plan buffer that every ``plan()`` copies into; layout, its offsets; config, the one
    tile configuration every plan into it uses (a captured launch fixes the block sizes);
    backend, the path ("hopper" or "triton") whose tile configurations it was sized for.
    """

    partial_o: torch.Tensor
    partial_lse: torch.Tensor
    metadata: torch.Tensor | None = None
    layout: PlanLayout | None = None
    config: TileConfig | None = None
    backend: str = "triton"

    @staticmethod
    def allocate(max_work: int, config: TileConfig, dims: HeadDims, device: torch.device) -> "Workspace":
        """Room for ``max_work`` work items of ``config`` (see ``max_work_items`` for a bound)."""
        return Workspace(
            torch.empty(max_work * config.block_m * dims.block_dv, dtype=torch.float32, device=device),
            torch.empty(max_work * config.block_m, dtype=torch.float32, device=device),
        )

    def fits(self, plan: MLAVerifyPlan) -> bool:
        """Whether this workspace can hold ``plan``'s split partials."""
        cfg = plan.config
        return not plan.needs_combine or (
            self.partial_o.numel() >= plan.num_work * cfg.block_m * plan.dims.block_dv
            and self.partial_lse.numel() >= plan.num_work * cfg.block_m
        )


def make_plan(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    num_heads: int,
    head_dim: int,
    v_head_dim: int,
    device: torch.device,
    config: TileConfig | None = None,
    hopper_tiles: bool = False,
    schedule: str = "uniform",
) -> MLAVerifyPlan:
    """Plan a call from int32 [B+1] ``qo_indptr`` / ``kv_indptr`` (read on the host: one sync).

    config None: the Triton path's default for the batch, or with ``hopper_tiles`` the tile
    configuration of the Hopper variant ``hopper.choose_variant`` picks. schedule: how the keys
    are split over programs (``kernel.plan.plan_work``: "uniform", "balanced" or "waves")."""
    check_dims(head_dim, v_head_dim)
    qo, kv = host_lists(qo_indptr, kv_indptr)
    if qo[0] != 0:
        raise ValueError(f"Expected qo_indptr[0] == 0, got {qo[0]}")
    qo_lens = [b - a for a, b in zip(qo, qo[1:])]
    kv_lens = [b - a for a, b in zip(kv, kv[1:])]
    check_lengths(qo_lens, kv_lens)
    dims = HeadDims.of(head_dim, v_head_dim)
    if config is None:
        max_rows = max(qo_lens) * num_heads if qo_lens else 1
        if hopper_tiles:
            config = hopper.tile_config(_num_sms(device), hopper.choose_variant(max_rows))
        else:
            config = default_tile_config(max_rows, dims, _num_sms(device), interpreting())
    return plan_work(qo_lens, kv_lens, num_heads, dims, config, schedule=schedule)


def host_lists(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor) -> tuple[list[int], list[int]]:
    """The two indptrs as host lists: free for CPU tensors, one device-to-host copy (one sync)
    for device tensors (FlashInfer's ``plan`` likewise takes host indptrs)."""
    if qo_indptr.device.type == "cpu" and kv_indptr.device.type == "cpu":
        return qo_indptr.tolist(), kv_indptr.tolist()
    both = torch.cat([qo_indptr.reshape(-1), kv_indptr.reshape(-1).to(qo_indptr.device)]).tolist()
    return both[: qo_indptr.numel()], both[qo_indptr.numel() :]


def triton_config_for(config: TileConfig) -> TileConfig:
    """The Triton path's launch configuration over the same work decomposition as ``config``.

    The dispatched Hopper tile configurations decompose the work as Triton configurations of the
    same block sizes do: the 64-row one is launched as the Triton kernel with 64-row blocks
    (BM64_BN64_w8_s2, which spills on sm_90: it only serves run()'s fallback for int64 indices or
    strided rows over a Hopper plan); the keys-as-M 16-row one differs from the Triton 16-row
    default in launch parameters, replaced by the default's (8 warps, 3 stages), and keeps its
    own ``min_chunk``; the seesaw's (64 rows, one 4-warp default partition) is launched with 8
    warps, as the other 64-row one. Other configurations are returned unchanged.
    """
    if config.keys_as_m:
        return dataclasses.replace(config, keys_as_m=False, num_warps=8, num_stages=3)
    if config.block_m >= 64 and config.num_warps < 8:
        return dataclasses.replace(config, num_warps=8)
    return config


def run_plan(
    plan: MLAVerifyPlan,
    meta: dict[str, torch.Tensor],
    q: torch.Tensor,
    kv: torch.Tensor,
    kv_indices: torch.Tensor,
    tree_mask: torch.Tensor | None,
    sm_scale: float,
    out: torch.Tensor,
    workspace: Workspace,
    combine: bool = True,
    layout: PlanLayout | None = None,
):
    """Launch the split kernel and, when a row block has several splits, the combine kernel.

    meta: ``PlanLayout.views`` of the uploaded plan.  q: [N, H, D].  kv: [num_slots, D].
    out: [N, H, DV] (written).  layout: the grid's size (None: exactly ``plan``); with a larger
    layout the grids cover it, the combine always launches and programs past the plan exit, so
    the launches stay valid for any later plan the layout holds (CUDA graph replay).
    Returns the compiled split kernel (for register / spill statistics). ``combine=False``
    leaves the split partials unmerged (for timing the split kernel alone).
    """
    cfg, dims = plan.config, plan.dims
    fixed_grid = layout is not None
    layout = layout or PlanLayout.exact(plan)
    if layout.max_work == 0:
        return None
    assert workspace.fits(plan), "workspace smaller than the plan"
    mask = None if tree_mask is None else tree_mask.view(torch.uint8)
    compiled = launch_split(q, kv, kv_indices, mask, out, workspace.partial_o, workspace.partial_lse, meta,
                            layout.max_work, plan.num_heads, sm_scale * LOG2E, dims, cfg, interpreting(),
                            plan.kv_contig is not None)
    if combine and (plan.needs_combine or fixed_grid):
        launch_combine(out, workspace.partial_o, workspace.partial_lse, meta, meta["qo_indptr"], plan.num_heads,
                       layout.max_row_blocks, cfg.block_m, dims.block_dv, COMBINE_SPLITS, min(COMBINE_COLS, dims.block_dv))
    return compiled


class MLAVerifyWrapper:
    """Plan once per batch, run once per layer (the serving-engine path).

    ``plan`` reads the per-request lengths on the host (one sync), decides the work
    decomposition and copies it to the device; ``run`` only validates shapes on the host and
    launches device work (no host sync; no allocation when ``out`` is given), so layers sharing
    a batch share a plan.

    By default ``plan`` uploads each plan into a new metadata buffer and keeps a workspace it
    grows as needed (or the caller's ``workspace``, never replaced). With ``use_cuda_graph=True``
    the caller passes a workspace from ``allocate_workspace(..., use_cuda_graph=True)``: ``plan``
    copies every plan into that workspace's fixed metadata buffer and ``run`` launches grids
    sized for its largest batch, so a graph captured around ``run`` once stays valid after
    re-planning with new lengths (same q / kv / out buffers, at most ``max_batch`` requests of
    at most ``max_draft`` drafts). In this mode q, out and tree_mask may be static buffers longer
    than a plan needs (a captured step padded to its bucket): rows past the plan's N are neither
    read nor written.

    Dispatch is decided once, by ``plan``, and ``run`` launches what was planned: on an sm_90
    (Hopper) GPU with Gluon, ``plan`` picks the Hopper path (``kernel.hopper``: warp-specialized
    Gluon split kernel, 1.3-1.7x the Triton path on an H200) for bf16 q with D=576, DV=512, int32
    ``kv_indices``, contiguous KV rows and no explicit ``config``; everything else, and Triton's
    CPU interpreter, takes the Triton path. ``plan`` is told the index dtype and the KV rows'
    stride it will be run with (``kv_index_dtype``, ``kv_row_stride``), and ``run`` refuses other
    inputs with ``ValueError`` instead of re-deciding. ``backend="triton"`` forces the Triton
    path; ``backend="hopper"`` forces the Hopper path and raises ``ValueError`` at ``plan`` where
    it cannot run. ``path`` says which one ``plan`` chose.

    Example::

        wrapper = MLAVerifyWrapper(torch.device("cuda"))
        wrapper.plan(qo_indptr, kv_indptr, num_heads=16)
        for layer in layers:
            wrapper.run(q[layer], kv_cache[layer], kv_indices, tree_mask, out=out[layer])

        # CUDA graphs: capture once, re-plan per batch, replay.
        workspace = MLAVerifyWrapper(device).allocate_workspace(max_batch=64, max_draft=8, num_heads=16,
                                                                use_cuda_graph=True)
        wrapper = MLAVerifyWrapper(device, workspace=workspace, use_cuda_graph=True)
        wrapper.plan(qo_indptr, kv_indptr, num_heads=16)
        with torch.cuda.graph(graph):
            wrapper.run(q, kv_cache, kv_indices, tree_mask, out=out)
        wrapper.plan(new_qo_indptr, new_kv_indptr, num_heads=16)  # new lengths, same buffers
        graph.replay()
    """

    def __init__(
        self,
        device: torch.device | str,
        workspace: Workspace | None = None,
        *,
        use_cuda_graph: bool = False,
        backend: str = "auto",
    ) -> None:
        """``workspace``: caller-owned scratch (from ``allocate_workspace``) that ``plan`` must use
        and never replace; None lets ``plan`` allocate. ``use_cuda_graph``: see the class docstring.
        ``backend``: "auto" (Hopper where supported, else Triton), "triton" or "hopper"."""
        self.device = torch.device(device)
        if backend not in BACKENDS:
            raise ValueError(f"Expected backend in {BACKENDS}, got {backend!r}")
        if backend == "hopper" and not hopper.available(self.device):
            raise ValueError(
                "Expected an sm_90 CUDA device, Triton with Gluon and no TRITON_INTERPRET for backend='hopper', got "
                f"device {self.device}" + ("" if hopper.HAVE_GLUON else " and a Triton without Gluon")
                + (" under Triton's CPU interpreter" if interpreting() else "")
            )
        self.backend = backend
        self._hopper_ok = backend != "triton" and hopper.available(self.device)
        if backend == "hopper" and use_cuda_graph and workspace is not None and workspace.backend != "hopper":
            raise ValueError("Expected a workspace allocated for the Hopper path with backend='hopper', "
                             f"got one sized for the {workspace.backend} path")
        if use_cuda_graph and (workspace is None or workspace.metadata is None):
            raise ValueError(
                "Expected a workspace from allocate_workspace(..., use_cuda_graph=True) with use_cuda_graph=True, "
                f"got {'none' if workspace is None else 'one without a metadata buffer'}"
            )
        self.use_cuda_graph = use_cuda_graph
        self._plan: MLAVerifyPlan | None = None
        self._meta: dict[str, torch.Tensor] = {}
        self._workspace = workspace
        self._owns_workspace = workspace is None
        self._dtype = torch.bfloat16
        self._variant: "hopper.Variant | None" = None  # set when plan() chose the Hopper path
        self._kv_index_dtype = torch.int32
        self._kv_row_stride: int | None = None
        self._schedule: str | None = None  # a graph workspace's schedule, once a plan named one
        self.path: str | None = None

    @property
    def workspace(self) -> Workspace | None:
        """The split kernel's scratch (the caller's, or the one ``plan`` allocated)."""
        return self._workspace

    @property
    def planned(self) -> MLAVerifyPlan | None:
        """The plan the next ``run`` launches (None before the first ``plan``)."""
        return self._plan

    @property
    def plans_on_device(self) -> bool:
        """Whether ``plan_on_device`` stands for ``plan`` on every batch this graph workspace holds:
        a host plan has pinned the path and tiles, and ``plan`` would split uniformly: the Triton
        path always; the Hopper path for one request (the workspace's bound here), or wherever the
        host plan was made with ``schedule="uniform"`` (re-plans keep the schedule)."""
        return (self.use_cuda_graph and self._plan is not None and self._plan.kv_contig is None
                and (self.path == "triton" or self._workspace.layout.max_batch == 1 or self._schedule == "uniform"))

    def plan_on_device(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor) -> None:
        """``plan`` for the lengths in the device indptrs (int32 [B + 1], B at most the workspace's
        batch; empty entries past the real ones allowed), made on the device into the workspace's
        metadata: no host sync, so a CUDA graph captures it and re-plans on every replay
        (``kernel.device_plan``). ValueError unless ``plans_on_device``. The lengths are trusted
        (``plan`` checks them on the host): the caller keeps them within the workspace's bounds."""
        if not self.plans_on_device:
            raise ValueError("Expected a CUDA-graph wrapper planned once on the host with a uniform split "
                             f"(Triton path, or Hopper path for one request), got path {self.path!r}, "
                             f"use_cuda_graph={self.use_cuda_graph}")
        plan_uniform_on_device(qo_indptr, kv_indptr, self._workspace.metadata, self._workspace.layout,
                               self._plan.num_heads, self._plan.config)

    def device_plan_matches(self, qo_lens: list[int], kv_lens: list[int]) -> bool:
        """Whether the workspace's metadata holds, bit for bit, what ``plan`` makes for these
        lengths (the check of a ``plan_on_device``; reads the metadata back: a device sync)."""
        if not self.plans_on_device:
            return False
        planned = self._plan
        check_lengths(list(qo_lens), list(kv_lens))
        want = plan_work(list(qo_lens), list(kv_lens), planned.num_heads, planned.dims, planned.config, schedule="uniform")
        layout = self._workspace.layout
        got = self._workspace.metadata[: layout.numel].cpu().numpy()
        return layout.holds(want) and bool((got == layout.pack(want)).all())

    def allocate_workspace(
        self,
        max_batch: int,
        max_draft: int,
        num_heads: int,
        head_dim: int = 576,
        v_head_dim: int = 512,
        *,
        use_cuda_graph: bool = False,
    ) -> Workspace:
        """A workspace that fits every batch of up to ``max_batch`` requests with up to
        ``max_draft`` draft tokens each (any context lengths).

        Without ``use_cuda_graph`` it serves the default tile configuration of every such batch;
        with it, it also holds the fixed metadata buffer and pins one tile configuration (the
        default for ``max_draft * num_heads`` packed rows), used for every plan.
        """
        device = self.device
        dims = HeadDims.of(head_dim, v_head_dim)
        sms, interp = _num_sms(device), interpreting()
        use_hopper = self._hopper_ok and self._hopper_dims(dims)
        if use_cuda_graph and use_hopper:
            configs = {hopper.tile_config(sms, hopper.choose_variant(max_draft * num_heads))}
        elif use_cuda_graph:
            configs = {default_tile_config(max_draft * num_heads, dims, sms, interp)}
        else:
            configs = {default_tile_config(t * num_heads, dims, sms, interp) for t in range(1, max_draft + 1)}
            if use_hopper:
                configs |= {hopper.tile_config(sms, hopper.choose_variant(t * num_heads)) for t in range(1, max_draft + 1)}
        rows = max(max_work_items(max_batch, max_draft, num_heads, c) * c.block_m for c in configs)
        workspace = Workspace(
            torch.empty(rows * dims.block_dv, dtype=torch.float32, device=device),
            torch.empty(rows, dtype=torch.float32, device=device),
        )
        if use_cuda_graph:
            (config,) = configs
            layout = PlanLayout(
                max_batch,
                max_work_items(max_batch, max_draft, num_heads, config),
                max_row_blocks(max_batch, max_draft, num_heads, config),
            )
            workspace.metadata = torch.zeros(layout.numel, dtype=torch.int32, device=device)
            workspace.layout, workspace.config = layout, config
            workspace.backend = "hopper" if use_hopper else "triton"
        return workspace

    @staticmethod
    def _hopper_dims(dims: HeadDims) -> bool:
        return (dims.head_dim, dims.v_head_dim) == (hopper.HEAD_DIM, hopper.V_HEAD_DIM)

    def _choose_path(self, dims: HeadDims, dtype: torch.dtype, config: TileConfig | None, kv_index_dtype: torch.dtype,
                     kv_row_stride: int | None, variant) -> str:
        """"hopper" or "triton" for a plan; ValueError when ``backend="hopper"`` cannot serve it."""
        if self.use_cuda_graph:
            reasons = [] if self._workspace.backend == "hopper" else ["a workspace sized for the Triton path"]
        else:
            reasons = [] if config is None else ["an explicit (Triton) tile config"]
        if not self._hopper_dims(dims):
            reasons.append(f"head_dim={dims.head_dim}, v_head_dim={dims.v_head_dim} (the Hopper path needs 576, 512)")
        if dtype != torch.bfloat16:
            reasons.append(f"dtype {dtype} (the Hopper path needs torch.bfloat16)")
        if kv_index_dtype != torch.int32:
            reasons.append(f"kv_indices of {kv_index_dtype} (the Hopper path reads int32 slots)")
        if kv_row_stride not in (None, dims.head_dim):
            reasons.append(f"KV rows {kv_row_stride} elements apart (the Hopper path needs contiguous [slots, 576] rows)")
        if variant is not None and not self._hopper_ok:
            reasons.append(f"a Hopper variant ({variant.describe()}) where the Hopper path cannot run")
        if self._hopper_ok and not reasons:
            return "hopper"
        if self.backend == "hopper":
            raise ValueError(f"Expected a batch the Hopper path serves with backend='hopper', got {'; '.join(reasons)}")
        return "triton"

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        num_heads: int,
        head_dim: int = 576,
        v_head_dim: int = 512,
        config: TileConfig | None = None,
        dtype: torch.dtype = torch.bfloat16,
        kv_start=None,
        kv_contig=None,
        schedule: str | None = None,
        *,
        kv_index_dtype: torch.dtype = torch.int32,
        kv_row_stride: int | None = None,
        variant: "hopper.Variant | None" = None,
    ) -> MLAVerifyPlan:
        """Decide the kernel path and the work decomposition of a batch, and copy it to the device.

        qo_indptr, kv_indptr: int32 [B+1], read on the host (one sync); they are not kept.
        dtype: q's dtype. config: tile configuration (None: the default for the batch, or the
        workspace's under ``use_cuda_graph``). schedule: "uniform" (one chunk length for every
        request), "balanced" (the batch's work divided evenly over the SMs, a request split
        only where it is long) or "waves" (whichever of those two and the shortest pieces that run
        in one wave finishes first; ``kernel.plan.plan_work``); all fit the same workspace
        bounds. None: ``hopper.default_schedule`` on the Hopper path ("waves" for two or more
        requests), uniform on the Triton path. Under ``use_cuda_graph`` a schedule once
        named is kept for the plans that name none ("uniform": the graph may plan on the device).
        Allocates a workspace if the wrapper owns one and it is too small; raises ``ValueError``
        if a caller's workspace is too small.
        kv_start, kv_contig: host int [B], the contiguous fast path (``kernel.plan.with_contiguity``):
        request b's first kv_contig[b] keys (default: its prefix) sit at slots kv_start[b] +
        position (-1: none) and are read without index loads; kv_indices must still name them.
        None: every key through kv_indices (the kernels are compiled without the fast path).
        Under ``use_cuda_graph`` the kernels captured read the fast path's metadata only if the
        plan made before capture had it (later plans refresh it; all -1 turns it off).
        kv_index_dtype: the dtype of the ``kv_indices`` that ``run`` will get (int32 or int64).
        kv_row_stride: elements between consecutive KV rows in ``run``'s cache (None: contiguous
        rows of head_dim). variant: a Hopper tile variant to plan for (``kernel.hopper.VARIANTS``;
        benchmarks and tuning), None: ``hopper.choose_variant``'s. ``run`` refuses inputs other
        than the ones planned for.
        Returns the plan (host lists).
        """
        if self.use_cuda_graph:
            config = self._workspace.config
            if variant is not None:
                raise ValueError(f"Expected no variant with use_cuda_graph (the workspace pins one), got {variant.describe()}")
        check_dims(head_dim, v_head_dim)
        if kv_index_dtype not in (torch.int32, torch.int64):
            raise ValueError(f"Expected kv_index_dtype torch.int32 or torch.int64, got {kv_index_dtype}")
        path = self._choose_path(HeadDims.of(head_dim, v_head_dim), dtype, config, kv_index_dtype, kv_row_stride, variant)
        if path == "triton" and config is not None:
            config = triton_config_for(config)  # a graph workspace sized for the Hopper path, fp16 q
        if path == "hopper" and variant is not None:
            config = hopper.tile_config(_num_sms(self.device), variant)
        if schedule is not None and schedule not in SCHEDULES:
            raise ValueError(f"Expected schedule in {SCHEDULES}, got {schedule!r}")
        if self.use_cuda_graph:  # a graph workspace keeps a schedule it was once given
            schedule = self._schedule = schedule or self._schedule
        if schedule is None:
            schedule = hopper.default_schedule(qo_indptr.numel() - 1) if path == "hopper" else "uniform"
        plan = make_plan(qo_indptr, kv_indptr, num_heads, head_dim, v_head_dim, self.device, config,
                         hopper_tiles=path == "hopper", schedule=schedule)
        if kv_start is not None:
            with_contiguity(plan, kv_start, kv_contig)
        if self._workspace is None or not self._workspace.fits(plan):
            if not self._owns_workspace:
                raise ValueError(
                    f"Expected a workspace with room for {plan.num_work} work items of {plan.config.describe()}, "
                    f"got one of {self._workspace.partial_o.numel()} partial elements; size it with allocate_workspace()"
                )
            self._workspace = Workspace.allocate(max(1, plan.num_work), plan.config, plan.dims, self.device)
        if self.use_cuda_graph:
            layout = self._workspace.layout
            if not layout.holds(plan):
                raise ValueError(
                    f"Expected a batch within the workspace's bounds ({layout.max_batch} requests, {layout.max_work} "
                    f"work items), got {len(plan.qo_lens)} requests and {plan.num_work} work items"
                )
            buffer = upload_plan(plan, layout, self.device, into=self._workspace.metadata)
        else:
            layout = PlanLayout.exact(plan)
            buffer = upload_plan(plan, layout, self.device)
        self._plan, self._meta, self._dtype = plan, layout.views(buffer), dtype
        self._sizes = (plan.num_tokens, plan.total_kv, plan.mask_numel)
        self.path = path
        self._variant = hopper.variant_of(plan.config) if path == "hopper" else None
        self._kv_index_dtype, self._kv_row_stride = kv_index_dtype, kv_row_stride
        return plan

    def run(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        kv_indices: torch.Tensor,
        tree_mask: torch.Tensor | None = None,
        sm_scale: float | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention for the planned batch. Shapes as in :func:`mla_verify_attention`; returns out [N, H, DV]."""
        if self._plan is None or self._workspace is None:
            raise ValueError("Expected plan() before run(), got run() on an unplanned wrapper")
        plan = self._plan
        shapes = check_planned_inputs(q, kv_cache, kv_indices, tree_mask, plan.dims.v_head_dim, out)
        if q.dtype != self._dtype:
            raise ValueError(f"Expected q.dtype == {self._dtype} as planned, got {q.dtype}")
        if shapes.num_heads != plan.num_heads or shapes.head_dim != plan.dims.head_dim:
            raise ValueError(
                f"Expected q of shape [N, {plan.num_heads}, {plan.dims.head_dim}] as planned, got {tuple(q.shape)}"
            )
        check_sizes(*self._sizes, shapes.num_tokens, kv_indices.numel(), None if tree_mask is None else tree_mask.numel(),
                    padded=self.use_cuda_graph)
        if out is None:
            out = torch.empty((shapes.num_tokens, shapes.num_heads, shapes.v_head_dim), dtype=q.dtype, device=q.device)
        scale = 1.0 / math.sqrt(shapes.head_dim) if sm_scale is None else float(sm_scale)
        layout = self._workspace.layout if self.use_cuda_graph else None
        kv = kv_rows(kv_cache)
        if kv_indices.dtype != self._kv_index_dtype:
            raise ValueError(f"Expected kv_indices of {self._kv_index_dtype} as planned (plan(kv_index_dtype=...)), "
                             f"got {kv_indices.dtype}")
        if kv.stride(0) != (self._kv_row_stride or plan.dims.head_dim):
            raise ValueError(f"Expected KV rows {self._kv_row_stride or plan.dims.head_dim} elements apart as planned "
                             f"(plan(kv_row_stride=...)), got {kv.stride(0)}")
        if self._variant is not None:
            if not (hopper.supported_inputs(q, kv, plan.dims.v_head_dim, kv_indices) and out.stride(-1) == 1):
                raise ValueError(
                    "Expected inputs the planned Hopper path takes (bf16 q and KV with unit last strides, int32 "
                    f"kv_indices, out with a unit last stride), got q {q.dtype} strides {tuple(q.stride())}, "
                    f"KV strides {tuple(kv.stride())}, out strides {tuple(out.stride())}"
                )
            ws = self._workspace
            hopper.run_split_and_combine(
                plan, self._meta, q, kv, self._meta["qo_indptr"], self._meta["kv_indptr"], kv_indices,
                tree_mask, scale, out, ws.partial_o, ws.partial_lse, variant=self._variant, layout=layout,
                checked=True,
            )
            return out
        run_plan(plan, self._meta, q, kv, kv_indices, tree_mask, scale, out, self._workspace, layout=layout)
        return out


def mla_verify_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    sm_scale: float | None = None,
    v_head_dim: int = 512,
    out: torch.Tensor | None = None,
    *,
    config: TileConfig | None = None,
    backend: str = "auto",
    kv_start=None,
    kv_contig=None,
) -> torch.Tensor:
    """Tree-masked MLA verify attention over a page_size=1 KV pool.

    q: [N, H, D] bf16/fp16, N = qo_indptr[-1].
    kv_cache: [num_slots, D] or [num_slots, 1, D], q's dtype; one latent row per token slot.
    qo_indptr: int32 [B+1]; request b's draft queries are q[qo_indptr[b]:qo_indptr[b+1]] (1 <= T_b <= 64).
    kv_indptr: int32 [B+1]; request b's slots are kv_indices[kv_indptr[b]:kv_indptr[b+1]] in
        position order, the last T_b of them its draft tokens.
        Both indptrs may be on q's device (planning reads them back: one sync) or on the host
        (CPU tensors: no sync; the call only queues device work).
    kv_indices: int32/int64 [total].
    tree_mask: bool/uint8 [sum_b T_b^2] (request b's row-major [T_b, T_b] block at offset
        sum_{c<b} T_c^2; (t, u) true: draft t sees draft u) or None for causal drafts.
        The prefix is always visible.
    sm_scale: score scale, default 1/sqrt(D).
    v_head_dim: DV; V is the first DV values of each row.
    out: optional preallocated [N, H, DV], q's dtype.
    config: optional Triton tile configuration (benchmarks and tuning; selects the Triton path).
    backend: "auto" (the Hopper path on sm_90 where it applies, else Triton), "triton" or "hopper"
        (``MLAVerifyWrapper``).
    kv_start, kv_contig: host int [B], the contiguous fast path (``MLAVerifyWrapper.plan``).
    Returns out: [N, H, DV], q's dtype. Deterministic: identical inputs give identical bits.
    """
    check_inputs(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, v_head_dim, out)
    wrapper = MLAVerifyWrapper(q.device, backend=backend)
    wrapper.plan(qo_indptr, kv_indptr, q.shape[1], q.shape[2], v_head_dim, config, q.dtype, kv_start, kv_contig,
                 kv_index_dtype=kv_indices.dtype, kv_row_stride=kv_rows(kv_cache).stride(0))
    return wrapper.run(q, kv_cache, kv_indices, tree_mask, sm_scale, out)


def compile_stats(
    num_heads: int,
    max_draft: int,
    head_dim: int = 576,
    v_head_dim: int = 512,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cuda",
) -> list[dict]:
    """Compile the kernel configuration used for (H=num_heads, T=max_draft) and report its resources.

    Returns one dict per compiled kernel: {"kernel", "config", "n_regs", "n_spills", "shared_bytes"}
    for the split kernel with the tree mask and causal (two specializations).
    """
    device = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    t, length = max_draft, max(4096, max_draft)
    q = torch.randn((t, num_heads, head_dim), generator=gen).to(device=device, dtype=dtype)
    kv = torch.randn((length, head_dim), generator=gen).to(device=device, dtype=dtype)
    qo_indptr = torch.tensor([0, t], dtype=torch.int32, device=device)
    kv_indptr = torch.tensor([0, length], dtype=torch.int32, device=device)
    kv_indices = torch.randperm(length, generator=gen).to(device=device, dtype=torch.int32)
    mask = torch.ones((t, t), dtype=torch.bool).tril().flatten().to(device)
    stats = []
    for name, tree in (("tree", mask), ("causal", None)):
        plan = make_plan(qo_indptr, kv_indptr, num_heads, head_dim, v_head_dim, device)
        out = torch.empty((t, num_heads, v_head_dim), dtype=dtype, device=device)
        workspace = Workspace.allocate(max(1, plan.num_work), plan.config, plan.dims, device)
        layout = PlanLayout.exact(plan)
        meta = layout.views(upload_plan(plan, layout, device))
        compiled = run_plan(plan, meta, q, kv, kv_indices, tree, 1.0 / math.sqrt(head_dim), out, workspace)
        stats.append(
            {
                "kernel": f"_mla_verify_split_kernel[{name}]",
                "config": plan.config.describe() + f"_D{head_dim}_DV{v_head_dim}_{str(dtype).removeprefix('torch.')}",
                "n_regs": int(getattr(compiled, "n_regs", -1)),
                "n_spills": int(getattr(compiled, "n_spills", -1)),
                "shared_bytes": int(getattr(getattr(compiled, "metadata", None), "shared", -1)),
            }
        )
    return stats
