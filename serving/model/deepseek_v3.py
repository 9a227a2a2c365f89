"""DeepSeek-V3 (MLA + dense MLP / MoE) forward over a ForwardBatch and a KV pool.

Math and tensor names follow transformers' ``modeling_deepseek_v3`` (without importing it).

Decisions:
- Each layer writes its new latent rows ``[kv_a_layernorm(c_kv), rope(k_rope)]`` into the
  pool first, then attends: extend in the non-absorbed form (per-head K/V expanded through
  ``kv_b_proj``), decode and verify in the absorbed form (q_nope through W_UK into the latent
  space, attention over latent rows, output through W_UV).
- ``num_layers`` runs only the first layers and then the final norm and head: the
  layer-skip drafter is the target's own first layers (same weights, same pool rows).
- DeepSeek's multi-token-prediction (MTP) module, when the checkpoint has one, is block
  ``num_hidden_layers`` (``mtp_forward``): its latent rows are the pool's last layer, so the
  pool's slots, the slot table, defrag moves and graph capture cover them like any layer's.
- MoE routing is transformers' ``DeepseekV3TopkRouter`` (sigmoid scores,
  ``e_score_correction_bias`` for choice only, group-limited top-k, ``norm_topk_prob``,
  ``routed_scaling_factor``) with float32 router math.
- ``forward`` only queues device work: planning, copies and the rope tables' size are the
  model runner's job before it, so a decode or verify forward can be captured in a CUDA
  graph. Its experts therefore run densely (every expert over every row, weighted by a
  dense routing matrix that is zero where a row did not choose the expert): no host sync,
  fixed shapes, and it reads every expert's weights once, which a decode batch touching
  most experts does anyway. Prefill (extend, never captured) groups rows by expert, which
  needs the expert list on the host (one sync per MoE layer).
- Block-FP8 checkpoints: a projection may be a ``fp8.BlockFP8Weight`` (kept FP8 on CUDA) and
  every projection runs through ``gemm.linear`` / ``gemm.expert_matmul``. ``kv_b_proj`` is
  dequantized once here: its absorbed W_UK / W_UV and the extend path's per-head expansion
  are dense. Fused and stacked weights stay FP8 where their parts end on block boundaries
  (``fp8.cat_rows``).
- Tensor parallelism (``tp``, see ``serving.parallel.group`` and ``sharding``): a rank holds
  its heads, its share of every MLP's intermediate dim, its experts and its vocab rows of the
  head; attention and MLP outputs are partial sums, all-reduced once each per layer, and the
  logits are gathered. Without ``tp`` every collective is the identity.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from serving.attention.backends import AttentionBackend
from serving.configs.model import ModelConfig
from serving.kv.batch import ForwardBatch
from serving.kv.pool import KVPool
from serving.model import fused
from serving.model.rope import RotaryEmbedding, softmax_scale
from serving.model.sharded_weights import load_sharded_weights
from serving.model.weights import load_weights, served_config
from serving.parallel.group import TensorParallel
from serving.quant import fp8, gemm

DENSE_EXPERT_ELEMENTS = 1 << 26  # bound on the [experts, rows, 2 * moe_intermediate] temporary of the dense path


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' DeepseekV3RMSNorm: normalize in float32, cast back, then scale (one fused
    kernel for the rows of a CUDA matrix)."""
    if fused.available(x) and x.dim() == 2 and x.stride(-1) == 1:
        return fused.rms_norm(x, weight, eps)
    x32 = x.float()
    x32 = x32 * x32.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()  # in place on the fresh [.., 1] statistics
    return weight * x32.to(x.dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` of ``gate, up = gate_up.chunk(2, -1)`` (one kernel on CUDA)."""
    if fused.available(gate_up) and gate_up.is_contiguous():
        return fused.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def add_rms_norm(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + y), x + y): the residual add and the next norm, fused on CUDA."""
    if fused.available(x) and x.dim() == 2 and x.stride(-1) == 1 and y.stride(-1) == 1 and x.dtype == y.dtype:
        return fused.rms_norm(y, weight, eps, residual=x)
    total = x + y
    return rms_norm(total, weight, eps), total


class DeepseekV3Model:
    """Weights by transformers' names; ``forward`` runs a batch and returns float32 logits.

    weights: name -> tensor (as from ``load_weights``, or this rank's parts of them as from
    ``sharded_weights``), dtype: compute dtype, tp: this rank's tensor-parallel group (None:
    one process). ``cfg`` is the checkpoint's; ``num_local_heads`` the heads this rank computes.
    """

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], device: torch.device | str, dtype: torch.dtype,
                 tp: TensorParallel | None = None) -> None:
        self.cfg = cfg
        self.w = weights
        self.device = torch.device(device)
        self.dtype = dtype
        self.tp = tp or TensorParallel(device=self.device)
        self.num_local_heads = len(self.tp.heads(cfg.num_attention_heads))
        self.local_experts = self.tp.experts(cfg.n_routed_experts)
        self.rope = RotaryEmbedding(cfg, self.device)
        self.sm_scale = softmax_scale(cfg)
        h, nope, v = self.num_local_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
        self.w_uk: list[torch.Tensor] = []  # [local heads, nope, r] per layer
        self.w_uv: list[torch.Tensor] = []  # [local heads, v, r] per layer
        self.experts: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i in range(cfg.block_layers):
            name = f"model.layers.{i}.self_attn.kv_b_proj.weight"
            weights[name] = fp8.dense(weights[name], dtype)  # once: the absorbed forms and the extend path need it dense
            kvb = weights[name].view(h, nope + v, cfg.kv_lora_rank)
            self.w_uk.append(kvb[:, :nope].contiguous())
            self.w_uv.append(kvb[:, nope:].contiguous())
            if cfg.is_moe_layer(i):
                m = f"model.layers.{i}.mlp.experts."
                gate_up = fp8.stack([fp8.cat_rows([weights[f"{m}{e}.gate_proj.weight"], weights[f"{m}{e}.up_proj.weight"]], dtype)
                                     for e in self.local_experts], dtype)
                down = fp8.stack([weights[f"{m}{e}.down_proj.weight"] for e in self.local_experts], dtype)
                for e in self.local_experts:
                    for part in ("gate_proj", "up_proj", "down_proj"):
                        del weights[f"{m}{e}.{part}.weight"]
                self.experts[i] = (gate_up, down)
        # This rank's vocab rows (untied: already its part of lm_head.weight).
        self.lm_head = self.tp.vocab_rows(weights["model.embed_tokens.weight"], cfg.vocab_size) if cfg.tie_word_embeddings \
            else weights["lm_head.weight"]
        if cfg.has_mtp:
            m = f"model.layers.{cfg.mtp_layer}."
            # The module's own copy of the embeddings when the checkpoint has one (DeepSeek-V3's does).
            self.mtp_embed = weights.get(m + "embed_tokens.weight", weights["model.embed_tokens.weight"])
        # Projections of the same input as one matrix (one GEMM launch instead of two, the same
        # bytes read); the named weights become views of it.
        self.fused: dict[str, torch.Tensor | fp8.BlockFP8Weight] = {}
        for i in range(cfg.block_layers):
            a = f"model.layers.{i}.self_attn."
            if cfg.q_lora_rank is not None and not cfg.attention_bias:
                self._fuse(a + "q_a_kv_a", [a + "q_a_proj.weight", a + "kv_a_proj_with_mqa.weight"])
            for m in (f"model.layers.{i}.mlp.", f"model.layers.{i}.mlp.shared_experts."):
                if m + "gate_proj.weight" in weights:
                    self._fuse(m + "gate_up", [m + "gate_proj.weight", m + "up_proj.weight"])

    def _fuse(self, name: str, parts: list[str]) -> None:
        """Concatenate the weights ``parts`` (rows) into ``self.fused[name]`` and rebind each to its view."""
        whole = fp8.cat_rows([self.w[p] for p in parts], self.dtype)
        start = 0
        for p in parts:
            rows = self.w[p].shape[0]
            self.w[p] = whole.row_slice(start, start + rows) if isinstance(whole, fp8.BlockFP8Weight) else whole[start : start + rows]
            start += rows
        self.fused[name] = whole

    @staticmethod
    def from_folder(folder: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                    tp: TensorParallel | None = None, keep_fp8: bool | None = None) -> "DeepseekV3Model":
        """Load ``folder``; with ``tp``, only this rank's parts of the tensors (every rank calls it).
        keep_fp8: hold block-FP8 projections as FP8 (default: on CUDA; else dequantized at load)."""
        cfg = served_config(folder, ModelConfig.from_folder(folder))
        if tp is None:
            return DeepseekV3Model(cfg, load_weights(folder, cfg, dtype, torch.device(device), keep_fp8), device, dtype)
        return DeepseekV3Model(cfg, load_sharded_weights(folder, cfg, dtype, torch.device(device), tp, keep_fp8), device, dtype, tp)

    @property
    def num_layers(self) -> int:
        return self.cfg.num_hidden_layers

    @property
    def has_mtp(self) -> bool:
        return self.cfg.has_mtp

    @property
    def pool_layers(self) -> int:
        """Layers of latent rows a pool for this model holds: the target's, then the MTP module's."""
        return self.cfg.block_layers

    def new_pool(self, num_slots: int, dtype: torch.dtype | None = None, max_requests: int = 256,
                 max_context: int | None = None) -> KVPool:
        """A pool with one row of ``latent_dim`` per slot for every layer; its slot table holds
        ``max_requests`` requests of up to ``max_context`` tokens (default: the pool's slots, at
        most ``max_position_embeddings``)."""
        context = max_context or min(num_slots, self.cfg.max_position_embeddings)
        return KVPool(self.pool_layers, num_slots, self.cfg.latent_dim, dtype or self.dtype, self.device,
                      max_requests=max_requests, max_context=context)

    # ---- layers -------------------------------------------------------------------------

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return gemm.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    def _attention(self, x: torch.Tensor, i: int, batch: ForwardBatch, pool: KVPool, backend: AttentionBackend, rope_tables) -> torch.Tensor:
        cfg, p = self.cfg, f"model.layers.{i}.self_attn."
        n, heads, nope, rope_dim, r = x.shape[0], self.num_local_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
        both = self.fused.get(p + "q_a_kv_a")
        if both is not None:  # q's down-projection and the latent row in one GEMM
            q_latent_rows = gemm.linear(x, both)
            q_a, latent = q_latent_rows[:, : cfg.q_lora_rank], q_latent_rows[:, cfg.q_lora_rank :]
            q = self._linear(rms_norm(q_a, self.w[p + "q_a_layernorm.weight"], 1e-6), p + "q_b_proj")
        else:
            if cfg.q_lora_rank is None:
                q = self._linear(x, p + "q_proj")
            else:
                q = self._linear(rms_norm(self._linear(x, p + "q_a_proj"), self.w[p + "q_a_layernorm.weight"], 1e-6), p + "q_b_proj")
            latent = self._linear(x, p + "kv_a_proj_with_mqa")
        q = q.view(n, heads, nope + rope_dim)
        q_nope, norm_weight = q[..., :nope], self.w[p + "kv_a_layernorm.weight"]
        absorbed = batch.mode != "extend"
        q_in = None  # the absorbed attention's input [N, H, r + rope], when written in place
        if fused.available(x):  # the rotation, the pool row and (absorbed) the input's rope columns in one kernel
            if absorbed:
                q_in = torch.empty((n, heads, r + rope_dim), dtype=q.dtype, device=x.device)
                q_rope = q_in[..., r:]
            else:
                q_rope = torch.empty((n, heads, rope_dim), dtype=q.dtype, device=x.device)
            fused.rope_and_kv_rows(q[..., nope:], q_rope, pool.layer(i), batch.out_slots, latent, r, norm_weight, 1e-6,
                                   *rope_tables, self.rope.interleave)
        else:
            # q's heads and the shared key as one [N, H + 1, rope] tensor: one rotation (same values) instead of two.
            roped = self.rope.apply(torch.cat([q[..., nope:], latent[:, None, r:]], dim=1), batch.positions, rope_tables)
            q_rope, k_rope = roped[:, :heads], roped[:, heads]
            c_kv = rms_norm(latent[:, :r], norm_weight, 1e-6)
            # Slots are distinct, but padding rows all write slot 0.
            pool.layer(i).index_copy_(0, batch.out_slots, torch.cat([c_kv, k_rope], dim=-1).to(pool.dtype))
        if not absorbed:
            out = backend.forward_extend(q_nope, q_rope, i, batch, self.w[p + "kv_b_proj.weight"], cfg.v_head_dim)
        else:
            # Per-head bmm over head-major views: the products einsum would run, without its host-side parsing.
            if q_in is not None:  # into the input's latent columns: its rope columns are written
                torch.bmm(q_nope.transpose(0, 1), self.w_uk[i], out=q_in[..., :r].transpose(0, 1))
            else:
                q_latent = torch.bmm(q_nope.transpose(0, 1), self.w_uk[i]).transpose(0, 1)  # [N, H, r]
                q_in = torch.cat([q_latent, q_rope], dim=-1)
            latent_out = backend.forward_absorbed(q_in, i, batch)  # [N, H, r]
            # into token-major rows [N, H, v], so o_proj reads them as they lie (the head-major
            # product's reshape below would copy them first)
            out = torch.empty((n, heads, cfg.v_head_dim), dtype=latent_out.dtype, device=x.device)
            torch.bmm(latent_out.transpose(0, 1), self.w_uv[i].transpose(1, 2), out=out.transpose(0, 1))
        return self._linear(out.reshape(n, heads * cfg.v_head_dim), p + "o_proj")

    def _block(self, h: torch.Tensor, x: torch.Tensor, i: int, batch: ForwardBatch, pool: KVPool, backend: AttentionBackend,
               rope_tables, grouped: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder block ``i`` on ``h`` (its normed input) over the residual ``x``: returns (the
        MLP's output, ``x`` + the attention's); the caller adds the one to the other with the
        next norm (the next layer's, the final one, or the MTP module's ``shared_head``)."""
        p = f"model.layers.{i}."
        attn = self.tp.all_reduce(self._attention(h, i, batch, pool, backend, rope_tables))
        h, x = add_rms_norm(attn, x, self.w[p + "post_attention_layernorm.weight"], self.cfg.rms_norm_eps)  # x += attn
        mlp = self.tp.all_reduce(self._moe(h, i, grouped) if self.cfg.is_moe_layer(i) else self._mlp(h, p + "mlp."))
        return mlp, x

    def _mlp(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return self._linear(silu_mul(gemm.linear(x, self.fused[prefix + "gate_up"])), prefix + "down_proj")

    def route(self, x: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k experts of each token: (weights fp32 [N, k], indices int64 [N, k])."""
        cfg, p = self.cfg, f"model.layers.{i}.mlp.gate."
        scores = F.linear(x.float(), self.w[p + "weight"].float()).sigmoid()
        choice = scores + self.w[p + "e_score_correction_bias"]
        e, g = cfg.n_routed_experts, cfg.n_group
        group_scores = choice.view(-1, g, e // g).topk(min(2, e // g), dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=cfg.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, g, e // g).reshape(-1, e)
        choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
        idx = torch.topk(choice, k=cfg.num_experts_per_tok, dim=-1, sorted=False)[1]
        weights = scores.gather(1, idx)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * cfg.routed_scaling_factor, idx

    def _moe(self, x: torch.Tensor, i: int, grouped: bool) -> torch.Tensor:
        """Routed experts plus shared ones. ``grouped``: rows gathered per chosen expert (one
        host sync); else every expert over every row (capture-safe, see the module docstring)."""
        weights, idx = self.route(x, i)
        gate_up, down = self.experts[i]  # this rank's experts: self.local_experts
        first = self.local_experts.start
        if grouped:
            out = torch.zeros_like(x)
            for e in torch.unique(idx).tolist():
                if e not in self.local_experts:
                    continue
                token, slot = torch.where(idx == e)
                y = gemm.linear(silu_mul(gemm.linear(x[token], gate_up[e - first])), down[e - first]) * weights[token, slot, None]
                out.index_add_(0, token, y.to(out.dtype))
        else:
            dense = torch.zeros(x.shape[0], self.cfg.n_routed_experts, dtype=weights.dtype, device=x.device).scatter_(1, idx, weights)
            dense = dense[:, first : first + gate_up.shape[0]]
            out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
            group = max(1, DENSE_EXPERT_ELEMENTS // max(1, x.shape[0] * gate_up.shape[1]))
            for e0 in range(0, gate_up.shape[0], group):
                e1 = min(gate_up.shape[0], e0 + group)
                y = gemm.expert_matmul(silu_mul(gemm.expert_matmul(x, gate_up[e0:e1])), down[e0:e1])  # [G, N, hidden]
                out += (y.float() * dense[:, e0:e1].T[:, :, None]).sum(0)
            out = out.to(x.dtype)
        if self.cfg.n_shared_experts:
            out = out + self._mlp(x, f"model.layers.{i}.mlp.shared_experts.")
        return out

    def forward(
        self,
        batch: ForwardBatch,
        pool: KVPool,
        backend: AttentionBackend,
        logits_rows: torch.Tensor | None = None,
        num_layers: int | None = None,
        return_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run the batch; write its latent rows to ``pool``; return float32 logits.

        The attention metadata must be planned (``backend.init_forward_metadata``) and the
        rope tables must cover the batch's positions (``rope.ensure``) beforehand: this only
        queues device work (apart from an extend batch's expert grouping).
        logits_rows: int64 [M] rows of the batch to compute logits for (default: all N).
        num_layers: run only the first ``num_layers`` layers (default: all).
        Returns float32 [M, vocab_size]; with ``return_hidden`` also the final-normed hidden
        states of every row [N, hidden] (the MTP module's input, as SGLang and vLLM feed it).
        """
        cfg = self.cfg
        grouped = batch.kind == "extend"
        x = self.w["model.embed_tokens.weight"].index_select(0, batch.input_ids)
        rope_tables = self.rope.tables(batch.positions, x.dtype)
        layers = num_layers or cfg.num_hidden_layers
        h = rms_norm(x, self.w["model.layers.0.input_layernorm.weight"], cfg.rms_norm_eps)
        for i in range(layers):
            mlp, x = self._block(h, x, i, batch, pool, backend, rope_tables, grouped)
            after = f"model.layers.{i + 1}.input_layernorm.weight" if i + 1 < layers else "model.norm.weight"
            if logits_rows is None or i + 1 < layers or return_hidden:
                h, x = add_rms_norm(mlp, x, self.w[after], cfg.rms_norm_eps)  # x += mlp, then the next norm
            else:
                h = rms_norm((x + mlp)[logits_rows], self.w[after], cfg.rms_norm_eps)
        if return_hidden:
            rows = h if logits_rows is None else h[logits_rows]
            return self.tp.gather_vocab(F.linear(rows, self.lm_head), cfg.vocab_size).float(), h
        return self.tp.gather_vocab(F.linear(h, self.lm_head), cfg.vocab_size).float()

    def mtp_forward(self, batch: ForwardBatch, pool: KVPool, backend: AttentionBackend, hidden: torch.Tensor,
                    next_ids: torch.Tensor, logits_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """DeepSeek's multi-token-prediction module over the batch's rows (DeepSeek-V3 report, §2.2).

        Row r at position p pairs ``hidden[r]`` (the target's final-normed state after the token
        at p, or the module's own output when chaining) with ``next_ids[r]`` (the token at p + 1):
        ``eh_proj([enorm(embed(next)); hnorm(hidden)])``, one decoder block whose latent rows go to
        the pool's layer ``mtp_layer`` at the batch's slots, then ``shared_head``. Positions,
        slots, masks and the attention plan are the batch's own.
        Returns (float32 logits of ``logits_rows`` [M, vocab], predicting the token at p + 2; the
        module's normed output [N, hidden], which a chained step takes as its ``hidden``).
        """
        cfg = self.cfg
        i = cfg.mtp_layer
        p = f"model.layers.{i}."
        emb = rms_norm(self.mtp_embed.index_select(0, next_ids), self.w[p + "enorm.weight"], cfg.rms_norm_eps)
        x = gemm.linear(torch.cat([emb, rms_norm(hidden, self.w[p + "hnorm.weight"], cfg.rms_norm_eps)], dim=-1),
                        self.w[p + "eh_proj.weight"])
        rope_tables = self.rope.tables(batch.positions, x.dtype)
        h = rms_norm(x, self.w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        mlp, x = self._block(h, x, i, batch, pool, backend, rope_tables, batch.kind == "extend")
        out, _ = add_rms_norm(mlp, x, self.w[p + "shared_head.norm.weight"], cfg.rms_norm_eps)
        rows = out if logits_rows is None else out[logits_rows]
        head = self.w[p + "shared_head.head.weight"]
        return self.tp.gather_vocab(F.linear(rows, head), cfg.vocab_size).float(), out
