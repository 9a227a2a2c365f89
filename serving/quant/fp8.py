"""Block-FP8 weights as the model holds them: FP8 bytes plus their 128x128 block scales.

Decisions:
- One small type, ``BlockFP8Weight`` (q float8_e4m3fn [..., out, in], scale_inv float32
  [..., ceil(out/B), ceil(in/B)]), stands where a dense weight tensor stands. On CUDA the model
  keeps it (half the bytes a decode step streams; ``gemm.linear`` runs it); on the CPU the
  loader dequantizes at load, so the model there holds plain tensors (``keep_fp8``).
- Dequantization is in float32 (``q.float() * scale``, as DeepSeek's ``weight_dequant`` and
  transformers' ``Fp8Dequantize`` compute it), then cast: a float32 model holds the exact
  products, bit for bit what transformers dequantizes on a CPU.
- Concatenating rows (the model's fused q_a + kv_a and gate + up projections, its stacked
  experts) stays FP8 only when every part but the last ends on a block boundary; otherwise the
  scale grids cannot be joined and ``cat_rows`` returns the dequantized matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from serving.configs.quantization import BLOCK

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn


@dataclass
class BlockFP8Weight:
    """q: float8_e4m3fn [..., out, in]; scale_inv: float32 [..., ceil(out/block), ceil(in/block)]."""

    q: torch.Tensor
    scale_inv: torch.Tensor
    block: int = BLOCK

    def __post_init__(self) -> None:
        want = tuple(self.q.shape[:-2]) + tuple(-(-d // self.block) for d in self.q.shape[-2:])
        assert self.q.dtype == FP8_DTYPE and tuple(self.scale_inv.shape) == want, (self.q.shape, self.scale_inv.shape)

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def nbytes(self) -> int:
        return self.q.numel() + 4 * self.scale_inv.numel()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense weight [..., out, in] in ``dtype`` (products taken in float32)."""
        return dequantize(self.q, self.scale_inv, self.block, dtype)

    def __getitem__(self, index: int | slice) -> "BlockFP8Weight":
        """Experts of a stacked [E, out, in] weight (the leading dim only)."""
        assert self.q.dim() == 3
        return BlockFP8Weight(self.q[index], self.scale_inv[index], self.block)

    def row_slice(self, start: int, stop: int) -> "BlockFP8Weight":
        """Rows [start, stop) of a 2-D weight; ``start`` on a block boundary (views, no copy)."""
        assert start % self.block == 0 and self.q.dim() == 2, (start, self.q.shape)
        return BlockFP8Weight(self.q[start:stop], self.scale_inv[start // self.block : -(-stop // self.block)], self.block)

    def to(self, device: torch.device) -> "BlockFP8Weight":
        return BlockFP8Weight(self.q.to(device), self.scale_inv.to(device), self.block)


def dequantize(q: torch.Tensor, scale_inv: torch.Tensor, block: int = BLOCK, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q [..., out, in] (float8) times its block's scale_inv [..., ceil(out/block), ceil(in/block)], in ``dtype``."""
    rows, cols = q.shape[-2:]
    scale = scale_inv.float().repeat_interleave(block, dim=-2)[..., :rows, :].repeat_interleave(block, dim=-1)[..., :cols]
    return (q.float() * scale).to(dtype)


def quantize(w: torch.Tensor, block: int = BLOCK) -> BlockFP8Weight:
    """``w`` [..., out, in] as block FP8: each block's scale_inv = amax / 448 (DeepSeek's
    ``weight_quant``), q = w / scale_inv rounded to e4m3; an all-zero block gets scale 1."""
    rows, cols = w.shape[-2:]
    br, bc = -(-rows // block), -(-cols // block)
    padded = torch.zeros(*w.shape[:-2], br * block, bc * block, dtype=torch.float32, device=w.device)
    padded[..., :rows, :cols] = w.float()
    tiles = padded.unflatten(-1, (bc, block)).unflatten(-3, (br, block))  # [..., br, B, bc, B]
    amax = tiles.abs().amax(dim=(-3, -1))  # [..., br, bc]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (tiles / scale[..., :, None, :, None]).flatten(-4, -3).flatten(-2, -1)[..., :rows, :cols]
    return BlockFP8Weight(q.to(FP8_DTYPE).contiguous(), scale.contiguous(), block)


def cat_rows(parts: list[torch.Tensor | BlockFP8Weight], dtype: torch.dtype) -> torch.Tensor | BlockFP8Weight:
    """Row-wise concatenation [sum(out), in] of weights; FP8 when every part is FP8 and every
    part but the last has a multiple of the block rows, else dense in ``dtype``."""
    fp8 = all(isinstance(p, BlockFP8Weight) for p in parts)
    if fp8 and all(p.shape[-2] % p.block == 0 for p in parts[:-1]) and len({p.block for p in parts}) == 1:
        return BlockFP8Weight(torch.cat([p.q for p in parts], dim=-2), torch.cat([p.scale_inv for p in parts], dim=-2), parts[0].block)
    return torch.cat([dense(p, dtype) for p in parts], dim=-2)


def stack(parts: list[torch.Tensor | BlockFP8Weight], dtype: torch.dtype) -> torch.Tensor | BlockFP8Weight:
    """[E, out, in] of per-expert weights; FP8 when every part is FP8."""
    if all(isinstance(p, BlockFP8Weight) for p in parts):
        return BlockFP8Weight(torch.stack([p.q for p in parts]), torch.stack([p.scale_inv for p in parts]), parts[0].block)
    return torch.stack([dense(p, dtype) for p in parts])


def dense(w: torch.Tensor | BlockFP8Weight, dtype: torch.dtype) -> torch.Tensor:
    """``w`` as a dense tensor in ``dtype`` (a dense tensor is returned as it is)."""
    return w.dequantize(dtype) if isinstance(w, BlockFP8Weight) else w
