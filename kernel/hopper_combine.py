"""The split merge of the Hopper path: a plain Triton kernel, launched by ``kernel.hopper``.

Same arithmetic as the Triton path's combine (``kernel.triton_kernels``); kept separate because it
can wait on the split kernel through programmatic dependent launch (``USE_PDL``).
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["num_heads"])
def _hopper_combine_kernel(
    OUT, PARTIAL_O, PARTIAL_LSE,
    COUNTS, QO_INDPTR, MB_REQ, MB_MBLK, MB_WORK_START, MB_NSPLIT, MB_STRIDE,
    num_heads, stride_on, stride_oh,
    DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid: (num_row_blocks, BLOCK_M, cdiv(DV, BLOCK_C)). Merges one packed row's splits by their
    LSEs into OUT [N, H, DV]. PARTIAL_O: fp32 [num_work, BLOCK_M, DV]; PARTIAL_LSE: fp32 [num_work, BLOCK_M].
    COUNTS: int32 [2], COUNTS[1] = num_row_blocks: programs past it (a grid sized for a CUDA graph's
    largest batch) exit without writing."""
    i = tl.program_id(0)
    if i >= tl.load(COUNTS + 1):
        return
    r = tl.program_id(1)
    nsplit = tl.load(MB_NSPLIT + i)
    b = tl.load(MB_REQ + i)
    row = tl.load(MB_MBLK + i) * BLOCK_M + r
    qo_start = tl.load(QO_INDPTR + b)
    num_draft = tl.load(QO_INDPTR + b + 1) - qo_start
    w0 = tl.load(MB_WORK_START + i)
    stride = tl.load(MB_STRIDE + i)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()  # the split kernel's partials are visible past this point
    if (nsplit > 1) & (row < num_draft * num_heads):
        offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        offs_s = tl.arange(0, BLOCK_S)
        m = tl.full([BLOCK_S], float("-inf"), dtype=tl.float32)
        for s0 in range(0, nsplit, BLOCK_S):
            w = (w0 + (s0 + offs_s) * stride).to(tl.int64)
            lse = tl.load(PARTIAL_LSE + w * BLOCK_M + r, mask=s0 + offs_s < nsplit, other=float("-inf"))
            m = tl.maximum(m, lse)
        m_max = tl.max(m, 0)
        m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        den = tl.zeros([BLOCK_S], dtype=tl.float32)
        for s0 in range(0, nsplit, BLOCK_S):
            s_ok = s0 + offs_s < nsplit
            w = (w0 + (s0 + offs_s) * stride).to(tl.int64)
            weight = tl.math.exp2(tl.load(PARTIAL_LSE + w * BLOCK_M + r, mask=s_ok, other=float("-inf")) - m_max)
            part = tl.load(PARTIAL_O + (w * BLOCK_M + r)[:, None] * DV + offs_c[None, :], mask=s_ok[:, None], other=0.0)
            acc += tl.sum(weight[:, None] * part, 0)
            den += weight
        total = tl.sum(den, 0)
        total = tl.where(total == 0.0, 1.0, total)
        t_idx = row // num_heads
        h_idx = row % num_heads
        o_ptr = OUT + (qo_start + t_idx).to(tl.int64) * stride_on + h_idx * stride_oh + offs_c
        tl.store(o_ptr, (acc / total).to(OUT.dtype.element_ty))
