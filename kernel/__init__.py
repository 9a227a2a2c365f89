"""MLA tree-verify attention for speculative decoding over a page_size=1 KV pool.

The public API, what serving code and gates import (``tests/test_layers.py`` holds code outside
``kernel/`` to it):

- :func:`mla_verify_attention`: one call (plan and run);
- :class:`MLAVerifyWrapper`: ``plan()`` once per batch, ``run(out=)`` per layer, capturable;
- :class:`TileConfig`: a Triton tile configuration, for callers that pin one;
- :func:`tree_mask_from_parents`: a draft tree's packed mask from its parent links;
- :func:`warmup` / :class:`WarmupReport`: compile every variant a plan can dispatch, before serving;
- :func:`compile_stats`: registers, spills and shared memory of each compiled configuration.

The naive float64 oracle is :mod:`kernel.reference` (tests and gates only). Gate and benchmark
code that must reach below this API goes through :mod:`kernel.bench_api`.
"""

from kernel.masks import tree_mask_from_parents
from kernel.mla_verify import MLAVerifyWrapper, compile_stats, mla_verify_attention
from kernel.plan import TileConfig
from kernel.precompile import WarmupReport, warmup

__all__ = ["mla_verify_attention", "MLAVerifyWrapper", "compile_stats", "TileConfig", "tree_mask_from_parents",
           "warmup", "WarmupReport"]
