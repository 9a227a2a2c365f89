"""Gluon (sm_90) kernels of MLA tree-verify attention; launched by ``kernel.hopper``.

``_producer`` (worker partition, 4 warps) gathers 64-key tiles of KV rows into a shared ring with
``cp.async``; ``_mla_verify_hopper_split_kernel`` (64 packed rows, two consumer warpgroups) and
``_mla_verify_hopper_keys_as_m_kernel`` (up to 16 packed rows, one consumer warpgroup, keys as
the wgmma M) consume it. Shapes of every pointer argument: ``_mla_verify_hopper_split_kernel``.
Importing this module needs Triton with Gluon (3.5+).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.jit
def _tile_slots(KV_INDICES, kv_base, keys, ok, contig, slot_base, CONTIGUOUS: gl.constexpr):
    """Slots of a tile's keys: ``slot_base + key`` for keys in the request's contiguous run
    (``CONTIGUOUS`` and ``key < contig``: no index load), else from ``kv_indices``."""
    if CONTIGUOUS:
        in_run = keys < contig
        gathered = gl.load(KV_INDICES + kv_base + keys, mask=ok & (keys >= contig), other=0)
        return gl.where(in_run, slot_base + keys, gathered)
    else:
        return gl.load(KV_INDICES + kv_base + keys, mask=ok, other=0)

@gluon.jit
def _producer(KV, KV_INDICES, KV_INDPTR, W_REQ, W_KV_START, W_KV_END, kmain, ktail, full, empty,
              BLOCK_N: gl.constexpr, D_MAIN: gl.constexpr, D_TAIL: gl.constexpr, HEAD_DIM: gl.constexpr,
              STAGES: gl.constexpr, KV_START=None, KV_CONTIG=None):
    """Gather the work item's KV rows, tile by tile, into the shared ring. KV_START, KV_CONTIG:
    int32 [B] or None (compiled out), the contiguous fast path (``_tile_slots``)."""
    g_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    row_layout: gl.constexpr = gl.SliceLayout(1, g_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, g_layout)
    w = gl.program_id(0)
    b = gl.load(W_REQ + w)
    kv_start = gl.load(W_KV_START + w)
    kv_end = gl.load(W_KV_END + w)
    kv_base = gl.load(KV_INDPTR + b)
    n_tiles = gl.cdiv(kv_end - kv_start, BLOCK_N)
    offs_n = gl.arange(0, BLOCK_N, layout=row_layout)
    offs_main = gl.arange(0, D_MAIN, layout=col_layout)
    offs_tail = D_MAIN + gl.arange(0, D_TAIL, layout=col_layout)
    keys = kv_start + offs_n
    ok = keys < kv_end
    contig = 0
    slot_base = 0
    if KV_CONTIG is not None:
        contig = gl.load(KV_CONTIG + b)
        slot_base = gl.load(KV_START + b)
    slot = _tile_slots(KV_INDICES, kv_base, keys, ok, contig, slot_base, KV_CONTIG is not None)
    for i in range(n_tiles):
        s = i % STAGES
        phase = (i // STAGES) & 1
        cur_slot = slot
        cur_ok = ok
        # Next tile's indices before waiting for a free slot.
        keys = kv_start + (i + 1) * BLOCK_N + offs_n
        ok = keys < kv_end
        slot = _tile_slots(KV_INDICES, kv_base, keys, ok, contig, slot_base, KV_CONTIG is not None)
        row = KV + cur_slot.to(gl.int64) * HEAD_DIM
        mbarrier.wait(empty.index(s), phase ^ 1)
        async_copy.async_copy_global_to_shared(
            kmain.index(s), row[:, None] + offs_main[None, :], mask=cur_ok[:, None],
            eviction_policy="evict_first")
        async_copy.async_copy_global_to_shared(
            ktail.index(s), row[:, None] + offs_tail[None, :], mask=cur_ok[:, None],
            eviction_policy="evict_first")
        async_copy.mbarrier_arrive(full.index(s), increment_count=False)

@gluon.jit
def _mask_scores(sc, start, kv_end, prefix_len, num_draft, t_idx, row_ok, TREE_MASK, mask_offset,
                 s_layout: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    cols = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    col_ok = cols < kv_end
    u = cols - prefix_len
    is_draft = (u >= 0) & col_ok
    if CAUSAL:
        draft_ok = u[None, :] <= t_idx[:, None]
    else:
        bits = gl.load(TREE_MASK + mask_offset + t_idx[:, None] * num_draft + u[None, :],
                       mask=row_ok[:, None] & is_draft[None, :], other=0)
        draft_ok = bits != 0
    visible = col_ok[None, :] & ((u[None, :] < 0) | draft_ok)
    return gl.where(visible, sc, float("-inf"))

@gluon.jit
def _softmax_tile(sc, m_i, l_i, start, kv_end, full_end, prefix_len, num_draft, t_idx, row_ok, TREE_MASK,
                  mask_offset, qk_scale, s_layout: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """Online-softmax step for one score tile (log2 domain): returns P, new max, new sums, rescale.
    The sums are kept per score element (l_i: [BLOCK_M, BLOCK_N]) and reduced once per work item:
    a row sum per tile would be a second cross-warpgroup reduction (shared memory and barriers)."""
    sc = sc * qk_scale
    if start + BLOCK_N > full_end:
        sc = _mask_scores(sc, start, kv_end, prefix_len, num_draft, t_idx, row_ok, TREE_MASK, mask_offset,
                          s_layout, BLOCK_N, CAUSAL)
    m_new = gl.maximum(m_i, gl.max(sc, 1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw no key yet
    p = gl.exp2(sc - m_safe[:, None])
    alpha = gl.exp2(m_i - m_safe)
    l_i = l_i * alpha[:, None] + p
    return p, m_new, l_i, alpha

@gluon.jit
def _item_header(W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
                 num_heads):
    """The program's work item (request, row block, key range, split count) and its request's
    lengths, as scalars: (w, mblk, kv_start, kv_end, full_end, nsplit, qo_start, num_draft,
    prefix_len, mask_offset, num_rows, kv_base)."""
    w = gl.program_id(0)
    b = gl.load(W_REQ + w)
    mblk = gl.load(W_MBLK + w)
    kv_start = gl.load(W_KV_START + w)
    kv_end = gl.load(W_KV_END + w)
    full_end = gl.load(W_FULL_END + w)
    nsplit = gl.load(W_NSPLIT + w)
    qo_start = gl.load(QO_INDPTR + b)
    num_draft = gl.load(QO_INDPTR + b + 1) - qo_start
    kv_base = gl.load(KV_INDPTR + b)
    kv_len = gl.load(KV_INDPTR + b + 1) - kv_base
    mask_offset = gl.load(MASK_OFFSETS + b)
    return (w, mblk, kv_start, kv_end, full_end, nsplit, qo_start, num_draft, kv_len - num_draft, mask_offset,
            num_draft * num_heads, kv_base)


@gluon.jit
def _work_item(Q, QO_INDPTR, KV_INDPTR, MASK_OFFSETS, W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
               num_heads, stride_qn, stride_qh, q_main, q_tail,
               BLOCK_M: gl.constexpr, D_MAIN: gl.constexpr, D_TAIL: gl.constexpr, NUM_WARPS: gl.constexpr):
    """The consumer's work item: its header (``_item_header``); its Q block stored into ``q_main`` /
    ``q_tail`` (rows past the request's packed rows are zero) and fenced for wgmma."""
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0])
    (w, mblk, kv_start, kv_end, full_end, nsplit, qo_start, num_draft, prefix_len, mask_offset, num_rows,
     _) = _item_header(W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
                       num_heads)

    qr = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, q_layout))
    q_ok = qr < num_rows
    q_row = Q + (qo_start + qr // num_heads).to(gl.int64) * stride_qn + (qr % num_heads) * stride_qh
    offs_main = gl.arange(0, D_MAIN, layout=gl.SliceLayout(0, q_layout))
    offs_tail = D_MAIN + gl.arange(0, D_TAIL, layout=gl.SliceLayout(0, q_layout))
    q_main.store(gl.load(q_row[:, None] + offs_main[None, :], mask=q_ok[:, None], other=0.0))
    q_tail.store(gl.load(q_row[:, None] + offs_tail[None, :], mask=q_ok[:, None], other=0.0))
    fence_async_shared()
    gl.thread_barrier()
    return w, mblk, kv_start, kv_end, full_end, nsplit, qo_start, num_draft, prefix_len, mask_offset, num_rows

@gluon.jit
def _consumer(Q, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
              W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
              num_heads, qk_scale, stride_qn, stride_qh, stride_on, stride_oh,
              q_main, q_tail, kmain, ktail, p_smem, full, empty,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_MAIN: gl.constexpr, D_TAIL: gl.constexpr,
              DV: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, NUM_WARPS: gl.constexpr):
    """Scores, online softmax and P·V for one work item; writes the output or a split partial."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, BLOCK_N // 2, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, DV // 2, 16])
    srow: gl.constexpr = gl.SliceLayout(1, s_layout)
    orow: gl.constexpr = gl.SliceLayout(1, o_layout)

    w, mblk, kv_start, kv_end, full_end, nsplit, qo_start, num_draft, prefix_len, mask_offset, num_rows = _work_item(
        Q, QO_INDPTR, KV_INDPTR, MASK_OFFSETS, W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
        num_heads, stride_qn, stride_qh, q_main, q_tail, BLOCK_M, D_MAIN, D_TAIL, NUM_WARPS)

    rows = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=srow)
    row_ok = rows < num_rows
    t_idx = rows // num_heads

    acc = gl.zeros([BLOCK_M, DV], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=srow)
    l_i = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)  # row sums per score column
    n_tiles = gl.cdiv(kv_end - kv_start, BLOCK_N)
    for i in range(n_tiles):
        s = i % STAGES
        phase = (i // STAGES) & 1
        mbarrier.wait(full.index(s), phase)
        fence_async_shared()  # cp.async (generic proxy) writes -> wgmma (async proxy) reads
        km = kmain.index(s)
        kt = ktail.index(s)
        sacc = warpgroup_mma(q_tail, kt.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        sacc = warpgroup_mma(q_main, km.permute((1, 0)), sacc, is_async=True)
        sc = warpgroup_mma_wait(0, deps=[sacc])
        p, m_i, l_i, alpha = _softmax_tile(sc, m_i, l_i, kv_start + i * BLOCK_N, kv_end, full_end,
                                           prefix_len, num_draft, t_idx, row_ok, TREE_MASK, mask_offset,
                                           qk_scale, s_layout, BLOCK_N, CAUSAL)
        p_smem.store(p.to(gl.bfloat16))
        fence_async_shared()
        gl.thread_barrier()  # both warpgroups' halves of P are in shared memory
        acc = acc * gl.convert_layout(alpha, orow)[:, None]
        acc = warpgroup_mma(p_smem, km, acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
        gl.thread_barrier()  # every warp is done with this slot and with P
        mbarrier.arrive(empty.index(s), count=1)

    l_i = gl.sum(l_i, 1)
    l_o = gl.convert_layout(l_i, orow)
    l_safe = gl.where(l_o == 0.0, 1.0, l_o)
    o_val = acc / l_safe[:, None]
    o_rows = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=orow)
    o_ok = o_rows < num_rows
    offs_dv = gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))
    if nsplit == 1:
        o_ptr = OUT + (qo_start + o_rows // num_heads).to(gl.int64) * stride_on + (o_rows % num_heads) * stride_oh
        gl.store(o_ptr[:, None] + offs_dv[None, :], o_val.to(OUT.dtype.element_ty), mask=o_ok[:, None])
    else:
        p_row = w.to(gl.int64) * BLOCK_M + gl.arange(0, BLOCK_M, layout=orow)
        gl.store(PARTIAL_O + p_row[:, None] * DV + offs_dv[None, :], o_val)
        lse = gl.where(l_i == 0.0, float("-inf"), m_i + gl.log2(gl.where(l_i == 0.0, 1.0, l_i)))
        gl.store(PARTIAL_LSE + w.to(gl.int64) * BLOCK_M + gl.arange(0, BLOCK_M, layout=srow), lse)

@gluon.jit
def _shared_ring(BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_MAIN: gl.constexpr, D_TAIL: gl.constexpr,
                 STAGES: gl.constexpr, PRODUCER_WARPS: gl.constexpr):
    """Both split kernels' shared memory but P: the Q block (main and rope parts), the ring of
    ``STAGES`` KV tiles, and its "full" (one arrival per producer thread) and "empty" mbarriers."""
    big: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_main = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D_MAIN], big)
    q_tail = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D_TAIL], big)
    kmain = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D_MAIN], big)
    ktail = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D_TAIL], big)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(full.index(s), count=PRODUCER_WARPS * 32)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    return q_main, q_tail, kmain, ktail, full, empty

@gluon.jit
def _mla_verify_hopper_split_kernel(
    Q, KV, KV_INDICES, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE,
    COUNTS, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
    W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
    num_heads, qk_scale, stride_qn, stride_qh, stride_on, stride_oh,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_MAIN: gl.constexpr, D_TAIL: gl.constexpr,
    DV: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
    PRODUCER_WARPS: gl.constexpr, PRODUCER_REGS: gl.constexpr, NUM_WARPS: gl.constexpr,
    KV_START=None, KV_CONTIG=None,
):
    """Grid: (num_work,). Q: [N, H, 576] bf16; KV: [slots, 576] bf16 (contiguous rows);
    OUT: [N, H, 512]; PARTIAL_O: fp32 [num_work, 64, 512]; PARTIAL_LSE: fp32 [num_work, 64] (log2).
    COUNTS: int32 [2], COUNTS[0] = num_work: programs past it (a grid sized for the largest batch a
    CUDA graph may replay) exit before allocating anything, without writing."""
    gl.static_assert(D_MAIN == DV, "V is the 512-wide latent part of the row")
    if gl.program_id(0) >= gl.load(COUNTS):
        return
    HEAD_DIM: gl.constexpr = D_MAIN + D_TAIL
    q_main, q_tail, kmain, ktail, full, empty = _shared_ring(BLOCK_M, BLOCK_N, D_MAIN, D_TAIL, STAGES, PRODUCER_WARPS)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], gl.bfloat16)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_N], p_layout)

    gl.warp_specialize(
        [
            (_consumer, (Q, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
                         W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
                         num_heads, qk_scale, stride_qn, stride_qh, stride_on, stride_oh,
                         q_main, q_tail, kmain, ktail, p_smem, full, empty,
                         BLOCK_M, BLOCK_N, D_MAIN, D_TAIL, DV, STAGES, CAUSAL, NUM_WARPS)),
            (_producer, (KV, KV_INDICES, KV_INDPTR, W_REQ, W_KV_START, W_KV_END, kmain, ktail, full, empty,
                         BLOCK_N, D_MAIN, D_TAIL, HEAD_DIM, STAGES, KV_START, KV_CONTIG)),
        ],
        [PRODUCER_WARPS],
        [PRODUCER_REGS],
    )



@gluon.jit
def _consumer_keys_as_m(Q, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
                        W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
                        num_heads, qk_scale, stride_qn, stride_qh, stride_on, stride_oh,
                        q_main, q_tail, kmain, ktail, p_smem, full, empty,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_MAIN: gl.constexpr,
                        D_TAIL: gl.constexpr, DV: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                        NUM_WARPS: gl.constexpr):
    """One warpgroup, keys as the wgmma M: S^T = K Q^T ([keys, rows]), O^T += V^T P^T ([512, rows]).
    For few packed rows (BLOCK_M <= 32) this does a quarter of the padded tensor work of the
    64-row tile and keeps Q and P small in shared memory."""
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    ot_layout: gl.constexpr = st_layout
    scol: gl.constexpr = gl.SliceLayout(0, st_layout)
    skey: gl.constexpr = gl.SliceLayout(1, st_layout)

    w, mblk, kv_start, kv_end, full_end, nsplit, qo_start, num_draft, prefix_len, mask_offset, num_rows = _work_item(
        Q, QO_INDPTR, KV_INDPTR, MASK_OFFSETS, W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
        num_heads, stride_qn, stride_qh, q_main, q_tail, BLOCK_M, D_MAIN, D_TAIL, NUM_WARPS)

    rows = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=scol)
    row_ok = rows < num_rows
    t_idx = rows // num_heads

    acc = gl.zeros([DV, BLOCK_M], gl.float32, layout=ot_layout)
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=scol)
    l_i = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)  # sums per score element, as above
    n_tiles = gl.cdiv(kv_end - kv_start, BLOCK_N)
    for i in range(n_tiles):
        s = i % STAGES
        mbarrier.wait(full.index(s), (i // STAGES) & 1)
        fence_async_shared()
        km = kmain.index(s)
        sacc = warpgroup_mma(ktail.index(s), q_tail.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        sacc = warpgroup_mma(km, q_main.permute((1, 0)), sacc, is_async=True)
        st = warpgroup_mma_wait(0, deps=[sacc])
        st = st * qk_scale
        start = kv_start + i * BLOCK_N
        if start + BLOCK_N > full_end:
            keys = start + gl.arange(0, BLOCK_N, layout=skey)
            key_ok = keys < kv_end
            u = keys - prefix_len
            is_draft = (u >= 0) & key_ok
            if CAUSAL:
                draft_ok = u[:, None] <= t_idx[None, :]
            else:
                bits = gl.load(TREE_MASK + mask_offset + t_idx[None, :] * num_draft + u[:, None],
                               mask=row_ok[None, :] & is_draft[:, None], other=0)
                draft_ok = bits != 0
            visible = key_ok[:, None] & ((u[:, None] < 0) | draft_ok)
            st = gl.where(visible, st, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(st, 0))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        pt = gl.exp2(st - m_safe[None, :])
        alpha = gl.exp2(m_i - m_safe)
        l_i = l_i * alpha[None, :] + pt
        m_i = m_new
        p_smem.store(pt.to(gl.bfloat16))
        fence_async_shared()
        gl.thread_barrier()
        acc = acc * alpha[None, :]
        acc = warpgroup_mma(km.permute((1, 0)), p_smem, acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
        gl.thread_barrier()
        mbarrier.arrive(empty.index(s), count=1)

    l_i = gl.sum(l_i, 0)
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    o_val = acc / l_safe[None, :]
    o_rows = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=scol)
    o_ok = o_rows < num_rows
    offs_dv = gl.arange(0, DV, layout=skey)
    if nsplit == 1:
        o_ptr = OUT + (qo_start + o_rows // num_heads).to(gl.int64) * stride_on + (o_rows % num_heads) * stride_oh
        gl.store(o_ptr[None, :] + offs_dv[:, None], o_val.to(OUT.dtype.element_ty), mask=o_ok[None, :])
    else:
        p_row = w.to(gl.int64) * BLOCK_M + gl.arange(0, BLOCK_M, layout=scol)
        gl.store(PARTIAL_O + p_row[None, :] * DV + offs_dv[:, None], o_val)
        lse = gl.where(l_i == 0.0, float("-inf"), m_i + gl.log2(l_safe))
        gl.store(PARTIAL_LSE + p_row, lse)

@gluon.jit
def _mla_verify_hopper_keys_as_m_kernel(
    Q, KV, KV_INDICES, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE,
    COUNTS, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
    W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
    num_heads, qk_scale, stride_qn, stride_qh, stride_on, stride_oh,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_MAIN: gl.constexpr, D_TAIL: gl.constexpr,
    DV: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
    PRODUCER_WARPS: gl.constexpr, PRODUCER_REGS: gl.constexpr, NUM_WARPS: gl.constexpr,
    KV_START=None, KV_CONTIG=None,
):
    """As ``_mla_verify_hopper_split_kernel`` for BLOCK_M <= 32 packed rows, with a one-warpgroup
    keys-as-M consumer (``_consumer_keys_as_m``); PARTIAL_O: fp32 [num_work, BLOCK_M, 512].
    Programs at or past COUNTS[0] exit without writing, as in the 64-row kernel."""
    gl.static_assert(D_MAIN == DV, "V is the 512-wide latent part of the row")
    if gl.program_id(0) >= gl.load(COUNTS):
        return
    HEAD_DIM: gl.constexpr = D_MAIN + D_TAIL
    q_main, q_tail, kmain, ktail, full, empty = _shared_ring(BLOCK_M, BLOCK_N, D_MAIN, D_TAIL, STAGES, PRODUCER_WARPS)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], gl.bfloat16)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, BLOCK_M], p_layout)  # Pᵀ: keys x rows

    gl.warp_specialize(
        [
            (_consumer_keys_as_m, (Q, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
                                   W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
                                   num_heads, qk_scale, stride_qn, stride_qh, stride_on, stride_oh,
                                   q_main, q_tail, kmain, ktail, p_smem, full, empty,
                                   BLOCK_M, BLOCK_N, D_MAIN, D_TAIL, DV, STAGES, CAUSAL, NUM_WARPS)),
            (_producer, (KV, KV_INDICES, KV_INDPTR, W_REQ, W_KV_START, W_KV_END, kmain, ktail, full, empty,
                         BLOCK_N, D_MAIN, D_TAIL, HEAD_DIM, STAGES, KV_START, KV_CONTIG)),
        ],
        [PRODUCER_WARPS],
        [PRODUCER_REGS],
    )
