"""Tensor-parallel sharding arithmetic: which part of each checkpoint tensor a rank holds.

Pure functions of the config, the tensor name and (rank, size); no process group, no I/O.
``sharded_weights`` reads these parts from safetensors (or slices a random preset's tensors).

Layout over ``size`` ranks (rank ``r`` of ``size``):

- attention: heads ``[r * H/size, (r+1) * H/size)``: rows of ``q_proj`` / ``q_b_proj``
  (``H * qk_head_dim``, head-major) and of ``kv_b_proj`` (``H * (nope + v)``), columns of
  ``o_proj`` (``H * v``); ``o_proj``'s output is a partial sum, all-reduced by the model.
  ``o_proj.bias`` is held by rank 0 and zeros elsewhere, so the all-reduce adds it once.
- dense MLP and shared experts: the intermediate dim (rows of ``gate_proj`` / ``up_proj``,
  columns of ``down_proj``), a partial sum as well.
- routed experts (expert parallelism): experts ``[r * E/size, (r+1) * E/size)`` whole; a rank
  never reads another rank's experts.
- ``lm_head``: vocab rows ``[r * ceil(V/size), ...)``, the last rank's part zero-padded to
  ``ceil(V/size)`` rows so every rank's logits have one shape (the model gathers them).
- block-FP8 projections shard as their dense form does, and their scales with them: a
  weight's rows or columns ``[start, stop)`` take the scale rows or columns
  ``[start / 128, ceil(stop / 128))`` (``scale_shard``). Every boundary must fall on a
  128-block (``check_shardable`` says which dimension does not, with the numbers).
- everything else is replicated: embeddings, norms, ``q_a_proj``, ``kv_a_proj_with_mqa``
  (the latent KV is shared by every head, so every rank computes and caches all of it), the
  router and its correction bias.

Decisions:
- MoE layers use expert parallelism with the routing replicated, not tensor-parallel experts.
  Under tensor-parallel attention every rank already holds every token, so no all-to-all is
  needed: a rank runs its experts over all rows and the layer's one MLP all-reduce (which the
  shared experts need anyway) sums them. Whole experts keep the expert GEMMs at the full
  ``moe_intermediate_size`` (2048 for DeepSeek-V3; TP=8 experts would be 256 wide), the bytes a
  decode step reads are the same (the dense decode path reads every expert once either way),
  and a rank reads none of the other ranks' experts. The cost: prefill's grouped path is only
  as balanced as the routing (decode and verify run every local expert, balanced by design),
  and ``n_routed_experts`` must be a multiple of the ranks (256 over 8).
- ``lm_head`` is vocab-sharded and its logits all-gathered: a decode step reads the whole head
  (1.85 GB of bf16 for DeepSeek-V3, about 0.4 ms at H200 bandwidth), which sharding divides by
  the ranks, and each logit is still one full dot product (no new rounding against TP=1);
  the gather moves ``rows x vocab`` values per step. The embeddings are replicated: a lookup
  reads only the batch's rows, so sharding them would save memory only, at the price of one
  more all-reduce per step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch

from serving.configs.model import ModelConfig

_EXPERT = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.(\d+)\.")
_FUSED_EXPERTS = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.(gate_up_proj|down_proj)$")


@dataclass(frozen=True)
class Shard:
    """How one rank holds one tensor.

    dim: None (the whole tensor), 0 (rows) or 1 (columns); start, stop: the range along ``dim``.
    pad_to: zero-pad the part to this many rows (the vocab-sharded head), None: no padding.
    zeros: hold zeros of the tensor's shape instead of its values (a bias added once, by rank 0).
    """

    dim: int | None = None
    start: int = 0
    stop: int = 0
    pad_to: int | None = None
    zeros: bool = False

    @property
    def whole(self) -> bool:
        return self.dim is None and not self.zeros


WHOLE = Shard()


def even_range(total: int, size: int, rank: int, what: str) -> tuple[int, int]:
    """Rank ``rank``'s ``[start, stop)`` of ``total`` items split evenly over ``size`` ranks;
    ValueError naming ``what`` when ``total`` is not a multiple of ``size``."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"Expected 0 <= rank < size with size >= 1, got rank {rank} of {size}")
    if total % size:
        raise ValueError(f"Expected {what} ({total}) divisible by the tensor-parallel size {size}, got a remainder of {total % size}")
    per = total // size
    return rank * per, (rank + 1) * per


