"""Attention backends, shaped like SGLang's ``AttentionBackend``.

``init_forward_metadata(batch)`` runs once per step for all layers (for the kernel backend:
one ``MLAVerifyWrapper.plan`` from the batch's host copies of the indptrs, so attention adds no
host sync to a step); then each layer calls
``forward_extend`` (prefill), ``forward_decode`` (T=1) or ``forward_verify`` (draft tree).

CUDA-graph hooks (SGLang's names): ``init_cuda_graph_state`` once, then per captured bucket
``init_forward_metadata_capture_cuda_graph(key, ...)`` (a wrapper with its own fixed workspace,
planned for the bucket's largest batch) and, before each replay,
``init_forward_metadata_replay_cuda_graph(key, batch)`` (re-plan into that workspace). A
backend that cannot be captured says so with ``supports_cuda_graph = False``.

Decode and verify take the absorbed query ``q`` [N, H, kv_lora_rank + qk_rope_head_dim] and
return the attention output in latent space [N, H, kv_lora_rank]; the layer maps it through
W_UV. Extend takes the non-absorbed query and returns per-head values [N, H, v_head_dim].

Decisions:
- Both backends share one prefill implementation (non-absorbed MLA through
  ``serving.attention.prefill``: cuDNN, flash or memory-efficient attention with the
  causal mask computed in the kernel, chosen per device), so a comparison between them changes
  only the decode and verify attention, the part the kernel replaces.
- Prefill re-expands every cached row of the request through ``kv_b_proj`` for each chunk and
  layer (K and V of the whole prefix, not only the chunk's): keeping them instead would take
  layers x L x H x (qk + v) elements (115 GB for ``dsv3-tp8`` at 185k tokens), and the absorbed
  form that needs no expansion costs (576 + 512) / (192 + 128) = 3.4x the attention FLOPs. The
  expansion is 2 L r H (nope + v) FLOPs against the attention's 2 n L H (qk + v), a ratio of
  r (nope + v) / (n (qk + v)): 5% at 8192-token chunks, 1.3% at the default 32768.
- The kernel needs bf16/fp16 rows, so the kernel backend refuses a pool of another dtype; q
  is cast to the pool's dtype and the output back to the model's.
"""

from __future__ import annotations

import torch

from kernel import MLAVerifyWrapper
from serving.attention.dense import latent_attention
from serving.attention.prefill import causal_prefill
from serving.device.timing import IntervalTimer
from serving.kv.batch import ForwardBatch
from serving.kv.pool import KVPool


