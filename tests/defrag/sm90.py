"""Compile the Hopper split kernels with the contiguous fast path for sm_90 on any machine
(``kernel.hopper.compile_for_sm90`` compiles them without it)."""

from __future__ import annotations

import triton
from triton.backends.compiler import GPUTarget

from kernel import hopper
from kernel.hopper import _split_constexprs, _split_kernel

POINTERS = {"Q": "*bf16", "KV": "*bf16", "KV_INDICES": "*i32", "TREE_MASK": "*u8", "OUT": "*bf16",
            "PARTIAL_O": "*fp32", "PARTIAL_LSE": "*fp32", "COUNTS": "*i32", "QO_INDPTR": "*i32", "KV_INDPTR": "*i32",
            "MASK_OFFSETS": "*i32", "W_REQ": "*i32", "W_MBLK": "*i32", "W_KV_START": "*i32", "W_KV_END": "*i32",
            "W_FULL_END": "*i32", "W_NSPLIT": "*i32", "KV_START": "*i32", "KV_CONTIG": "*i32"}
SCALARS = {"num_heads": "i32", "qk_scale": "fp32", "stride_qn": "i32", "stride_qh": "i32", "stride_on": "i32",
           "stride_oh": "i32"}


def compile_fast_path(causal: bool, variant: hopper.Variant):
    """The split kernel of ``variant`` with KV_START / KV_CONTIG given (pointers 16-byte aligned)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = _split_kernel(variant)
    signature = {name: POINTERS.get(name) or SCALARS.get(name) or "constexpr" for name in fn.arg_names}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in POINTERS}
    src = GluonASTSource(fn, signature, dict(_split_constexprs(variant), CAUSAL=causal), attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": variant.num_warps})