def vocab_range(vocab: int, size: int, rank: int) -> tuple[int, int, int]:
    """(start, stop, rows per rank) of the vocab-sharded head: ``ceil(vocab / size)`` rows per
    rank, the last rank's range cut at ``vocab`` (and its part padded to the same rows)."""
    per = -(-vocab // size)
    start = min(rank * per, vocab)
    return start, min(start + per, vocab), per


def expert_range(cfg: ModelConfig, size: int, rank: int) -> range:
    """The routed experts rank ``rank`` holds (expert parallelism); empty without experts."""
    if not cfg.n_routed_experts:
        return range(0)
    return range(*even_range(cfg.n_routed_experts, size, rank, "n_routed_experts"))


def check_shardable(cfg: ModelConfig, size: int) -> None:
    """ValueError naming the first dimension that ``size`` ranks cannot split evenly (or, for
    block-FP8 weights, not on block boundaries)."""
    even_range(cfg.num_attention_heads, size, 0, "num_attention_heads")
    dense_layers = any(not cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    if dense_layers:
        even_range(cfg.intermediate_size, size, 0, "intermediate_size")
    if cfg.n_routed_experts:
        even_range(cfg.n_routed_experts, size, 0, "n_routed_experts (experts per rank)")
        if cfg.n_shared_experts:
            even_range(cfg.moe_intermediate_size * cfg.n_shared_experts, size, 0,
                       "moe_intermediate_size * n_shared_experts (the shared experts' intermediate size)")
    if cfg.quantization is not None and size > 1:
        check_block_aligned(cfg, size, cfg.quantization.block, dense_layers)


def check_block_aligned(cfg: ModelConfig, size: int, block: int, dense_layers: bool) -> None:
    """ValueError unless every rank's part of each sharded FP8 projection starts and ends on a
    ``block`` boundary (a boundary inside a block would split one scale between two ranks)."""
    heads = cfg.num_attention_heads // size
    q = "q_proj" if cfg.q_lora_rank is None else "q_b_proj"
    parts = [(f"rows of {q} (heads x qk_head_dim = {heads} x {cfg.qk_head_dim})", heads * cfg.qk_head_dim),
             (f"rows of kv_b_proj (heads x (qk_nope_head_dim + v_head_dim) = {heads} x {cfg.qk_nope_head_dim + cfg.v_head_dim})",
              heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)),
             (f"columns of o_proj (heads x v_head_dim = {heads} x {cfg.v_head_dim})", heads * cfg.v_head_dim)]
    if dense_layers:
        parts.append((f"part of intermediate_size ({cfg.intermediate_size} / {size})", cfg.intermediate_size // size))
    if cfg.n_routed_experts and cfg.n_shared_experts:
        shared = shared_intermediate(cfg)
        parts.append((f"part of the shared experts' intermediate size ({shared} / {size})", shared // size))
    for what, per in parts:
        if per % block:
            raise ValueError(f"Expected each rank's {what} to be a multiple of the FP8 block size {block} under "
                             f"tensor-parallel size {size}, got {per}: the shard boundary at {per} cuts a {block}-block "
                             f"({per % block} of its {block} rows or columns on one rank); use a tensor-parallel size "
                             f"that splits on block boundaries")


def scale_shard(shard: Shard, block: int) -> Shard:
    """The part of a weight's block-scale grid that goes with the weight's part ``shard``."""
    if shard.dim is None:
        return shard
    assert shard.start % block == 0 and shard.pad_to is None and not shard.zeros, shard
    return Shard(shard.dim, shard.start // block, -(-shard.stop // block))


def rank_config(cfg: ModelConfig, size: int) -> ModelConfig:
    """The config one rank's memory is estimated from (``limits.estimate``): heads, the dense
    intermediate size and the routed experts divided by ``size``; the shared experts, the
    embeddings and head, the router and the replicated KV pool counted whole (an upper bound)."""
    if size == 1:
        return cfg
    check_shardable(cfg, size)
    experts = cfg.n_routed_experts // size if cfg.n_routed_experts else cfg.n_routed_experts
    return replace(cfg, num_attention_heads=cfg.num_attention_heads // size, intermediate_size=cfg.intermediate_size // size,
                   n_routed_experts=experts)


def shared_intermediate(cfg: ModelConfig) -> int:
    return cfg.moe_intermediate_size * cfg.n_shared_experts


def tensor_shard(name: str, cfg: ModelConfig, size: int, rank: int) -> Shard | None:
    """The part of checkpoint tensor ``name`` (a name of ``weights.expected_shapes``, or a fused
    ``mlp.experts.gate_up_proj`` / ``down_proj`` [E, ...]) that ``rank`` holds; None: none of it
    (another rank's expert)."""
    if size == 1:
        return WHOLE
    heads = even_range(cfg.num_attention_heads, size, rank, "num_attention_heads")
    if name.endswith(("self_attn.q_proj.weight", "self_attn.q_b_proj.weight")):
        return Shard(0, heads[0] * cfg.qk_head_dim, heads[1] * cfg.qk_head_dim)
    if name.endswith("self_attn.kv_b_proj.weight"):
        per = cfg.qk_nope_head_dim + cfg.v_head_dim
        return Shard(0, heads[0] * per, heads[1] * per)
    if name.endswith("self_attn.o_proj.weight"):
        return Shard(1, heads[0] * cfg.v_head_dim, heads[1] * cfg.v_head_dim)
    if name.endswith("self_attn.o_proj.bias"):
        return WHOLE if rank == 0 else Shard(zeros=True)
    fused = _FUSED_EXPERTS.match(name)
    expert = _EXPERT.match(name)
    if fused or expert:
        mine = expert_range(cfg, size, rank)
        if fused:
            return Shard(0, mine.start, mine.stop)
        return WHOLE if int(expert.group(1)) in mine else None
    if ".mlp." in name and name.endswith(("gate_proj.weight", "up_proj.weight", "down_proj.weight")):
        shared = ".shared_experts." in name
        total = shared_intermediate(cfg) if shared else cfg.intermediate_size
        start, stop = even_range(total, size, rank, "the shared experts' intermediate size" if shared else "intermediate_size")
        return Shard(1 if name.endswith("down_proj.weight") else 0, start, stop)
    if name == "lm_head.weight" or name.endswith(".shared_head.head.weight"):  # the MTP module's head too
        start, stop, per = vocab_range(cfg.vocab_size, size, rank)
        return Shard(0, start, stop, pad_to=per)
    return WHOLE


def shard_shape(shape: tuple[int, ...], shard: Shard) -> tuple[int, ...]:
    """The shape of the part ``shard`` takes of a tensor of ``shape``."""
    if shard.dim is None:
        return tuple(shape)
    out = list(shape)
    out[shard.dim] = shard.pad_to if shard.pad_to is not None else shard.stop - shard.start
    return tuple(out)


def take_shard(tensor: torch.Tensor, shard: Shard) -> torch.Tensor:
    """``shard``'s part of a full ``tensor`` (a copy when padded or zeroed, else a view)."""
    if shard.zeros:
        return torch.zeros_like(tensor)
    if shard.dim is None:
        return tensor
    return pad_rows(tensor.narrow(shard.dim, shard.start, shard.stop - shard.start), shard)


def pad_rows(part: torch.Tensor, shard: Shard) -> torch.Tensor:
    """``part`` (the rows a rank read) zero-padded to ``shard.pad_to`` rows."""
    if shard.pad_to is None or part.shape[0] == shard.pad_to:
        return part
    return torch.cat([part, part.new_zeros((shard.pad_to - part.shape[0],) + tuple(part.shape[1:]))])
