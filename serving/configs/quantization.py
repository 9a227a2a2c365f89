"""Which quantized checkpoints the engine serves: ``quantization_config`` read and checked, and
which tensors of a DeepSeek-layout FP8 checkpoint may be FP8.

The one served format is DeepSeek's block FP8 (DeepSeek-V3, R1, Kimi-K2):
``{quant_method: fp8, fmt: e4m3, activation_scheme: dynamic, weight_block_size: [128, 128]}``.
Each quantized linear's ``*.weight`` is ``float8_e4m3fn`` [out, in] beside a float32
``*.weight_scale_inv`` [ceil(out/128), ceil(in/128)]; block (i, j) dequantizes as
``q[i*128:(i+1)*128, j*128:(j+1)*128] * scale_inv[i, j]``.

Decisions:
- Which tensors may be FP8 follows DeepSeek's ``inference/model.py`` and transformers'
  fine-grained FP8 integration: every linear projection of a decoder block (attention, dense
  MLP, routed and shared experts) and the MTP module's ``eh_proj``; the embeddings, every norm,
  the router (``mlp.gate`` and its correction bias) and the heads (``lm_head``, the MTP
  module's ``shared_head.head``) stay unquantized. Whether a projection is FP8 is read from
  its tensor's dtype, so a checkpoint that leaves some projections in bf16 (DeepSeek ships
  ``eh_proj`` in bf16; some re-quantizations keep more) is served as it is.
- ``activation_scheme: dynamic`` only: activations are never stored, so static scales would be
  tensors the engine does not read. ``scale_fmt: ue8m0`` (DeepSeek-V3.1: scales rounded to
  powers of two, still stored as float32) dequantizes the same way and is accepted.
- Every other ``quant_method`` is refused naming it: int4 formats (awq, gptq, compressed-tensors
  as Kimi-K2-Thinking ships), int8 and bitsandbytes have no kernel here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

BLOCK = 128  # the only block edge the kernels support
SUPPORTED_BLOCK = [BLOCK, BLOCK]
SCALE_SUFFIX = "_scale_inv"

KNOWN_KEYS = frozenset({"quant_method", "fmt", "activation_scheme", "weight_block_size", "scale_fmt",
                        "modules_to_not_convert", "dequantize"})
INT_FORMATS = {"awq": "int4", "gptq": "int4", "compressed-tensors": "int4 or int8 packed", "bitsandbytes": "int8/nf4",
               "int8": "int8", "w8a8": "int8", "fbgemm_fp8": "per-channel fp8", "quark": "mixed"}

# Projections that may be stored as block FP8 (the rest of the model stays unquantized).
_QUANTIZABLE = re.compile(
    r"^model\.layers\.\d+\.(self_attn\.(q_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)"
    r"|mlp\.(gate_proj|up_proj|down_proj)"
    r"|mlp\.shared_experts\.(gate_proj|up_proj|down_proj)"
    r"|mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)"
    r"|eh_proj)\.weight$"
)


class QuantizationError(ValueError):
    """A quantization_config the engine does not serve; the message names the key."""


@dataclass(frozen=True)
class BlockFP8Config:
    """DeepSeek's block FP8: e4m3 weights, one float32 scale per ``block`` x ``block`` tile."""

    block: int = BLOCK


def parse_quantization(raw) -> BlockFP8Config | None:
    """``config.json``'s ``quantization_config`` (None or {} : unquantized) as a BlockFP8Config;
    QuantizationError naming the key of anything else."""
    if raw is None or raw == {}:
        return None
    if not isinstance(raw, dict):
        raise QuantizationError(f"Expected quantization_config to be an object, got {raw!r}")
    method = raw.get("quant_method")
    if method != "fp8":
        kind = INT_FORMATS.get(str(method).lower())
        what = f" ({kind} weights)" if kind else ""
        raise QuantizationError(f"Expected quantization_config.quant_method 'fp8' (DeepSeek's block FP8, the one quantized "
                                f"format served), got {method!r}{what}; convert the checkpoint to bf16 or to block FP8")
    unknown = sorted(k for k in raw if k not in KNOWN_KEYS)
    if unknown:
        raise QuantizationError(f"Expected only the keys {sorted(KNOWN_KEYS)} in quantization_config, got unknown key(s) {unknown}")
    fmt = raw.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise QuantizationError(f"Expected quantization_config.fmt 'e4m3' (float8_e4m3fn weights), got {fmt!r}")
    scheme = raw.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise QuantizationError(f"Expected quantization_config.activation_scheme 'dynamic', got {scheme!r} "
                                "(static activation scales are not served)")
    block = raw.get("weight_block_size")
    if block != SUPPORTED_BLOCK:
        raise QuantizationError(f"Expected quantization_config.weight_block_size {SUPPORTED_BLOCK} (the block the FP8 "
                                f"kernels support), got {block!r}")
    scale_fmt = raw.get("scale_fmt")
    if scale_fmt not in (None, "ue8m0"):
        raise QuantizationError(f"Expected quantization_config.scale_fmt null or 'ue8m0' (float32 scales), got {scale_fmt!r}")
    if raw.get("dequantize") not in (None, False):
        raise QuantizationError(f"Expected quantization_config.dequantize false or absent, got {raw['dequantize']!r}")
    return BlockFP8Config(block=BLOCK)


def quantizable(name: str) -> bool:
    """Whether checkpoint tensor ``name`` may be block FP8 (a linear projection's weight)."""
    return _QUANTIZABLE.match(name) is not None


def scale_name(weight_name: str) -> str:
    """``...proj.weight`` -> ``...proj.weight_scale_inv``."""
    return weight_name + SCALE_SUFFIX


def weight_of_scale(name: str) -> str | None:
    """The weight a ``*.weight_scale_inv`` name scales, else None."""
    return name[: -len(SCALE_SUFFIX)] if name.endswith(".weight" + SCALE_SUFFIX) else None


def scale_shape(shape: tuple[int, ...], block: int = BLOCK) -> tuple[int, ...]:
    """Scale grid of a weight of ``shape`` [..., out, in]: [..., ceil(out/block), ceil(in/block)]."""
    return tuple(shape[:-2]) + tuple(math.ceil(d / block) for d in shape[-2:])
