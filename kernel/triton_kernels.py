"""Triton kernels of MLA tree-verify attention over a page_size=1 KV pool.

``_mla_verify_split_kernel``: one program per work item (request, M-block of packed
(draft token, head) rows, KV chunk). It streams the chunk's KV rows tile by tile (gathered
through ``kv_indices``), computes scores for every packed row with one ``tl.dot`` per tile,
keeps an online softmax, and accumulates P @ V where V is the first DV values of the same
tile (absorbed MLA: the latent row is both K and V). Tiles that lie wholly in the request's
prefix need no mask; only the tail tiles (draft keys, chunk end) apply bounds and the tree
mask. A program whose (request, M-block) has a single split writes the normalized output;
otherwise it writes an fp32 partial output and its log2-sum-exp. With ``KV_START`` /
``KV_CONTIG`` (the contiguous fast path, compiled out when None) the whole prefix tiles of a
request's leading run of consecutive slots are addressed as ``start + position``, no index load.

``_mla_verify_combine_kernel``: merges the splits of each packed row with their LSEs.

Scores use base-2 exponentials: ``sm_scale`` is pre-multiplied by log2(e).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _attend_tile(
    acc, m_i, l_i,
    q_main, q_tail,
    KV, KV_INDICES, TREE_MASK,
    kv_base, start, kv_end, prefix_len, num_draft, mask_offset, t_idx, row_ok,
    stride_kv, qk_scale,
    D: tl.constexpr, D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
    DV: tl.constexpr, BLOCK_DV: tl.constexpr, V_IS_K_MAIN: tl.constexpr,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    CONTIG: tl.constexpr = False, slot_base=0,
):
    """One KV tile of the online softmax. acc: fp32 [BLOCK_M, BLOCK_DV]; m_i, l_i: fp32 [BLOCK_M];
    q_main: [BLOCK_M, D_MAIN]; q_tail: [BLOCK_M, D_TAIL]. Returns the updated (acc, m_i, l_i).
    CONTIG: the tile's keys sit at slots ``slot_base + position`` (no index load; unmasked tiles only).
    """
    cols = start + tl.arange(0, BLOCK_N)  # key positions within the request
    if CONTIG:
        slot = (slot_base + cols).to(tl.int64)
    elif MASKED:
        col_ok = cols < kv_end
        slot = tl.load(KV_INDICES + kv_base + cols, mask=col_ok, other=0).to(tl.int64)
    else:
        slot = tl.load(KV_INDICES + kv_base + cols).to(tl.int64)
    row_ptr = KV + slot[:, None] * stride_kv  # [BLOCK_N, 1]
    offs_main = tl.arange(0, D_MAIN)
    if MASKED:
        k_main = tl.load(row_ptr + offs_main[None, :], mask=col_ok[:, None], other=0.0)
    else:
        k_main = tl.load(row_ptr + offs_main[None, :])
    if UPCAST:
        k_main = k_main.to(tl.float32)
    # The tail dot comes first and feeds the main one as its accumulator: a dot whose result
    # reaches another dot gets Triton's chained-dot layout (warps stacked on M), and only the
    # small 64-wide tail should pay for that.
    if D_TAIL > 0:
        offs_tail = D_MAIN + tl.arange(0, D_TAIL)
        tail_ok = offs_tail < D
        if MASKED:
            k_tail = tl.load(row_ptr + offs_tail[None, :], mask=col_ok[:, None] & tail_ok[None, :], other=0.0)
        else:
            k_tail = tl.load(row_ptr + offs_tail[None, :], mask=tail_ok[None, :], other=0.0)
        if UPCAST:
            k_tail = k_tail.to(tl.float32)
        qk = tl.dot(q_main, tl.trans(k_main), tl.dot(q_tail, tl.trans(k_tail)))  # [BLOCK_M, BLOCK_N]
    else:
        qk = tl.dot(q_main, tl.trans(k_main))
    qk = qk * qk_scale

    if MASKED:
        # Prefix keys are always visible; a draft key u is visible to draft t per the tree.
        u = cols - prefix_len  # [BLOCK_N], draft index where >= 0
        is_draft = (u >= 0) & col_ok
        if CAUSAL:
            draft_ok = u[None, :] <= t_idx[:, None]
        else:
            bits = tl.load(
                TREE_MASK + mask_offset + t_idx[:, None] * num_draft + u[None, :],
                mask=row_ok[:, None] & is_draft[None, :],
                other=0,
            )
            draft_ok = bits != 0
        visible = col_ok[None, :] & ((u[None, :] < 0) | draft_ok)
        qk = tl.where(visible, qk, float("-inf"))

    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw no key yet
    p = tl.math.exp2(qk - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    if V_IS_K_MAIN:
        v = k_main
    else:
        offs_v = tl.arange(0, BLOCK_DV)
        if MASKED:
            v = tl.load(row_ptr + offs_v[None, :], mask=col_ok[:, None] & (offs_v[None, :] < DV), other=0.0)
        else:
            v = tl.load(row_ptr + offs_v[None, :], mask=offs_v[None, :] < DV, other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
    p = p.to(v.dtype)
    acc = acc * alpha[:, None]
    acc = tl.dot(p, v, acc)
    return acc, m_new, l_i


# Head counts vary per model and batch; specializing on them (==1, %16) would multiply compiles.
@triton.jit(do_not_specialize=["num_heads"])
def _mla_verify_split_kernel(
    Q, KV, KV_INDICES, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE,
    COUNTS, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
    W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
    num_heads, qk_scale,
    stride_qn, stride_qh, stride_kv, stride_on, stride_oh,
    D: tl.constexpr, D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
    DV: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    KV_START=None, KV_CONTIG=None,
):
    """Grid: (>= num_work,).  Q: [N, H, D].  KV: [num_slots, D].  OUT: [N, H, DV].
    PARTIAL_O: fp32 [num_work, BLOCK_M, BLOCK_DV].  PARTIAL_LSE: fp32 [num_work, BLOCK_M] (log2 domain).
    COUNTS: int32 [2], COUNTS[0] = num_work: programs past it (a grid sized for the largest
    plan, as under CUDA graphs) exit without reading or writing anything else.
    KV_START, KV_CONTIG: int32 [B] or None (compiled out): request b's first KV_CONTIG[b] keys
    sit at slots KV_START[b] + position; whole unmasked tiles among them skip the index load.
    """
    tl.static_assert(D_MAIN <= D, "D_MAIN is the power-of-two head part")
    tl.static_assert(BLOCK_N >= 16, "tl.dot needs at least 16 keys per tile")
    # V reuses the loaded K tile only when the value block is exactly the power-of-two head part.
    V_IS_K_MAIN: tl.constexpr = (BLOCK_DV == D_MAIN) and (DV == D_MAIN)

    w = tl.program_id(0)
    if w >= tl.load(COUNTS):
        return
    b = tl.load(W_REQ + w)
    mblk = tl.load(W_MBLK + w)
    kv_start = tl.load(W_KV_START + w)
    kv_end = tl.load(W_KV_END + w)
    full_end = tl.load(W_FULL_END + w)  # whole prefix tiles end here: no mask before it
    nsplit = tl.load(W_NSPLIT + w)
    qo_start = tl.load(QO_INDPTR + b)
    num_draft = tl.load(QO_INDPTR + b + 1) - qo_start
    kv_base = tl.load(KV_INDPTR + b)
    kv_len = tl.load(KV_INDPTR + b + 1) - kv_base
    prefix_len = kv_len - num_draft
    mask_offset = tl.load(MASK_OFFSETS + b)

    rows = mblk * BLOCK_M + tl.arange(0, BLOCK_M)  # packed row r = t * H + h
    row_ok = rows < num_draft * num_heads
    t_idx = rows // num_heads
    h_idx = rows % num_heads
    q_row = Q + (qo_start + t_idx).to(tl.int64) * stride_qn + h_idx * stride_qh  # [BLOCK_M]
    offs_main = tl.arange(0, D_MAIN)
    offs_tail = D_MAIN + tl.arange(0, D_TAIL if D_TAIL > 0 else 16)
    q_main = tl.load(q_row[:, None] + offs_main[None, :], mask=row_ok[:, None], other=0.0)  # [BLOCK_M, D_MAIN]
    q_tail = tl.load(q_row[:, None] + offs_tail[None, :], mask=row_ok[:, None] & (offs_tail[None, :] < D), other=0.0)
    if UPCAST:
        q_main = q_main.to(tl.float32)
        q_tail = q_tail.to(tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # Whole prefix tiles first, without masks (those in a contiguous run without index loads);
    # then the masked tail (draft keys, chunk end).
    contig_end = kv_start
    if KV_CONTIG is not None:
        contig = tl.minimum(tl.load(KV_CONTIG + b), full_end)
        slot_base = tl.load(KV_START + b)
        contig_end = kv_start + tl.maximum(contig - kv_start, 0) // BLOCK_N * BLOCK_N
        # Two stages: the contiguous tiles' loads pipeline into shared memory; more stages
        # would take more of it than the gathered loop uses.
        for start in tl.range(kv_start, contig_end, BLOCK_N, num_stages=2):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q_main, q_tail, KV, KV_INDICES, TREE_MASK,
                kv_base, start, kv_end, prefix_len, num_draft, mask_offset, t_idx, row_ok,
                stride_kv, qk_scale,
                D, D_MAIN, D_TAIL, DV, BLOCK_DV, V_IS_K_MAIN, BLOCK_N, False, CAUSAL, UPCAST, True, slot_base,
            )
    for start in range(contig_end, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q_main, q_tail, KV, KV_INDICES, TREE_MASK,
            kv_base, start, kv_end, prefix_len, num_draft, mask_offset, t_idx, row_ok,
            stride_kv, qk_scale,
            D, D_MAIN, D_TAIL, DV, BLOCK_DV, V_IS_K_MAIN, BLOCK_N, False, CAUSAL, UPCAST,
        )
    for start in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q_main, q_tail, KV, KV_INDICES, TREE_MASK,
            kv_base, start, kv_end, prefix_len, num_draft, mask_offset, t_idx, row_ok,
            stride_kv, qk_scale,
            D, D_MAIN, D_TAIL, DV, BLOCK_DV, V_IS_K_MAIN, BLOCK_N, True, CAUSAL, UPCAST,
        )

    offs_dv = tl.arange(0, BLOCK_DV)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o_row = OUT + (qo_start + t_idx).to(tl.int64) * stride_on + h_idx * stride_oh  # [BLOCK_M]
    p_row = w.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_ptr = o_row[:, None] + offs_dv[None, :]
    o_ok = row_ok[:, None] & (offs_dv[None, :] < DV)
    p_ptr = PARTIAL_O + p_row[:, None] * BLOCK_DV + offs_dv[None, :]
    o_val = acc / l_safe[:, None]
    if nsplit == 1:
        tl.store(o_ptr, o_val.to(OUT.dtype.element_ty), mask=o_ok)
    else:
        tl.store(p_ptr, o_val)
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.math.log2(l_safe))
        tl.store(PARTIAL_LSE + p_row, lse)


@triton.jit(do_not_specialize=["num_heads"])
def _mla_verify_combine_kernel(
    OUT, PARTIAL_O, PARTIAL_LSE,
    COUNTS, QO_INDPTR, MB_REQ, MB_MBLK, MB_WORK_START, MB_NSPLIT, MB_STRIDE,
    num_heads, stride_on, stride_oh,
    DV: tl.constexpr, PARTIAL_DV: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Grid: (>= num_row_blocks, BLOCK_M, cdiv(DV, BLOCK_C)).  Merges the splits of one packed row's
    BLOCK_C output columns into OUT [N, H, DV]; splits are read BLOCK_S at a time so a row with
    hundreds of splits is a few wide loads, not hundreds of dependent ones.
    PARTIAL_O: fp32 [num_work, BLOCK_M, PARTIAL_DV].  PARTIAL_LSE: fp32 [num_work, BLOCK_M].
    COUNTS: int32 [2], COUNTS[1] = num_row_blocks: programs past it exit.
    """
    i = tl.program_id(0)
    if i >= tl.load(COUNTS + 1):
        return
    r = tl.program_id(1)
    nsplit = tl.load(MB_NSPLIT + i)
    b = tl.load(MB_REQ + i)
    row = tl.load(MB_MBLK + i) * BLOCK_M + r
    qo_start = tl.load(QO_INDPTR + b)
    num_draft = tl.load(QO_INDPTR + b + 1) - qo_start
    # Single-split blocks were written by the split kernel; padding rows have no output.
    if (nsplit > 1) & (row < num_draft * num_heads):
        w0 = tl.load(MB_WORK_START + i)
        stride = tl.load(MB_STRIDE + i)
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
            part = tl.load(PARTIAL_O + (w * BLOCK_M + r)[:, None] * PARTIAL_DV + offs_c[None, :],
                           mask=s_ok[:, None] & (offs_c[None, :] < PARTIAL_DV), other=0.0)
            acc += tl.sum(weight[:, None] * part, 0)
            den += weight
        total = tl.sum(den, 0)
        total = tl.where(total == 0.0, 1.0, total)
        t_idx = row // num_heads
        h_idx = row % num_heads
        o_ptr = OUT + (qo_start + t_idx).to(tl.int64) * stride_on + h_idx * stride_oh + offs_c
        tl.store(o_ptr, (acc / total).to(OUT.dtype.element_ty), mask=offs_c < DV)


