"""Checks of a block-FP8 checkpoint's layout, from its safetensors headers and its scales alone.

``weights.plan_load`` calls ``FP8Layout.entry`` for every header entry and ``FP8Layout.finish``
after the last file, before any tensor is read; the loaders call ``check_scale_values`` on
each scale tensor (the scales are read first, one float per 16384 weights) before any weight
is read. Every error names the tensor and the file.

Decisions:
- A scale's shape is checked against its weight's expected shape (``weights.expected_shapes``)
  as ``[ceil(out/128), ceil(in/128)]``, so a scale written for another block size or for
  another tensor fails, naming both shapes.
- Pairs are checked both ways: an FP8 weight without its scale, and a scale beside a weight
  that is not FP8 (a checkpoint converted to bf16 that kept its scales would otherwise be
  served unscaled), are refused.
- Fused expert tensors (``mlp.experts.gate_up_proj``) in FP8 are refused: DeepSeek's and
  Kimi's checkpoints store experts one by one, and no scale layout for fused ones is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from serving.configs.quantization import (
    BLOCK,
    quantizable,
    scale_name,
    scale_shape,
    weight_of_scale,
)

FP8_DTYPES = ("F8_E4M3",)
OTHER_FP8 = ("F8_E5M2", "F8_E8M0")


@dataclass
class FP8Layout:
    """What the headers said so far: FP8 weights and scales found (name -> file)."""

    quantized: bool  # the config declares block FP8
    expected: dict[str, tuple[int, ...]]
    error: type[ValueError] = ValueError
    fp8: dict[str, Path] = field(default_factory=dict)
    scales: dict[str, Path] = field(default_factory=dict)
    dense: set[str] = field(default_factory=set)

    def entry(self, name: str, dtype: str, shape: tuple[int, ...], path: Path) -> bool:
        """Check one header entry; True when it is a scale (the caller skips its own checks)."""
        weight = weight_of_scale(name)
        if weight is not None:
            self._scale(name, weight, dtype, shape, path)
            return True
        if dtype in OTHER_FP8:
            raise self.error(f"Expected FP8 weights as float8_e4m3fn (fmt e4m3), got {name} as {dtype} in {path}")
        if dtype in FP8_DTYPES:
            if not self.quantized:
                raise self.error(f"Expected floating-point tensors, got {name} as {dtype} in {path} while config.json has no "
                                 f"quantization_config (block FP8 needs quantization_config.quant_method 'fp8')")
            if name.endswith(("gate_up_proj", "experts.down_proj")):
                raise self.error(f"Expected FP8 experts one by one (mlp.experts.{{e}}.gate_proj.weight, as DeepSeek writes them), "
                                 f"got the fused {name} as {dtype} in {path}")
            if not quantizable(name):
                raise self.error(f"Expected {name} unquantized (embeddings, norms, the router and the heads stay in bf16/fp32 "
                                 f"in DeepSeek's FP8 layout), got {dtype} in {path}")
            self.fp8[name] = path
        else:
            self.dense.add(name)
        return False

    def _scale(self, name: str, weight: str, dtype: str, shape: tuple[int, ...], path: Path) -> None:
        if not self.quantized:
            raise self.error(f"Expected no FP8 scales while config.json has no quantization_config, got {name} in {path}")
        if weight not in self.expected or not quantizable(weight):
            raise self.error(f"Expected scales only beside an FP8 projection's weight, got {name} in {path} "
                             f"({weight} is not a quantizable weight of this model)")
        if dtype != "F32":
            raise self.error(f"Expected {name} as float32 block scales, got {dtype} in {path}")
        want = scale_shape(self.expected[weight], BLOCK)
        if tuple(shape) != want:
            raise self.error(f"Expected {name} of shape {want} (ceil({list(self.expected[weight])} / {BLOCK}) per "
                             f"{BLOCK}x{BLOCK} block), got {tuple(shape)} in {path}")
        if name in self.scales:
            raise self.error(f"Expected tensor {name} once in the checkpoint, got it in {self.scales[name]} and {path}")
        self.scales[name] = path

    def finish(self) -> None:
        """After every header: each FP8 weight has its scale and each scale an FP8 weight."""
        for weight, path in self.fp8.items():
            if scale_name(weight) not in self.scales:
                raise self.error(f"Expected the block scales {scale_name(weight)} beside the FP8 weight {weight} ({path}), got none")
        for scale, path in self.scales.items():
            weight = weight_of_scale(scale)
            if weight not in self.fp8:
                raise self.error(f"Expected {scale} ({path}) only beside an FP8 weight, got {weight} "
                                 f"{'unquantized' if weight in self.dense else 'missing'}")


def check_scale_values(name: str, scale: torch.Tensor, path: Path, error: type[ValueError] = ValueError) -> None:
    """Every block scale of ``name`` finite and > 0, else ``error`` naming the first bad block."""
    bad = ~(torch.isfinite(scale) & (scale > 0))
    if bad.any():
        at = [int(i) for i in bad.nonzero()[0]]
        raise error(f"Expected every block scale of {name} finite and > 0, got {scale[tuple(at)].item()} at block {at} "
                    f"in {path} (a corrupt or wrongly converted checkpoint)")
