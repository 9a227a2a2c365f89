"""Seeded random DeepSeek-V3 models, so the engine and its gates run with no download.

Presets: ``tiny`` (CPU and Triton's interpreter: 48-wide latent rows, 2 layers, one MoE
layer), ``gpu-h16`` and ``gpu-h128`` (576-wide latent rows as in DeepSeek-V3, 16 and 128
heads, q LoRA, yarn rope), and ``dsv3-tp8`` (one tensor-parallel rank of DeepSeek-V3 under
TP=8: 61 layers, hidden 7168, 16 of its 128 heads, q LoRA 1536, kv LoRA 512, its MLP width
split eight ways as a dense MLP of 2304, a 32000-token vocabulary: 11.4 GB of bf16 weights), and
``dsv3-tp8-fp8``, the same rank with DeepSeek's block-FP8 projections (6.2 GB), and
``tiny-fp8``, ``tiny`` so quantized (its dims are under one 128-block: every block partial).

Decisions:
- Projections are drawn with unit gain (std 1/sqrt(fan_in)) so attention moves the residual
  stream, and the head is scaled so logits spread by a few units: a random model with
  near-flat logits would make greedy decoding a coin toss under any rounding difference.
- Models of more than ``DEVICE_DRAW_PARAMS`` parameters are drawn on their device (seeded per
  tensor), not on the CPU in float32: ``dsv3-tp8`` would need 23 GB of host memory and minutes.
  Their weights then depend on the device type as well as the seed.
- A preset with a ``quantization_config`` draws the same tensors and quantizes each projection
  ``quantization.quantizable`` names to block FP8 (``fp8.quantize``, DeepSeek's amax / 448
  scales); it is kept FP8 on CUDA and dequantized on the CPU, as a checkpoint would be.
"""

from __future__ import annotations

import math

import torch

from serving.configs.model import ModelConfig
from serving.configs.quantization import quantizable
from serving.model import limits
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.model.sharded_weights import shard_weights
from serving.model.weights import default_keep_fp8, expected_shapes
from serving.parallel.group import TensorParallel
from serving.quant import fp8

# DeepSeek-V3's rope: yarn from 4k positions, factor 40 (the GPU presets' long contexts).
DSV3_YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                 mscale=1.0, mscale_all_dim=1.0, beta_fast=32, beta_slow=1)

# DeepSeek-V3's own quantization_config.
FP8_CONFIG = dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic", weight_block_size=[128, 128])

PRESETS: dict[str, dict] = {
    "tiny": dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
        q_lora_rank=None, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
        routed_scaling_factor=2.5, first_k_dense_replace=1, max_position_embeddings=4096,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=256,
                             mscale=1.0, mscale_all_dim=1.0, beta_fast=32, beta_slow=1),
    ),
    "gpu-h16": dict(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=16, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        q_lora_rank=1536, n_routed_experts=None, first_k_dense_replace=4, max_position_embeddings=262144,
        rope_parameters=DSV3_YARN,
    ),
    "dsv3-tp8": dict(
        vocab_size=32000, hidden_size=7168, intermediate_size=2304, moe_intermediate_size=2048, num_hidden_layers=61,
        num_attention_heads=16, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        q_lora_rank=1536, n_routed_experts=None, first_k_dense_replace=61, max_position_embeddings=262144,
        rope_parameters=DSV3_YARN,
    ),
    "dsv3-tp8-fp8": dict(
        vocab_size=32000, hidden_size=7168, intermediate_size=2304, moe_intermediate_size=2048, num_hidden_layers=61,
        num_attention_heads=16, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        q_lora_rank=1536, n_routed_experts=None, first_k_dense_replace=61, max_position_embeddings=262144,
        rope_parameters=DSV3_YARN, quantization_config=FP8_CONFIG,
    ),
    "gpu-h128": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, moe_intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=128, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        q_lora_rank=1536, n_routed_experts=None, first_k_dense_replace=4, max_position_embeddings=262144,
        rope_parameters=DSV3_YARN,
    ),
}
# tiny with block-FP8 projections, for the FP8 profiles' CPU runs (every scale block is partial)
PRESETS["tiny-fp8"] = dict(PRESETS["tiny"], quantization_config=FP8_CONFIG)