def launch_combine(
    out, partial_o, partial_lse, meta: dict, qo_indptr, num_heads: int, row_blocks: int, block_m: int,
    partial_dv: int, splits: int, cols: int, num_warps: int = 4,
) -> None:
    """Merge split partials into ``out`` [N, H, DV]: ``_mla_verify_combine_kernel`` over ``row_blocks``
    row blocks (``>= COUNTS[1]``: the extra programs exit), ``splits`` splits per load, ``cols`` output
    columns per program. Both kernel paths use it. meta: ``PlanLayout.views`` of the uploaded plan
    (``counts``, ``mb_*``); qo_indptr: int32 [B+1] on the device; partial_o: fp32
    [num_work, block_m, partial_dv]; partial_lse: fp32 [num_work, block_m]."""
    dv = out.shape[-1]
    _mla_verify_combine_kernel[(row_blocks, block_m, triton.cdiv(dv, cols))](
        out, partial_o, partial_lse,
        meta["counts"], qo_indptr, meta["mb_req"], meta["mb_mblk"], meta["mb_work_start"],
        meta["mb_nsplit"], meta["mb_stride"],
        num_heads, out.stride(0), out.stride(1),
        DV=dv, PARTIAL_DV=partial_dv, BLOCK_M=block_m, BLOCK_S=splits, BLOCK_C=cols, num_warps=num_warps,
    )


