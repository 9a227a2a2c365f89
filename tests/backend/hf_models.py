"""Tiny DeepSeek-V3 checkpoints written by transformers, the engine's independent oracle."""

from __future__ import annotations

from pathlib import Path

import torch

TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
    v_head_dim=16, q_lora_rank=None, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
    topk_group=1, routed_scaling_factor=2.5, first_k_dense_replace=1, max_position_embeddings=256,
)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64,
            mscale=1.0, mscale_all_dim=1.0, beta_fast=32, beta_slow=1)


def save_tiny(folder: Path, seed: int = 0, rope: dict | None = None, peaky: bool = True, **overrides) -> Path:
    """Save a random tiny DeepseekV3ForCausalLM with transformers; return the folder.

    peaky: redraw the weights with unit gain and a scaled head (logits spread by a few units)
    so greedy decoding is decisive; the saved checkpoint is what transformers reads back.
    """
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from serving.configs.model import ModelConfig
    from serving.model.presets import random_weights

    torch.manual_seed(seed)
    params = dict(TINY, **overrides)
    params["rope_parameters"] = rope if rope is not None else dict(YARN)
    cfg = DeepseekV3Config(**params)
    DeepseekV3ForCausalLM(cfg).save_pretrained(folder)
    if peaky:
        import json

        engine_cfg = ModelConfig.from_dict(json.loads((folder / "config.json").read_text()))
        save_file({k: v.contiguous() for k, v in random_weights(engine_cfg, seed).items()}, str(folder / "model.safetensors"))
    return folder


def load_hf(folder: Path):
    from transformers import DeepseekV3ForCausalLM

    model = DeepseekV3ForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    return model


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, attention_mask=torch.ones_like(ids),
                             pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def hf_generate(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy ``generate`` with the model folder's own generation settings (its eos ids included)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, attention_mask=torch.ones_like(ids))
    return out[0, len(prompt):].tolist()
