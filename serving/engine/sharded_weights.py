"""One rank's part of a DeepSeek-V3 checkpoint: each tensor's shard (``sharding.tensor_shard``)
read through ``safe_open(...).get_slice``, so a rank reads only its rows or columns of a
sharded tensor and none of another rank's experts.

Decisions:
- Every file's header is read first and checked as ``weights.load_weights`` checks a whole
  checkpoint (unexpected, missing and misshaped tensors are a ``WeightError`` naming the
  tensor), so every rank reports the same error for a bad checkpoint before reading data.
- ``load_sharded_weights`` ends at an agreement point (``TensorParallel.agree``): a rank
  whose read failed alone (a file it cannot read, memory) ends every rank with its message.
- Random presets shard the same way (``shard_weights``): a rank draws the full seeded tensors
  and keeps its parts, so a TP=N model holds exactly the TP=1 model's numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from serving.engine.config import ModelConfig
from serving.engine.parallel import TensorParallel
from serving.engine.sharding import Shard, check_shardable, expert_range, pad_rows, shard_shape, take_shard, tensor_shard
from serving.engine.weights import _FUSED, _LAYER, WeightError, expected_shapes


def keeps_fp32(name: str) -> bool:
    """The router's weight and correction bias stay float32 (as in transformers)."""
    return name.endswith("mlp.gate.weight") or name.endswith("e_score_correction_bias")


def shard_weights(weights: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], cfg: ModelConfig, size: int,
                  rank: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s parts of full tensors (a name -> tensor dict or (name, tensor) pairs, per-expert
    names as ``random_models.random_weights`` draws them); parts are copies, so the full tensors
    can be freed one at a time."""
    check_shardable(cfg, size)
    out = {}
    for name, tensor in weights.items() if isinstance(weights, dict) else weights:
        shard = tensor_shard(name, cfg, size, rank)
        if shard is not None:
            out[name] = tensor if shard.whole else take_shard(tensor, shard).clone()
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


def _headers(files: list[Path], cfg: ModelConfig) -> dict[str, tuple[Path, str, tuple[int, ...]]]:
    """Per-expert tensor name -> (file, stored name, stored shape) from the files' headers,
    checked against ``expected_shapes(cfg)`` (fused experts listed once per expert)."""
    from safetensors import safe_open

    expected = expected_shapes(cfg)
    found: dict[str, tuple[Path, str, tuple[int, ...]]] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for stored in f.keys():
                layer = _LAYER.match(stored)
                if layer and int(layer.group(1)) >= cfg.num_hidden_layers:
                    continue  # multi-token-prediction layers: not used for decoding
                shape = tuple(f.get_slice(stored).get_shape())
                fused = _FUSED.match(stored)
                if fused:
                    prefix, kind = fused.groups()
                    want = (cfg.n_routed_experts, 2 * cfg.moe_intermediate_size, cfg.hidden_size) if kind == "gate_up_proj" \
                        else (cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size)
                    if shape != want:
                        raise WeightError(f"Expected {stored} of shape {want}, got {shape}")
                    parts = ("gate_proj", "up_proj") if kind == "gate_up_proj" else ("down_proj",)
                    for e in range(shape[0]):
                        for part in parts:
                            found[f"{prefix}{e}.{part}.weight"] = (path, stored, shape)
                    continue
                if stored not in expected:
                    if stored == "lm_head.weight" and cfg.tie_word_embeddings:
                        continue
                    raise WeightError(f"Expected only tensors of a DeepSeek-V3 model, got unexpected tensor {stored!r} in {path.name}")
                if shape != expected[stored]:
                    raise WeightError(f"Expected {stored} of shape {expected[stored]}, got {shape}")
                found[stored] = (path, stored, shape)
    missing = [n for n in expected if n not in found]
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise WeightError(f"Expected tensor {missing[0]!r} in the checkpoint, got none; missing {missing[:3]}{more}")
    return found


def load_shard(folder: str | Path, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, size: int, rank: int) -> dict[str, torch.Tensor]:
    """Rank ``rank`` of ``size``'s parts of ``folder/*.safetensors``: name -> tensor in ``dtype``
    on ``device`` (routers float32), per-expert names for this rank's experts only."""
    from safetensors import safe_open

    check_shardable(cfg, size)
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise WeightError(f"Expected *.safetensors files in {folder}, got none")
    found = _headers(files, cfg)
    experts = expert_range(cfg, size, rank)
    out: dict[str, torch.Tensor] = {}
    for path in files:
        wanted = {n: stored for n, (p, stored, _) in found.items() if p == path}
        fused_read: dict[str, torch.Tensor] = {}
        with safe_open(str(path), framework="pt") as f:
            for name, stored in wanted.items():
                fused = _FUSED.match(stored)
                if fused is None:
                    shard = tensor_shard(name, cfg, size, rank)
                    if shard is not None:
                        out[name] = _read(f.get_slice(stored), shard).to(device=device, dtype=torch.float32 if keeps_fp32(name) else dtype)
                    continue
                expert = int(name[len(fused.group(1)):].split(".")[0])
                if expert not in experts:
                    continue
                if stored not in fused_read:  # this rank's experts of the fused tensor, read once
                    fused_read[stored] = f.get_slice(stored)[experts.start : experts.stop]
                block = fused_read[stored][expert - experts.start]
                inter = cfg.moe_intermediate_size
                if name.endswith("gate_proj.weight"):
                    block = block[:inter]
                elif name.endswith("up_proj.weight"):
                    block = block[inter:]
                out[name] = block.to(device=device, dtype=dtype)
    return out


def load_sharded_weights(folder: str | Path, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, tp: TensorParallel) -> dict[str, torch.Tensor]:
    """``load_shard`` for ``tp``'s rank, then an agreement point: every rank returns, or every
    rank raises (``RankFailed`` naming the ranks that failed and why)."""
    weights, error = {}, None
    try:
        weights = load_shard(folder, cfg, dtype, device, tp.size, tp.rank)
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