def launch_split(
    q, kv, kv_indices, tree_mask, out, partial_o, partial_lse, meta: dict, programs: int, num_heads: int,
    qk_scale: float, dims, config, upcast: bool, contiguous: bool,
):
    """Launch ``_mla_verify_split_kernel`` over ``programs`` work items; returns the compiled kernel.

    q: [N, H, D]; kv: [num_slots, D]; kv_indices: int32/int64 [total_kv]; tree_mask: uint8 packed
    masks, None for a chain (causal); out: [N, H, DV]; partial_o / partial_lse: the workspace's
    split partials; meta: ``PlanLayout.views`` of the uploaded plan; qk_scale: sm_scale * log2(e);
    dims: ``HeadDims``; config: ``TileConfig``; contiguous: the plan carries contiguous KV runs
    (``meta["kv_start"]``, ``meta["kv_contig"]``)."""
    causal = tree_mask is None
    mask_arg = kv_indices if causal else tree_mask  # any pointer when causal
    extra = {"KV_START": meta["kv_start"], "KV_CONTIG": meta["kv_contig"]} if contiguous else {}
    return _mla_verify_split_kernel[(programs,)](
        q, kv, kv_indices, mask_arg, out, partial_o, partial_lse,
        meta["counts"], meta["qo_indptr"], meta["kv_indptr"], meta["mask_offsets"],
        meta["work_req"], meta["work_mblk"], meta["work_kv_start"],
        meta["work_kv_end"], meta["work_full_end"], meta["work_nsplit"],
        num_heads, qk_scale,
        q.stride(0), q.stride(1), kv.stride(0), out.stride(0), out.stride(1),
        D=dims.head_dim, D_MAIN=dims.d_main, D_TAIL=dims.d_tail, DV=dims.v_head_dim,
        BLOCK_DV=dims.block_dv, BLOCK_M=config.block_m, BLOCK_N=config.block_n, CAUSAL=causal, UPCAST=upcast,
        num_warps=config.num_warps, num_stages=config.num_stages, **extra,
    )