class AttentionBackend:
    """Base class: the shared prefill path and the per-mode dispatch.

    pool: the KV pool; num_heads: H; sm_scale: the model's softmax scale (yarn mscale included).
    prefill_method: ``prefill_attention.METHODS`` entry for prefill; None: chosen per device.
    """

    name = "base"
    supports_cuda_graph = False
    prefill_method: str | None = None

    def __init__(self, pool: KVPool, num_heads: int, kv_lora_rank: int, sm_scale: float) -> None:
        self.pool = pool
        self.num_heads = num_heads
        self.kv_lora_rank = kv_lora_rank
        self.sm_scale = sm_scale
        self.device = pool.kv.device
        self.timer = IntervalTimer(self.device)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Per-step metadata for every layer; the base needs none."""

    def init_forward_metadata_in_step(self, batch: ForwardBatch) -> None:
        """Per-step metadata made on the device inside the step, before its first layer (so a
        CUDA graph captures it); the base, and every eager step, need none."""

    def warmup(self, max_tokens: int) -> tuple[float, str | None]:
        """Compile what a step of up to ``max_tokens`` tokens per request can launch, before the
        first request: (seconds, None) or (seconds, why it failed). The base compiles nothing."""
        return 0.0, None

    def init_cuda_graph_state(self, max_batch: int, max_tokens: int) -> None:
        raise NotImplementedError(f"the {self.name} backend cannot be captured in a CUDA graph")

    def init_forward_metadata_capture_cuda_graph(self, key, batch_size: int, max_draft: int, batch: ForwardBatch,
                                                 *, uniform: bool = False) -> None:
        """Capture-time metadata for bucket ``key``. ``uniform``: split every request's keys in one
        chunk length, so the graph can plan on the device at any batch size (a drafter's steps:
        their plan decides only drafts, and their entries are one request's equal chains)."""
        raise NotImplementedError(f"the {self.name} backend cannot be captured in a CUDA graph")

    def init_forward_metadata_replay_cuda_graph(self, key, batch: ForwardBatch) -> None:
        raise NotImplementedError(f"the {self.name} backend cannot be captured in a CUDA graph")

    def plans_on_device(self, key) -> bool:
        """Whether ``key``'s graph plans its attention itself (the base plans nothing: no graphs)."""
        return False

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        raise NotImplementedError

    def forward_verify(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        raise NotImplementedError

    def forward_absorbed(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """Decode or verify by ``batch.mode``, timed by ``self.timer`` when it is enabled."""
        self.timer.start()
        if batch.mode == "decode":
            out = self.forward_decode(q, layer, batch)
        elif batch.mode == "verify":
            out = self.forward_verify(q, layer, batch)
        else:
            raise ValueError(f"Expected a decode or verify batch, got mode {batch.mode!r}")
        self.timer.stop()
        return out

    def forward_extend(
        self, q_nope: torch.Tensor, q_rope: torch.Tensor, layer: int, batch: ForwardBatch, kv_b_proj: torch.Tensor, v_head_dim: int
    ) -> torch.Tensor:
        """Causal prefill over each request's cached rows (its new rows already written).

        q_nope: [N, H, nope]; q_rope: [N, H, rope] (roped); kv_b_proj: [H * (nope + v), kv_lora_rank].
        Returns [N, H, v_head_dim] in q's dtype.
        """
        self.timer.start()
        n, h, nope = q_nope.shape
        r = self.kv_lora_rank
        out = torch.empty(n, h, v_head_dim, dtype=q_nope.dtype, device=q_nope.device)
        rows_all = self.pool.layer(layer)
        qo, kv = batch.qo_indptr_host.tolist(), batch.kv_indptr_host.tolist()  # host copies: no sync
        for b in range(batch.batch_size):
            slots = batch.kv_indices[kv[b] : kv[b + 1]].long()
            rows = rows_all[slots].to(q_nope.dtype)  # [L, r + rope]
            length = rows.shape[0]
            kv_full = (rows[:, :r] @ kv_b_proj.T).view(length, h, nope + v_head_dim)  # every row: see the Decisions
            k_rope = rows[:, None, r:].expand(length, h, rows.shape[1] - r)
            k = torch.cat([kv_full[..., :nope], k_rope], dim=-1)  # [L, H, qk]
            q = torch.cat([q_nope[qo[b] : qo[b + 1]], q_rope[qo[b] : qo[b + 1]]], dim=-1)  # [T, H, qk]
            causal_prefill(q.transpose(0, 1), k.transpose(0, 1), kv_full[..., nope:].transpose(0, 1), length - q.shape[0],
                           self.sm_scale, self.prefill_method, out=out[qo[b] : qo[b + 1]].transpose(0, 1))  # v unpadded, no mask
        self.timer.stop()
        return out


class ReferenceBackend(AttentionBackend):
    """Decode and verify through the engine's float32 path (``serving.attention.dense``),
    per request with host-side lengths (no device sync); not capturable (shapes follow lengths)."""

    name = "reference"

    def _attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch, tree_mask) -> torch.Tensor:
        n = sum(batch.qo_lens)
        if tree_mask is not None:
            tree_mask = tree_mask[: sum(t * t for t in batch.qo_lens)]
        q_in = q.to(self.pool.dtype) if self.pool.dtype != torch.float32 else q  # the rows' precision, as the kernel sees q
        out = latent_attention(
            q_in[:n], self.pool.layer(layer), batch.qo_indptr_host.tolist(), batch.kv_indptr_host.tolist(), batch.kv_indices,
            tree_mask, self.sm_scale, self.kv_lora_rank, self.pool.dtype,
        ).to(q.dtype)
        return out if n == q.shape[0] else torch.cat([out, q.new_zeros((q.shape[0] - n,) + out.shape[1:])])

    def forward_decode(self, q, layer, batch):
        return self._attend(q, layer, batch, None)

    def forward_verify(self, q, layer, batch):
        return self._attend(q, layer, batch, batch.tree_mask)


class KernelBackend(AttentionBackend):
    """Decode and verify through the MLA verify kernel: one plan per step, one run per layer.

    Graphs: each captured bucket (a ``key``) has its own ``MLAVerifyWrapper(use_cuda_graph=True)``
    with a workspace sized for the bucket's batch size and widest entry; replay re-plans the
    real batch into it (no recapture).
    """

    name = "kernel"
    supports_cuda_graph = True

    def __init__(self, pool: KVPool, num_heads: int, kv_lora_rank: int, sm_scale: float,
                 pinned_tiles: tuple[int, int] | None = None) -> None:
        super().__init__(pool, num_heads, kv_lora_rank, sm_scale)
        if pool.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"Expected a bf16 or fp16 KV pool for the kernel backend, got {pool.dtype}")
        if pinned_tiles is None:
            self.wrapper = MLAVerifyWrapper(self.device)
        else:  # every step planned as a graph workspace of (batch, width) plans it, without graphs
            self.wrapper = self._graph_wrapper(*pinned_tiles)
        self._graph_wrappers: dict = {}
        self._graph_workspaces: dict = {}
        self._device_planned: set = set()  # keys whose graphs plan their own attention (kernel.device_plan)
        self._active = None  # the wrapper the step's layers run
        self._plans_in_step = False  # the active wrapper is planned inside the step, on the device

    def _plan(self, wrapper: MLAVerifyWrapper, batch: ForwardBatch, schedule: str | None = None) -> None:
        # The host copies: plan() reads the lengths with .tolist(), a device sync on the device tensors.
        wrapper.plan(
            batch.qo_indptr_host, batch.kv_indptr_host, self.num_heads, head_dim=self.pool.kv.shape[-1],
            v_head_dim=self.kv_lora_rank, dtype=self.pool.dtype, schedule=schedule,
        )
        self._active = wrapper

    def warmup(self, max_tokens: int) -> tuple[float, str | None]:
        """Every variant a plan can dispatch, captured or eager (a step no bucket holds must not
        compile either), compiled in parallel threads (``kernel.warmup``): captures then find them
        compiled instead of compiling them one after another. A failure is reported, not raised:
        the first launch would compile what it needs."""
        import time

        from kernel import warmup

        t0 = time.perf_counter()
        try:
            warmup(self.device, self.num_heads, max_tokens, self.pool.kv.shape[-1], self.kv_lora_rank, self.pool.dtype,
                   use_cuda_graph=None)
        except (RuntimeError, ValueError) as exc:
            return time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"
        return time.perf_counter() - t0, None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self._active, self._plans_in_step = None, False
        if batch.mode in ("decode", "verify"):
            self._plan(self.wrapper, batch)

    def init_forward_metadata_in_step(self, batch: ForwardBatch) -> None:
        if self._plans_in_step:
            self._active.plan_on_device(batch.qo_indptr, batch.kv_indptr)

    def init_cuda_graph_state(self, max_batch: int, max_tokens: int) -> None:
        self._graph_wrappers.clear()
        self._graph_workspaces.clear()
        self._device_planned.clear()

    def _graph_wrapper(self, batch_size: int, max_draft: int) -> MLAVerifyWrapper:
        workspace = MLAVerifyWrapper(self.device).allocate_workspace(
            max_batch=batch_size, max_draft=max_draft, num_heads=self.num_heads, head_dim=self.pool.kv.shape[-1],
            v_head_dim=self.kv_lora_rank, use_cuda_graph=True,
        )
        return MLAVerifyWrapper(self.device, workspace=workspace, use_cuda_graph=True)

    def init_forward_metadata_capture_cuda_graph(self, key, batch_size: int, max_draft: int, batch: ForwardBatch,
                                                 *, uniform: bool = False) -> None:
        wrapper = self._graph_wrapper(batch_size, max_draft)
        self._graph_wrappers[key], self._graph_workspaces[key] = wrapper, wrapper.workspace
        # Pins the path and tiles the graph's kernels are captured with (and the schedule, if named).
        self._plan(wrapper, batch, "uniform" if uniform else None)
        if wrapper.plans_on_device:
            self._device_planned.add(key)
        self._plans_in_step = key in self._device_planned

    def init_forward_metadata_replay_cuda_graph(self, key, batch: ForwardBatch) -> None:
        if key in self._device_planned:  # the graph plans its own attention: nothing on the host
            self._active, self._plans_in_step = self._graph_wrappers[key], True
        else:
            self._plan(self._graph_wrappers[key], batch)
            self._plans_in_step = False

    def plans_on_device(self, key) -> bool:
        """Whether ``key``'s graph plans its attention itself (on the device, every replay)."""
        return key in self._device_planned

    def plan_matches(self, qo_lens: list[int], kv_lens: list[int]) -> bool:
        """Whether the plan the step's layers run is the one made for these lengths: the host plan's
        lengths, or for a graph that plans on the device its metadata read back (a device sync)
        against the host's plan of the lengths, bit for bit."""
        if self._active is None:
            return False
        if not self._plans_in_step:
            planned = self._active.planned
            return planned is not None and (planned.qo_lens, planned.kv_lens) == (list(qo_lens), list(kv_lens))
        return self._active.device_plan_matches(qo_lens, kv_lens)

    @property
    def active_plan(self):
        """The plan the step's layers run (``kernel.plan.MLAVerifyPlan``), None before one."""
        return None if self._active is None else self._active.planned

    def graph_workspace_bytes(self) -> dict:
        """Device bytes of each bucket's workspace (partials and metadata)."""
        return {key: sum(t.numel() * t.element_size() for t in (ws.partial_o, ws.partial_lse, ws.metadata))
                for key, ws in self._graph_workspaces.items()}

    def _run(self, q, layer, batch, tree_mask):
        if self._active is None:
            raise ValueError("Expected init_forward_metadata(batch) before the step's attention, got none")
        out = self._active.run(q.to(self.pool.dtype).contiguous(), self.pool.layer(layer), batch.kv_indices, tree_mask, self.sm_scale)
        return out.to(q.dtype)

    def forward_decode(self, q, layer, batch):
        return self._run(q, layer, batch, None)

    def forward_verify(self, q, layer, batch):
        return self._run(q, layer, batch, batch.tree_mask)


