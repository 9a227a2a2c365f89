"""Reading a DeepSeek-V3 checkpoint (``*.safetensors``, transformers' tensor names) into a flat dict.

Decisions:
- Every expected tensor is listed from the config with its shape before anything is read;
  a missing tensor or a shape mismatch is a ``WeightError`` naming the tensor and both shapes.
- Routed experts are accepted per expert (``mlp.experts.{e}.gate_proj.weight``, as
  DeepSeek's checkpoints and ``save_pretrained`` write them) or fused
  (``mlp.experts.gate_up_proj`` [E, 2I, hidden]); either way the engine holds them fused.
- Layers at or past ``num_hidden_layers`` (DeepSeek's multi-token-prediction layer) are
  skipped; any other tensor the model does not use is an error.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from serving.engine.config import ModelConfig


class WeightError(ValueError):
    """A checkpoint whose tensors do not match its config."""


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape for every tensor the engine needs (experts in per-expert form)."""
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        a = p + "self_attn."
        if cfg.q_lora_rank is None:
            shapes[a + "q_proj.weight"] = (heads * cfg.qk_head_dim, h)
        else:
            shapes[a + "q_a_proj.weight"] = (cfg.q_lora_rank, h)
            shapes[a + "q_a_layernorm.weight"] = (cfg.q_lora_rank,)
            shapes[a + "q_b_proj.weight"] = (heads * cfg.qk_head_dim, cfg.q_lora_rank)
            if cfg.attention_bias:
                shapes[a + "q_a_proj.bias"] = (cfg.q_lora_rank,)
        shapes[a + "kv_a_proj_with_mqa.weight"] = (cfg.latent_dim, h)
        if cfg.attention_bias:
            shapes[a + "kv_a_proj_with_mqa.bias"] = (cfg.latent_dim,)
            shapes[a + "o_proj.bias"] = (h,)
        shapes[a + "kv_a_layernorm.weight"] = (cfg.kv_lora_rank,)
        shapes[a + "kv_b_proj.weight"] = (heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
        shapes[a + "o_proj.weight"] = (h, heads * cfg.v_head_dim)
        m = p + "mlp."
        if cfg.is_moe_layer(i):
            inter = cfg.moe_intermediate_size
            shapes[m + "gate.weight"] = (cfg.n_routed_experts, h)
            shapes[m + "gate.e_score_correction_bias"] = (cfg.n_routed_experts,)
            for e in range(cfg.n_routed_experts):
                shapes[m + f"experts.{e}.gate_proj.weight"] = (inter, h)
                shapes[m + f"experts.{e}.up_proj.weight"] = (inter, h)
                shapes[m + f"experts.{e}.down_proj.weight"] = (h, inter)
            if cfg.n_shared_experts:
                shared = inter * cfg.n_shared_experts
                shapes[m + "shared_experts.gate_proj.weight"] = (shared, h)
                shapes[m + "shared_experts.up_proj.weight"] = (shared, h)
                shapes[m + "shared_experts.down_proj.weight"] = (h, shared)
        else:
            shapes[m + "gate_proj.weight"] = (cfg.intermediate_size, h)
            shapes[m + "up_proj.weight"] = (cfg.intermediate_size, h)
            shapes[m + "down_proj.weight"] = (h, cfg.intermediate_size)
    return shapes


_FUSED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _split_fused(name: str, tensor: torch.Tensor, inter: int) -> dict[str, torch.Tensor]:
    """Fused expert tensors -> per-expert names (gate_up_proj [E, 2I, H], down_proj [E, H, I])."""
    prefix, kind = _FUSED.match(name).groups()
    out = {}
    for e in range(tensor.shape[0]):
        if kind == "gate_up_proj":
            if tensor.shape[1] != 2 * inter:
                raise WeightError(f"Expected {name} of shape [E, {2 * inter}, hidden], got {tuple(tensor.shape)}")
            out[f"{prefix}{e}.gate_proj.weight"] = tensor[e, :inter]
            out[f"{prefix}{e}.up_proj.weight"] = tensor[e, inter:]
        else:
            out[f"{prefix}{e}.down_proj.weight"] = tensor[e]
    return out


def load_weights(folder: str | Path, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """All tensors of ``folder/*.safetensors`` checked against ``expected_shapes(cfg)``.

    Returns name -> tensor in ``dtype`` on ``device`` (routers stay float32, as in transformers).
    """
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise WeightError(f"Expected *.safetensors files in {folder}, got none")
    expected = expected_shapes(cfg)
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                layer = _LAYER.match(name)
                if layer and int(layer.group(1)) >= cfg.num_hidden_layers:
                    continue  # multi-token-prediction layers: not used for decoding
                if _FUSED.match(name):
                    tensors.update(_split_fused(name, f.get_tensor(name), cfg.moe_intermediate_size))
                    continue
                if name not in expected:
                    if name == "lm_head.weight" and cfg.tie_word_embeddings:
                        continue
                    raise WeightError(f"Expected only tensors of a DeepSeek-V3 model, got unexpected tensor {name!r} in {path.name}")
                tensors[name] = f.get_tensor(name)
    missing = [n for n in expected if n not in tensors]
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise WeightError(f"Expected tensor {missing[0]!r} in the checkpoint, got none; missing {missing[:3]}{more}")
    out = {}
    for name, shape in expected.items():
        t = tensors[name]
        if tuple(t.shape) != shape:
            raise WeightError(f"Expected {name} of shape {shape}, got {tuple(t.shape)}")
        keep_fp32 = name.endswith("mlp.gate.weight") or name.endswith("e_score_correction_bias")
        out[name] = t.to(device=device, dtype=torch.float32 if keep_fp32 else dtype)
    return out