def compile_split_for_sm90(config, causal: bool, dims):
    """``_mla_verify_split_kernel`` compiled for sm_90 without a GPU: bf16, ``config``'s block
    sizes, warps and stages, ``dims`` (``HeadDims``); pointer and stride arguments 16-byte
    divisible as the launches see them. Returns the compiled kernel (its ``asm`` and metadata)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _mla_verify_split_kernel
    pointers = {"Q": "*bf16", "KV": "*bf16", "KV_INDICES": "*i32", "TREE_MASK": "*u8", "OUT": "*bf16",
                "PARTIAL_O": "*fp32", "PARTIAL_LSE": "*fp32", "COUNTS": "*i32", "QO_INDPTR": "*i32",
                "KV_INDPTR": "*i32", "MASK_OFFSETS": "*i32", "W_REQ": "*i32", "W_MBLK": "*i32",
                "W_KV_START": "*i32", "W_KV_END": "*i32", "W_FULL_END": "*i32", "W_NSPLIT": "*i32"}
    strides = {"stride_qn": "i32", "stride_qh": "i32", "stride_kv": "i32", "stride_on": "i32", "stride_oh": "i32"}
    scalars = {"num_heads": "i32", "qk_scale": "fp32", **strides}
    constexprs = dict(D=dims.head_dim, D_MAIN=dims.d_main, D_TAIL=dims.d_tail, DV=dims.v_head_dim,
                      BLOCK_DV=dims.block_dv, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                      CAUSAL=causal, UPCAST=False)
    signature = {name: pointers.get(name) or scalars.get(name) or "constexpr" for name in fn.arg_names}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in (*pointers, *strides)}
    src = ASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": config.num_warps, "num_stages": config.num_stages})
