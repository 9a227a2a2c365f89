"""Small block-FP8 checkpoints in DeepSeek-V3's layout, written here without the engine's code.

Each quantized projection's ``*.weight`` is float8_e4m3fn [out, in] beside a float32
``*.weight_scale_inv`` [ceil(out/128), ceil(in/128)] (amax / 448 per 128x128 block, as
DeepSeek's ``weight_quant``); the embeddings, norms, router, heads and the MTP module's
``eh_proj`` stay unquantized, as in DeepSeek-V3's files. Routed experts are stored one by one.

transformers 5.24 dequantizes on the CPU with a block derived from the grid (``rows // grid
rows``), which is 128 only where 128 divides the dimension: a weight with a partial block
(DeepSeek-V3's ``kv_a_proj_with_mqa`` has 576 rows) is read with the wrong block, or refused
when the grid does not divide it. So ``oracle=True`` gives such a weight one scale for all of
its blocks (a valid file, which transformers then reads right); the engine's partial blocks
with distinct scales are checked against ``block_dequantize`` instead.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch

BLOCK = 128
FP8_CONFIG = dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic", weight_block_size=[BLOCK, BLOCK])
# Scale grids of several blocks; partial blocks in kv_a_proj_with_mqa (176 rows), kv_b_proj (224 x 160) and the experts (160).
FP8_TINY = dict(
    vocab_size=256, hidden_size=256, intermediate_size=256, moe_intermediate_size=160, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=160, qk_rope_head_dim=16, qk_nope_head_dim=48,
    v_head_dim=64, q_lora_rank=None, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
    topk_group=1, routed_scaling_factor=2.5, first_k_dense_replace=1, max_position_embeddings=512,
)
# DeepSeek's quantized projections (everything else stays bf16 / fp32 in its files).
QUANTIZED = re.compile(r"_proj(_with_mqa)?\.weight$")
UNQUANTIZED = re.compile(r"(embed_tokens|norm|mlp\.gate\.|lm_head|shared_head|eh_proj)")


def block_quantize(w: torch.Tensor, one_scale: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (q float8_e4m3fn [out, in], scale_inv float32 [ceil(out/128), ceil(in/128)]), block by block;
    ``one_scale``: every block gets the tensor's amax / 448."""
    rows, cols = w.shape
    scale = torch.empty(math.ceil(rows / BLOCK), math.ceil(cols / BLOCK))
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            tile = w[i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK].float()
            s = (w if one_scale else tile).float().abs().max() / 448.0
            s = s if s > 0 else torch.tensor(1.0)
            scale[i, j] = s
            q[i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK] = (tile / s).to(torch.float8_e4m3fn)
    return q, scale


def random_block_fp8(n: int, k: int, seed: int, device) -> "BlockFP8Weight":
    """A random block-FP8 weight [n, k] on ``device``, per-block magnitudes spread over 2**-4 .. 2**4
    (so a tile's scale matters), quantized by the tests' own code (``block_quantize``)."""
    from serving.quant.fp8 import BlockFP8Weight

    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) / k**0.5
    w *= 2.0 ** torch.randint(-4, 5, (-(-n // 128), -(-k // 128)), generator=gen).repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    q, s = block_quantize(w)
    return BlockFP8Weight(q.to(device), s.to(device))


def block_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float64 dequantization of one (q, scale_inv) pair, block by block."""
    out = q.double()
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            out[i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK] *= scale[i, j].double()
    return out


def quantized_name(name: str) -> bool:
    return bool(QUANTIZED.search(name)) and not UNQUANTIZED.search(name)


def quantize_checkpoint(weights: dict[str, torch.Tensor], oracle: bool = True) -> dict[str, torch.Tensor]:
    """Float weights -> DeepSeek's FP8 layout (each quantized weight and its ``_scale_inv``);
    ``oracle``: one scale per weight with a partial block (see the module docstring)."""
    out = {}
    for name, w in weights.items():
        if quantized_name(name):
            partial = any(d % BLOCK for d in w.shape)
            out[name], out[name + "_scale_inv"] = block_quantize(w, one_scale=oracle and partial)
        else:
            out[name] = w.to(torch.float32 if "mlp.gate." in name else torch.bfloat16).contiguous()
    return out


def save_fp8(folder: Path, seed: int = 0, mtp: bool = True, oracle: bool = True, **overrides) -> Path:
    """A DeepSeek-layout FP8 folder (config.json written by transformers, with FP8_CONFIG) of
    FP8_TINY with ``overrides``; the MTP module (layer num_hidden_layers) when ``mtp``. The float
    weights are the engine's seeded draws (any draw would do; the layout is this module's)."""
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config

    from serving.configs.model import ModelConfig
    from serving.model.presets import random_weights

    params = dict(FP8_TINY, **overrides)
    params.setdefault("rope_parameters", dict(rope_type="default", rope_theta=10000.0))
    hf = DeepseekV3Config(**params)
    raw = hf.to_dict()
    raw.update(quantization_config=dict(FP8_CONFIG), num_nextn_predict_layers=1 if mtp else 0,
               architectures=["DeepseekV3ForCausalLM"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    cfg = ModelConfig.from_dict({k: v for k, v in raw.items() if k != "quantization_config"})  # the float draws' shapes
    weights = quantize_checkpoint(random_weights(cfg, seed), oracle)
    experts = {k: v for k, v in weights.items() if ".mlp.experts." in k}
    files = {"model-00001-of-00002.safetensors": {k: v for k, v in weights.items() if k not in experts},
             "model-00002-of-00002.safetensors": experts}
    for name, tensors in files.items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / name), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: name for name, tensors in files.items() for k in tensors}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def rewrite(folder: Path, out: Path, edit) -> Path:
    """A copy of ``folder`` whose tensors are ``edit(dict of every tensor)``'s return (one file)."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text((folder / "config.json").read_text())
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    save_file({k: v.contiguous() for k, v in edit(tensors).items()}, str(out / "model.safetensors"))
    return out


def with_quantization_config(folder: Path, out: Path, quantization_config) -> Path:
    """A copy of ``folder``'s config.json with another ``quantization_config``, the weights linked."""
    out.mkdir(parents=True, exist_ok=True)
    raw = json.loads((folder / "config.json").read_text())
    raw["quantization_config"] = quantization_config
    (out / "config.json").write_text(json.dumps(raw))
    for path in folder.glob("*.safetensors"):
        (out / path.name).symlink_to(path)
    return out