LOGIT_SPREAD = 4.0  # std of a random model's logits
DEVICE_DRAW_PARAMS = 1 << 30


def preset_config(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"Expected a random-model preset in {sorted(PRESETS)}, got {name!r}")
    raw = dict(PRESETS[name], architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3")
    raw.update(overrides)
    return ModelConfig.from_dict({k: v for k, v in raw.items() if v is not None or k == "q_lora_rank"})


def _draw(name: str, shape: tuple[int, ...], gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """One seeded float32 tensor of ``random_weights``' distribution for ``name``."""
    if name.endswith("norm.weight"):
        return torch.ones(shape, device=device)
    if name.endswith("e_score_correction_bias") or name.endswith(".bias"):
        return torch.randn(shape, generator=gen, device=device) * 0.01
    if name == "model.embed_tokens.weight":
        return torch.randn(shape, generator=gen, device=device)
    if name == "lm_head.weight":
        return torch.randn(shape, generator=gen, device=device) * (LOGIT_SPREAD / math.sqrt(shape[1]))
    return torch.randn(shape, generator=gen, device=device) / math.sqrt(shape[-1])


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """float32 CPU tensors for every name of ``expected_shapes(cfg)``."""
    gen = torch.Generator().manual_seed(seed)
    return {name: _draw(name, shape, gen, torch.device("cpu")) for name, shape in expected_shapes(cfg).items()}


def _keeps_fp32(name: str) -> bool:
    return name.endswith("mlp.gate.weight") or name.endswith("e_score_correction_bias")


def _as_held(name: str, w: torch.Tensor, cfg: ModelConfig, dtype: torch.dtype, keep_fp8: bool) -> torch.Tensor | fp8.BlockFP8Weight:
    """A float32 draw as the model holds it: block FP8 for a quantized preset's projections
    (kept, or dequantized into ``dtype``), float32 routers, else ``dtype``."""
    if cfg.quantization is not None and quantizable(name):
        q = fp8.quantize(w, cfg.quantization.block)
        return q if keep_fp8 else q.dequantize(dtype)
    return w.to(torch.float32 if _keeps_fp32(name) else dtype)


def random_model(name: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0,
                 tp: TensorParallel | None = None, **overrides) -> DeepseekV3Model:
    """A seeded random model of preset ``name`` (config fields may be overridden); MemoryLimitError
    when its weights would not fit ``device``. With ``tp``, this rank's parts of the same tensors
    (``sharded_weights.shard_weights``; the memory check counts the whole model, which a rank
    draws one tensor at a time)."""
    cfg = preset_config(name, **overrides)
    device = torch.device(device)
    on_device = limits.count_parameters(cfg).total > DEVICE_DRAW_PARAMS and device.type == "cuda"
    keep_fp8 = cfg.quantization is not None and default_keep_fp8(device)
    limits.check(limits.estimate(cfg, device, dtype, random_weights=not on_device, keep_fp8=keep_fp8))  # before drawing or listing anything
    if on_device:
        gen = torch.Generator(device=device).manual_seed(seed)
        drawn = ((k, _draw(k, s, gen, device)) for k, s in expected_shapes(cfg).items())
    else:
        drawn = ((k, v.to(device)) for k, v in random_weights(cfg, seed).items())
    full = ((k, _as_held(k, v, cfg, dtype, keep_fp8)) for k, v in drawn)
    weights = dict(full) if tp is None else shard_weights(full, cfg, tp.size, tp.rank)  # one full tensor at a time
    return DeepseekV3Model(cfg, weights, device, dtype, tp)
