"""MLA tree-verify attention for speculative decoding over a page_size=1 KV pool.

Public API: :func:`mla_verify_attention` (one call), :class:`MLAVerifyWrapper` (plan once,
run per layer), :func:`compile_stats` (resources per compiled
configuration), :func:`warmup` (compile every variant a plan can dispatch, before serving)
and the naive oracle in :mod:`kernel.reference`.
"""

from kernel.mla_verify import MLAVerifyWrapper, compile_stats, mla_verify_attention
from kernel.plan import TileConfig
from kernel.precompile import WarmupReport, warmup

__all__ = ["mla_verify_attention", "MLAVerifyWrapper", "compile_stats", "TileConfig", "warmup", "WarmupReport"]
