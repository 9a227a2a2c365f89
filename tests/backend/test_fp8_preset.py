"""The random block-FP8 presets: ``dsv3-tp8-fp8`` is ``dsv3-tp8`` with DeepSeek's
quantization_config, its memory estimate counts FP8 bytes where they are kept, and a quantized
random model holds its draws quantized and dequantized block by block."""

from __future__ import annotations

import dataclasses
import math

import torch

from serving.configs.quantization import BlockFP8Config, quantizable
from serving.model import limits
from serving.model.presets import (
    FP8_CONFIG,
    preset_config,
    random_model,
    random_weights,
)
from serving.model.weights import expected_shapes
from tests.backend.fp8_models import block_dequantize, block_quantize


def held_bytes(cfg) -> int:
    """Bytes of every tensor as a CUDA bf16 model holds it, listed tensor by tensor (FP8 bytes + float32
    scales; kv_b_proj dequantized, with its absorbed copies)."""
    total = 0
    for name, shape in expected_shapes(cfg).items():
        n = math.prod(shape)
        if quantizable(name) and not name.endswith("kv_b_proj.weight"):
            total += n + 4 * math.ceil(shape[0] / 128) * math.ceil(shape[1] / 128)
        else:
            total += 4 * n if name.endswith(("mlp.gate.weight", "e_score_correction_bias")) else 2 * n
        if name.endswith("kv_b_proj.weight"):
            total += 2 * n  # its absorbed W_UK / W_UV copies
    return total


def test_dsv3_tp8_fp8_is_dsv3_tp8_with_block_fp8():
    fp8, bf16 = preset_config("dsv3-tp8-fp8"), preset_config("dsv3-tp8")
    assert fp8.quantization == BlockFP8Config(128) and bf16.quantization is None
    assert dataclasses.replace(fp8, quantization=None) == bf16
    cuda = torch.device("cuda")  # the estimate only; nothing is allocated
    kept = limits.estimate(fp8, cuda, torch.bfloat16, keep_fp8=True).weights
    dense = limits.estimate(bf16, cuda, torch.bfloat16).weights
    exact = held_bytes(fp8)
    assert exact <= kept <= 1.1 * exact, (kept, exact)  # an upper bound, close to what is held
    assert 0.5 * dense < kept < 0.62 * dense
    assert limits.estimate(fp8, cuda, torch.bfloat16, keep_fp8=False).weights == dense  # dequantized at load


def test_a_quantized_random_model_holds_its_draws_block_quantized():
    model = random_model("tiny", seed=4, quantization_config=FP8_CONFIG)
    draws = random_weights(preset_config("tiny"), seed=4)
    name = "model.layers.1.self_attn.o_proj.weight"
    q, s = block_quantize(draws[name])
    assert torch.equal(model.w[name], block_dequantize(q, s).float())
    assert torch.equal(model.w["model.embed_tokens.weight"], draws["model.embed_tokens.weight"])  # unquantized
