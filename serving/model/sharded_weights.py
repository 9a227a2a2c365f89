"""One rank's part of a DeepSeek-V3 checkpoint: each tensor's shard (``sharding.tensor_shard``)
read through ``safe_open(...).get_slice``, so a rank reads only its rows or columns of a
sharded tensor and none of another rank's experts.

Decisions:
- Every file's header is checked first by ``weights.plan_load``, as for one process, so every
  rank reports the same error for a bad checkpoint before reading data; the memory check
  counts this rank's part (``sharding.rank_config``).
- ``load_sharded_weights`` ends at an agreement point (``TensorParallel.agree``): a rank
  whose read failed alone (a file it cannot read, memory) ends every rank with its message.
- Block-FP8 projections: each rank reads its slice of the weight and the matching slice of
  its scales (``sharding.scale_shard``); the scales are read and checked first, as in
  ``weights.load_weights``.
- Random presets shard the same way (``shard_weights``): a rank draws the full seeded tensors
  and keeps its parts, so a TP=N model holds exactly the TP=1 model's numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from serving.configs.model import ModelConfig
from serving.configs.quantization import weight_of_scale
from serving.model import limits
from serving.model.weights import (
    _FUSED,
    WeightError,
    as_weight,
    default_keep_fp8,
    expected_shapes,
    plan_load,
    read_scales,
)
from serving.parallel.group import TensorParallel
from serving.parallel.sharding import (
    Shard,
    check_shardable,
    expert_range,
    pad_rows,
    rank_config,
    scale_shard,
    shard_shape,
    take_shard,
    tensor_shard,
)
from serving.quant.fp8 import BlockFP8Weight


def keeps_fp32(name: str) -> bool:
    """The router's weight and correction bias stay float32 (as in transformers)."""
    return name.endswith("mlp.gate.weight") or name.endswith("e_score_correction_bias")


def take_fp8_shard(w: BlockFP8Weight, shard: Shard) -> BlockFP8Weight:
    """``shard``'s part of a full block-FP8 weight and of its scales (copies)."""
    scales = scale_shard(shard, w.block)
    return BlockFP8Weight(take_shard(w.q, shard).clone(), take_shard(w.scale_inv, scales).clone(), w.block)


def shard_weights(weights: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], cfg: ModelConfig, size: int,
                  rank: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s parts of full tensors (a name -> tensor dict or (name, tensor) pairs, per-expert
    names as ``random_models.random_weights`` draws them); parts are copies, so the full tensors
    can be freed one at a time."""
    check_shardable(cfg, size)
    out = {}
    for name, tensor in weights.items() if isinstance(weights, dict) else weights:
        shard = tensor_shard(name, cfg, size, rank)
        if shard is None:
            continue
        if shard.whole:
            out[name] = tensor
        elif isinstance(tensor, BlockFP8Weight):
            out[name] = take_fp8_shard(tensor, shard)
        else:
            out[name] = take_shard(tensor, shard).clone()
    return out


def _read(view, shard: Shard) -> torch.Tensor:
    """``shard``'s part through a safetensors slice ``view`` (only those bytes are read)."""
    if shard.zeros:
        return torch.zeros(view.get_shape())
    if shard.dim is None:
        return view[:]
    if shard.dim == 0:
        return pad_rows(view[shard.start : shard.stop], shard)
    return view[:, shard.start : shard.stop]


def _split_experts(stored: str, part: torch.Tensor, first: int, inter: int) -> dict[str, torch.Tensor]:
    """Per-expert names of this rank's rows of a fused expert tensor: ``part`` holds experts
    ``first, first + 1, ...`` of ``gate_up_proj`` [E, 2I, hidden] or ``down_proj`` [E, hidden, I]."""
    prefix, kind = _FUSED.match(stored).groups()
    out = {}
    for i in range(part.shape[0]):
        name = f"{prefix}{first + i}."
        if kind == "gate_up_proj":
            out[name + "gate_proj.weight"], out[name + "up_proj.weight"] = part[i, :inter], part[i, inter:]
        else:
            out[name + "down_proj.weight"] = part[i]
    return out


def load_shard(folder: str | Path, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, size: int,
               rank: int, keep_fp8: bool | None = None) -> dict[str, torch.Tensor | BlockFP8Weight]:
    """Rank ``rank`` of ``size``'s parts of ``folder/*.safetensors``: name -> tensor in ``dtype``
    on ``device`` (routers float32), per-expert names for this rank's experts only.

    The checkpoint is checked first as ``weights.load_weights`` checks it (``plan_load``: every
    header, name, shape and dtype), and this rank's part against the device's free memory.
    """
    from safetensors import SafetensorError, safe_open

    check_shardable(cfg, size)
    keep_fp8 = default_keep_fp8(device) if keep_fp8 is None else keep_fp8
    limits.check(limits.estimate(rank_config(cfg, size), device, dtype, keep_fp8=keep_fp8))
    plan = plan_load(folder, cfg)
    experts = expert_range(cfg, size, rank)

    def read_scale(f, info):
        shard = tensor_shard(weight_of_scale(info.name), cfg, size, rank)
        return None if shard is None else _read(f.get_slice(info.name), scale_shard(shard, cfg.quantization.block))

    scales = read_scales(plan, read_scale)
    out: dict[str, torch.Tensor | BlockFP8Weight] = {}
    for path, infos in plan:
        try:
            with safe_open(str(path), framework="pt") as f:
                for info in infos:
                    if weight_of_scale(info.name) is not None:
                        continue  # read above
                    shard = tensor_shard(info.name, cfg, size, rank)
                    if shard is None:
                        continue  # another rank's expert
                    part = _read(f.get_slice(info.name), shard)
                    parts = _split_experts(info.name, part, experts.start, cfg.moe_intermediate_size) if _FUSED.match(info.name) \
                        else {info.name: part}
                    for name, t in parts.items():
                        out[name] = as_weight(name, t, scales, dtype, device, keep_fp8)
                    del part, parts
        except (OSError, SafetensorError) as exc:
            raise WeightError(f"Expected to read the tensors of {path}, got: {exc}") from None
    return out


def load_sharded_weights(folder: str | Path, cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
                         tp: TensorParallel, keep_fp8: bool | None = None) -> dict[str, torch.Tensor | BlockFP8Weight]:
    """``load_shard`` for ``tp``'s rank, then an agreement point: every rank returns, or every
    rank raises (``RankFailed`` naming the ranks that failed and why)."""
    weights, error = {}, None
    try:
        weights = load_shard(folder, cfg, dtype, device, tp.size, tp.rank, keep_fp8)
    except Exception as exc:  # noqa: BLE001 - reported on every rank by agree()
        error = exc
    tp.agree(error, "loading the weights")
    return weights


def expected_shard_shapes(cfg: ModelConfig, size: int, rank: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor rank ``rank`` of ``size`` holds."""
    shapes = {}
    for name, shape in expected_shapes(cfg).items():
        shard = tensor_shard(name, cfg, size, rank)
        if shard is not None:
            shapes[name] = shard_shape(shape, shard)
    return shapes
