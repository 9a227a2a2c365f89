"""The FlashMLA "seesaw" organisation of the Hopper split kernel, in Gluon (dispatched from 128 packed rows).

``_mla_verify_hopper_seesaw_kernel`` serves the same work items, arguments and outputs as
``kernel.hopper_gluon._mla_verify_hopper_split_kernel`` (64 packed rows, 64-key tiles, fp32
partials + log2-sum-exp per split), organised as FlashMLA's dense sm90 decode kernel
(``csrc/sm90/decode/dense/splitkv_mla.cuh``), with cp.async gathers of page_size=1 rows in place
of its TMA loads, and the same contiguous fast path as the producer of the other kernels
(``KV_START`` / ``KV_CONTIG``, compiled out when not given):

* Two warpgroups, no producer partition. The work item's 64-key tiles are taken in pairs: WG0 (the
  default partition) computes the full 64 x 64 scores S = Q Kᵀ of the even tile, WG1 (a worker
  partition) those of the odd tile: no duplicated Q·Kᵀ and no cross-warpgroup row reduction.
  Each warpgroup owns half of the 512 output columns (WG0 0..255, WG1 256..511) for every tile.
* Online softmax across the pair (the seesaw): WG0 publishes its running max, rescale factor and
  P0 (bf16, shared memory); WG1 continues the max from it, publishes its own factor and P1. Each
  adds P_own · V_half(own tile) and P_other · V_half(other tile) into its half of O, WG0 after
  rescaling P0 in place to WG1's max (as FlashMLA's ``wg0_scale_rP0``). One warpgroup's softmax
  runs while the other's wgmma does.
* Loads: a tile is gathered in two halves with their own "full" mbarriers: half A = latent columns
  0..255 (V_left, last read by WG0), half B = latent 256..511 (V_right, last read by WG1) plus the
  64 rope columns. The warpgroup that reads a half last refills it (cp.async, 16 per thread) with
  the tile two ahead as soon as its wgmma on it completes, as FlashMLA's warpgroups each relaunch
  the TMA of the 64-column tiles they were the last to read. The two ring slots alternate between
  even and odd tiles from pair to pair, so each warpgroup's next tile arrives half first in the
  order its S takes them (WG0: half B, then A; WG1: A, then B); the next pair's slot indices are
  loaded at the start of a pair.
* Shared memory: Q latent 64 KB, two 72 KB tiles, P0 and P1 8 KB each, six 64-float vectors and
  the barriers: about 226 KB of the 227 KB (232,448 B) a block may use. Q's rope part is not kept
  in shared memory: WG0 stages it in P1's buffer, both warpgroups load it into registers (wgmma's A
  operand) before P1's buffer is first written (FlashMLA's ``rQ8`` / ``sP1``).

Decisions:
- No producer partition: with one (4 warps, 40-56 registers) the two consumer warpgroups are held to
  224-232 registers and spilled 1-3 KB in every arrangement tried (sm_90 compile); without it
  each thread may use 255, as FlashMLA's 256-thread kernel does. The price is that each warpgroup
  issues 16-20 cp.async per half it refills.
- Per-row softmax sums (``gl.sum``): a warpgroup owns whole rows of its S, so the row sum stays in
  one warp (the two-warpgroup kernel keeps per-element sums to avoid a cross-warpgroup reduction).
- Tiles are always processed in pairs: with an odd tile count the last pair's odd tile is past the
  work item, gathered with every row masked (zero-filled, no DRAM reads) and fully masked in the
  softmax, so WG1 publishes rescale factor 1 and P1 = 0. One wasted tile of math per such item
  instead of branches around the wgmmas: an ``if`` that carries the 128-register O accumulator
  made ptxas copy and spill it.
- The ring slots alternate (the slot index depends on the pair): with fixed slots the wgmma
  descriptors were loop-invariant, hoisted out of the loop and spilled.
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

from kernel.hopper_gluon import _item_header, _tile_slots

# mbarrier slots (one [NUM_BARRIERS, 1] allocation)
FULL_A = gl.constexpr(0)  # + ring slot: half A (latent 0..255) landed (one arrival per WG0 thread)
FULL_B = gl.constexpr(2)  # + ring slot: half B (latent 256..511 + rope) landed (one arrival per WG1 thread)
Q_READY = gl.constexpr(4)  # WG0 stored Q (latent in q_main, rope staged in p1_smem)
S0_READY = gl.constexpr(5)  # WG0 published its running max, rescale factor and P0 (at its max)
S1_READY = gl.constexpr(6)  # WG1 published its running max, rescale factor and P1
P0_READY = gl.constexpr(7)  # WG0 rescaled P0 in p0_smem to WG1's max
P0_FREE = gl.constexpr(8)  # WG1's wgmma reading p0_smem finished
L0_READY = gl.constexpr(9)  # WG0's softmax sums are in l0_s (epilogue)
L1_READY = gl.constexpr(10)  # WG1's softmax sums are in l1_s
NUM_BARRIERS = gl.constexpr(11)
WG_THREADS = gl.constexpr(128)


@gluon.jit
def _tree_words(TREE_MASK, mask_offset, num_draft, t_idx, row_ok, s_layout: gl.constexpr, BLOCK_N: gl.constexpr):
    """int64 [BLOCK_M] (row layout of ``s_layout``): bit u of row r says whether draft u is visible to
    the row's draft token (tree_mask[t, u]); T <= 64 drafts, so one word holds a row's drafts. Loaded
    once per work item, before the O accumulator is live: per tile, a [64, 64] gather of mask bytes
    (32 64-bit addresses per thread) next to O and S is what made the tail tiles spill."""
    u = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    bits = gl.load(TREE_MASK + mask_offset + t_idx[:, None] * num_draft + u[None, :],
                   mask=row_ok[:, None] & (u < num_draft)[None, :], other=0)
    return gl.sum(gl.where(bits != 0, gl.full(bits.shape, 1, gl.int64, s_layout) << u[None, :].to(gl.int64), 0), 1)


@gluon.jit
def _row_words(TREE_MASK, mask_offset, num_draft, prefix_len, kv_end, t_idx, row_ok, s_layout: gl.constexpr,
               BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """Per-row masking state for ``_mask_tile`` (int64 [BLOCK_M]): causal, the last key a row sees
    (prefix_len + t); with a tree, its tree word (zero when the item does not reach the drafts)."""
    if CAUSAL:
        words = (prefix_len + t_idx).to(gl.int64)
    else:
        words = (t_idx * 0).to(gl.int64)
        if kv_end > prefix_len:  # the item reaches the drafts
            words = _tree_words(TREE_MASK, mask_offset, num_draft, t_idx, row_ok, s_layout, BLOCK_N)
    return words


@gluon.jit
def _mask_tile(sc, start, kv_end, prefix_len, words, s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
               CAUSAL: gl.constexpr):
    """``sc`` with -inf where key ``start + column`` is invisible: past the work item's keys, or a
    draft the row's draft token may not see. ``words``: int64 [BLOCK_M], the tree words of
    ``_tree_words``, or (causal) the last visible key of each row, prefix_len + t."""
    cols = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    if CAUSAL:
        visible = (cols < kv_end)[None, :] & (cols[None, :].to(gl.int64) <= words[:, None])
    else:
        u = cols - prefix_len  # draft index where >= 0
        shift = gl.minimum(gl.maximum(u, 0), BLOCK_N - 1).to(gl.int64)
        draft_ok = ((words[:, None] >> shift[None, :]) & 1) != 0
        visible = (cols < kv_end)[None, :] & ((u < 0)[None, :] | draft_ok)
    return gl.where(visible, sc, float("-inf"))


@gluon.jit
def _contiguous_run(W_REQ, KV_START, KV_CONTIG):
    """(keys in the request's contiguous run, its first slot): (0, 0) without the fast path."""
    contig = 0
    slot_base = 0
    if KV_CONTIG is not None:
        b = gl.load(W_REQ + gl.program_id(0))
        contig = gl.load(KV_CONTIG + b)
        slot_base = gl.load(KV_START + b)
    return contig, slot_base


@gluon.jit
def _slots(KV_INDICES, kv_base, kv_start, kv_end, tile, contig, slot_base, g_layout: gl.constexpr,
           BLOCK_N: gl.constexpr, CONTIGUOUS: gl.constexpr):
    """Slot indices [BLOCK_N] of ``tile`` of the item (row layout of ``g_layout``) and which are real
    keys; keys of the request's contiguous run (``CONTIGUOUS``: ``_contiguous_run``) at ``slot_base + key``,
    without index loads."""
    keys = kv_start + tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, g_layout))
    ok = keys < kv_end
    return _tile_slots(KV_INDICES, kv_base, keys, ok, contig, slot_base, CONTIGUOUS), ok


@gluon.jit
def _refill(KV, kmain, ktail, bars, buf, half: gl.constexpr, slot, ok, g_layout: gl.constexpr,
            D_MAIN: gl.constexpr, D_TAIL: gl.constexpr):
    """cp.async one half of a tile's rows (``slot``; masked rows zero-filled, no DRAM read) into ring
    slot ``buf`` and arrive (per thread, when its copies land) on the half's "full" barrier. The
    caller is the last reader of that half of the slot, past its wgmma wait."""
    HALF: gl.constexpr = D_MAIN // 2
    row = KV + slot.to(gl.int64) * (D_MAIN + D_TAIL)
    cols = gl.arange(0, HALF, layout=gl.SliceLayout(0, g_layout))
    async_copy.async_copy_global_to_shared(kmain.index(buf).slice(half * HALF, HALF, dim=1),
                                           row[:, None] + (half * HALF + cols)[None, :], mask=ok[:, None],
                                           eviction_policy="evict_first")
    if half == 0:
        async_copy.mbarrier_arrive(bars.index(FULL_A + buf), increment_count=False)
    else:
        tail = D_MAIN + gl.arange(0, D_TAIL, layout=gl.SliceLayout(0, g_layout))
        async_copy.async_copy_global_to_shared(ktail.index(buf), row[:, None] + tail[None, :], mask=ok[:, None],
                                               eviction_policy="evict_first")
        async_copy.mbarrier_arrive(bars.index(FULL_B + buf), increment_count=False)


@gluon.jit
def _prime(KV, KV_INDICES, W_REQ, KV_START, KV_CONTIG, kmain, ktail, bars, kv_base, kv_start, kv_end,
           half: gl.constexpr, g_layout: gl.constexpr, BLOCK_N: gl.constexpr, D_MAIN: gl.constexpr,
           D_TAIL: gl.constexpr):
    """A warpgroup's start: its ``half`` of the first two tiles into ring slots 0 and 1 (the other
    warpgroup loads the other half); returns the request's contiguous run (``_contiguous_run``)."""
    contig, slot_base = _contiguous_run(W_REQ, KV_START, KV_CONTIG)
    for tile in gl.static_range(2):
        slot, ok = _slots(KV_INDICES, kv_base, kv_start, kv_end, tile, contig, slot_base, g_layout, BLOCK_N,
                          KV_CONTIG is not None)
        _refill(KV, kmain, ktail, bars, tile, half, slot, ok, g_layout, D_MAIN, D_TAIL)
    return contig, slot_base


@gluon.jit
def _q_view(q_main, j, num_heads):
    """``q_main`` [1, BLOCK_M, D_MAIN] as [BLOCK_M, D_MAIN], indexed with a zero the compiler cannot
    prove constant or loop-invariant (``j * num_heads >> 30``: j < 2**14 tiles, num_heads < 2**16).
    Without it the 32 wgmma descriptors of Q (one per 16-wide K step) are hoisted out of the tile
    loop and held in 64 registers, which spilled; computed in the loop they cost a few integer adds."""
    return q_main.index((j * num_heads) >> 30)


@gluon.jit
def _score_half(q_main, q_rope, km, kt, bars, s, half: gl.constexpr, buf, phase,
                use_acc: gl.constexpr, HALF: gl.constexpr):
    """Issue S (+)= Q Kᵀ over one half of the tile (0: latent 0..HALF; 1: latent HALF..2*HALF plus
    the rope columns, Q's rope part from registers) once the half's "full" barrier passes."""
    if half == 0:
        mbarrier.wait(bars.index(FULL_A + buf), phase)
    else:
        mbarrier.wait(bars.index(FULL_B + buf), phase)
    fence_async_shared()  # cp.async (generic proxy) writes -> wgmma (async proxy) reads
    s = warpgroup_mma(q_main.slice(half * HALF, HALF, dim=1), km.slice(half * HALF, HALF, dim=1).permute((1, 0)),
                      s, use_acc=use_acc, is_async=True)
    if half == 1:
        s = warpgroup_mma(q_rope, kt.permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _scores(q_main, q_rope, kmain, ktail, bars, first: gl.constexpr, second: gl.constexpr, buf, phase,
            s_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr):
    """S [BLOCK_M, BLOCK_N] = Q Kᵀ of the tile in ring slot ``buf``, half ``first`` then half
    ``second``, each issued as soon as it has landed."""
    km = kmain.index(buf)
    kt = ktail.index(buf)
    s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    s = _score_half(q_main, q_rope, km, kt, bars, s, first, buf, phase, False, HALF)
    s = _score_half(q_main, q_rope, km, kt, bars, s, second, buf, phase, True, HALF)
    return warpgroup_mma_wait(0, deps=[s])


@gluon.jit
def _signal(bars, slot: gl.constexpr):
    """Every warp of this warpgroup is past its shared-memory writes (fenced by the caller where wgmma
    reads them): one arrival on ``bars[slot]``."""
    gl.thread_barrier()
    mbarrier.arrive(bars.index(slot), count=1)


@gluon.jit
def _epilogue(o, l_own, m_fin, l_own_s, l_other_s, bars, mine: gl.constexpr, theirs: gl.constexpr, col0: gl.constexpr,
              write_lse: gl.constexpr, OUT, PARTIAL_O, PARTIAL_LSE, w, mblk, nsplit, qo_start, num_rows, num_heads,
              stride_on, stride_oh, s_layout: gl.constexpr, o_layout: gl.constexpr, BLOCK_M: gl.constexpr,
              DV: gl.constexpr, HALF: gl.constexpr):
    """Sum both warpgroups' softmax sums, then write this warpgroup's HALF output columns from
    ``col0`` (normalized output for an unsplit item, else the fp32 partial; WG0 also the LSE)."""
    srow: gl.constexpr = gl.SliceLayout(1, s_layout)
    orow: gl.constexpr = gl.SliceLayout(1, o_layout)
    l_own_s.store(l_own)
    _signal(bars, mine)
    mbarrier.wait(bars.index(theirs), 0)
    l_tot = l_own + l_other_s.load(srow)
    l_safe = gl.where(l_tot == 0.0, 1.0, l_tot)
    o_val = o / gl.convert_layout(l_safe, orow)[:, None]
    o_rows = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=orow)
    offs = col0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, o_layout))
    if nsplit == 1:
        o_ptr = OUT + (qo_start + o_rows // num_heads).to(gl.int64) * stride_on + (o_rows % num_heads) * stride_oh
        gl.store(o_ptr[:, None] + offs[None, :], o_val.to(OUT.dtype.element_ty), mask=(o_rows < num_rows)[:, None])
    else:
        p_row = w.to(gl.int64) * BLOCK_M + gl.arange(0, BLOCK_M, layout=orow)
        gl.store(PARTIAL_O + p_row[:, None] * DV + offs[None, :], o_val)
        if write_lse:
            lse = gl.where(l_tot == 0.0, float("-inf"), m_fin + gl.log2(l_safe))
            gl.store(PARTIAL_LSE + w.to(gl.int64) * BLOCK_M + gl.arange(0, BLOCK_M, layout=srow), lse)


@gluon.jit
def _wg0(Q, KV, KV_INDICES, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
         W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
         num_heads, qk_scale, stride_qn, stride_qh, stride_on, stride_oh,
         q_main, kmain, ktail, p0_smem, p1_smem, m0_s, a0_s, m1_s, a1_s, l0_s, l1_s, bars,
         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_MAIN: gl.constexpr, D_TAIL: gl.constexpr,
         DV: gl.constexpr, CAUSAL: gl.constexpr, KV_START, KV_CONTIG):
    """Even tiles, output columns 0..255, refills of half A; loads Q for both warpgroups."""
    HALF: gl.constexpr = DV // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    g_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    srow: gl.constexpr = gl.SliceLayout(1, s_layout)
    orow: gl.constexpr = gl.SliceLayout(1, o_layout)
    (w, mblk, kv_start, kv_end, full_end, nsplit, qo_start, num_draft, prefix_len, mask_offset, num_rows,
     kv_base) = _item_header(W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT, QO_INDPTR, KV_INDPTR,
                             MASK_OFFSETS, num_heads)
    # Half A of the first two tiles (ring slots 0 and 1); WG1 loads their halves B.
    contig, slot_base = _prime(KV, KV_INDICES, W_REQ, KV_START, KV_CONTIG, kmain, ktail, bars, kv_base, kv_start,
                               kv_end, 0, g_layout, BLOCK_N, D_MAIN, D_TAIL)

    # Q: latent part into q_main, rope part staged in p1_smem (free until WG1's first P), 64 columns a pass.
    qr = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, g_layout))
    q_row = Q + (qo_start + qr // num_heads).to(gl.int64) * stride_qn + (qr % num_heads) * stride_qh
    q_ok = (qr < num_rows)[:, None]
    cols = gl.arange(0, D_TAIL, layout=gl.SliceLayout(0, g_layout))
    for c in gl.static_range(D_MAIN // D_TAIL):
        q_main.index(0).slice(c * D_TAIL, D_TAIL, dim=1).store(
            gl.load(q_row[:, None] + (c * D_TAIL + cols)[None, :], mask=q_ok, other=0.0))
    p1_smem.store(gl.load(q_row[:, None] + (D_MAIN + cols)[None, :], mask=q_ok, other=0.0))
    fence_async_shared()
    gl.thread_barrier()
    q_rope = p1_smem.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
    _signal(bars, Q_READY)

    rows = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=srow)
    row_ok = rows < num_rows
    t_idx = rows // num_heads
    words = _row_words(TREE_MASK, mask_offset, num_draft, prefix_len, kv_end, t_idx, row_ok, s_layout, BLOCK_N, CAUSAL)
    o = gl.zeros([BLOCK_M, HALF], gl.float32, layout=o_layout)
    m_run = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=srow)  # running max after the other's last tile
    l_run = gl.zeros([BLOCK_M], gl.float32, layout=srow)
    n_tiles = gl.cdiv(kv_end - kv_start, BLOCK_N)
    for j in range(gl.cdiv(n_tiles, 2)):
        phase = j & 1
        mine = j & 1  # ring slot of this pair's even tile; the odd tile is in the other
        next_even, next_even_ok = _slots(KV_INDICES, kv_base, kv_start, kv_end, 2 * j + 2, contig, slot_base,
                                         g_layout, BLOCK_N, KV_CONTIG is not None)
        next_odd, next_odd_ok = _slots(KV_INDICES, kv_base, kv_start, kv_end, 2 * j + 3, contig, slot_base,
                                         g_layout, BLOCK_N, KV_CONTIG is not None)
        sc = _scores(_q_view(q_main, j, num_heads), q_rope, kmain, ktail, bars, 1, 0, mine, phase, s_layout, BLOCK_M,
                     BLOCK_N, HALF)
        sc = sc * qk_scale
        start = kv_start + 2 * j * BLOCK_N
        if start + BLOCK_N > full_end:
            sc = _mask_tile(sc, start, kv_end, prefix_len, words, s_layout, BLOCK_N, CAUSAL)
        m_new = gl.maximum(m_run, gl.max(sc, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw no key yet
        p = gl.exp2(sc - m_safe[:, None])
        a0 = gl.exp2(m_run - m_safe)
        l_run = l_run * a0 + gl.sum(p, 1)
        mbarrier.wait(bars.index(P0_FREE), phase ^ 1)  # WG1's last wgmma on p0_smem is done (passes at j = 0)
        p0_smem.store(p.to(gl.bfloat16))
        fence_async_shared()
        m0_s.store(m_new)
        a0_s.store(a0)
        _signal(bars, S0_READY)
        o = o * gl.convert_layout(a0, orow)[:, None]
        o_tok = warpgroup_mma(p0_smem, kmain.index(mine).slice(0, HALF, dim=1), o, is_async=True)
        o = warpgroup_mma_wait(0, deps=[o_tok])  # O_left += P0 V_left(tile 2j)
        gl.thread_barrier()
        if 2 * j + 2 < n_tiles:  # the next pair exists (its odd tile may be past the item: zero-filled)
            _refill(KV, kmain, ktail, bars, mine, 0, next_odd, next_odd_ok, g_layout, D_MAIN, D_TAIL)
        mbarrier.wait(bars.index(S1_READY), phase)
        a1 = a1_s.load(srow)
        m_run = m1_s.load(srow)
        p0 = p0_smem.load(s_layout).to(gl.float32) * a1[:, None]  # P0 at WG1's max, for O_right
        p0_smem.store(p0.to(gl.bfloat16))
        fence_async_shared()
        _signal(bars, P0_READY)
        o = o * gl.convert_layout(a1, orow)[:, None]
        l_run = l_run * a1
        o_tok = warpgroup_mma(p1_smem, kmain.index(mine ^ 1).slice(0, HALF, dim=1), o, is_async=True)
        o = warpgroup_mma_wait(0, deps=[o_tok])  # O_left += P1 V_left(tile 2j+1)
        gl.thread_barrier()
        if 2 * j + 2 < n_tiles:  # the next pair exists (its odd tile may be past the item: zero-filled)
            _refill(KV, kmain, ktail, bars, mine ^ 1, 0, next_even, next_even_ok, g_layout, D_MAIN, D_TAIL)

    _epilogue(o, l_run, m_run, l0_s, l1_s, bars, L0_READY, L1_READY, 0, True, OUT, PARTIAL_O, PARTIAL_LSE, w, mblk,
              nsplit, qo_start, num_rows, num_heads, stride_on, stride_oh, s_layout, o_layout, BLOCK_M, DV, HALF)


@gluon.jit
def _wg1(KV, KV_INDICES, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
         W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
         num_heads, qk_scale, stride_on, stride_oh,
         q_main, kmain, ktail, p0_smem, p1_smem, m0_s, a0_s, m1_s, a1_s, l0_s, l1_s, bars,
         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_MAIN: gl.constexpr, D_TAIL: gl.constexpr,
         DV: gl.constexpr, CAUSAL: gl.constexpr, KV_START, KV_CONTIG):
    """Odd tiles, output columns 256..511, refills of half B."""
    HALF: gl.constexpr = DV // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    g_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    srow: gl.constexpr = gl.SliceLayout(1, s_layout)
    orow: gl.constexpr = gl.SliceLayout(1, o_layout)
    (w, mblk, kv_start, kv_end, full_end, nsplit, qo_start, num_draft, prefix_len, mask_offset, num_rows,
     kv_base) = _item_header(W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT, QO_INDPTR, KV_INDPTR,
                             MASK_OFFSETS, num_heads)
    # Half B of the first two tiles (ring slots 0 and 1); WG0 loads their halves A.
    contig, slot_base = _prime(KV, KV_INDICES, W_REQ, KV_START, KV_CONTIG, kmain, ktail, bars, kv_base, kv_start,
                               kv_end, 1, g_layout, BLOCK_N, D_MAIN, D_TAIL)
    rows = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=srow)
    row_ok = rows < num_rows
    t_idx = rows // num_heads
    mbarrier.wait(bars.index(Q_READY), 0)
    q_rope = p1_smem.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))

    words = _row_words(TREE_MASK, mask_offset, num_draft, prefix_len, kv_end, t_idx, row_ok, s_layout, BLOCK_N, CAUSAL)
    o = gl.zeros([BLOCK_M, HALF], gl.float32, layout=o_layout)
    m_run = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=srow)
    l_run = gl.zeros([BLOCK_M], gl.float32, layout=srow)
    n_tiles = gl.cdiv(kv_end - kv_start, BLOCK_N)
    for j in range(gl.cdiv(n_tiles, 2)):
        phase = j & 1
        mine = (j & 1) ^ 1  # ring slot of this pair's odd tile
        next_even, next_even_ok = _slots(KV_INDICES, kv_base, kv_start, kv_end, 2 * j + 2, contig, slot_base,
                                         g_layout, BLOCK_N, KV_CONTIG is not None)
        next_odd, next_odd_ok = _slots(KV_INDICES, kv_base, kv_start, kv_end, 2 * j + 3, contig, slot_base,
                                         g_layout, BLOCK_N, KV_CONTIG is not None)
        sc = _scores(_q_view(q_main, j, num_heads), q_rope, kmain, ktail, bars, 0, 1, mine, phase, s_layout, BLOCK_M,
                     BLOCK_N, HALF)
        sc = sc * qk_scale
        start = kv_start + (2 * j + 1) * BLOCK_N
        if start + BLOCK_N > full_end:  # a tile past the item (odd tile count) is all masked: P1 = 0, rescale 1
            sc = _mask_tile(sc, start, kv_end, prefix_len, words, s_layout, BLOCK_N, CAUSAL)
        mbarrier.wait(bars.index(S0_READY), phase)
        m_prev = m0_s.load(srow)
        a0 = a0_s.load(srow)
        m_run = gl.maximum(m_prev, gl.max(sc, 1))
        m_safe = gl.where(m_run == float("-inf"), 0.0, m_run)
        p = gl.exp2(sc - m_safe[:, None])
        a1 = gl.exp2(m_prev - m_safe)
        scale = a0 * a1
        l_run = l_run * scale + gl.sum(p, 1)
        p1_smem.store(p.to(gl.bfloat16))  # WG0's wgmma on it (last pair) finished before its S0_READY
        fence_async_shared()
        m1_s.store(m_run)
        a1_s.store(a1)
        _signal(bars, S1_READY)
        o = o * gl.convert_layout(scale, orow)[:, None]
        o_tok = warpgroup_mma(p1_smem, kmain.index(mine).slice(HALF, HALF, dim=1), o, is_async=True)
        o = warpgroup_mma_wait(0, deps=[o_tok])  # O_right += P1 V_right(tile 2j+1)
        gl.thread_barrier()
        if 2 * j + 2 < n_tiles:  # the next pair exists (its odd tile may be past the item: zero-filled)
            _refill(KV, kmain, ktail, bars, mine, 1, next_even, next_even_ok, g_layout, D_MAIN, D_TAIL)
        mbarrier.wait(bars.index(P0_READY), phase)
        o_tok = warpgroup_mma(p0_smem, kmain.index(mine ^ 1).slice(HALF, HALF, dim=1), o, is_async=True)
        o = warpgroup_mma_wait(0, deps=[o_tok])  # O_right += P0 V_right(tile 2j)
        _signal(bars, P0_FREE)
        if 2 * j + 2 < n_tiles:  # the next pair exists (its odd tile may be past the item: zero-filled)
            _refill(KV, kmain, ktail, bars, mine ^ 1, 1, next_odd, next_odd_ok, g_layout, D_MAIN, D_TAIL)

    _epilogue(o, l_run, m_run, l1_s, l0_s, bars, L1_READY, L0_READY, HALF, False, OUT, PARTIAL_O, PARTIAL_LSE, w, mblk,
              nsplit, qo_start, num_rows, num_heads, stride_on, stride_oh, s_layout, o_layout, BLOCK_M, DV, HALF)


@gluon.jit
def _mla_verify_hopper_seesaw_kernel(
    Q, KV, KV_INDICES, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE,
    COUNTS, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
    W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
    num_heads, qk_scale, stride_qn, stride_qh, stride_on, stride_oh,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_MAIN: gl.constexpr, D_TAIL: gl.constexpr,
    DV: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
    PRODUCER_WARPS: gl.constexpr, PRODUCER_REGS: gl.constexpr, NUM_WARPS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, KV_START=None, KV_CONTIG=None,
):
    """Grid: (num_work,); arguments, shapes and outputs as ``_mla_verify_hopper_split_kernel``
    (PARTIAL_O: fp32 [num_work, 64, 512]). NUM_WARPS = 4: the default partition is WG0; WG1 runs
    in a 4-warp worker partition with CONSUMER_REGS registers (PRODUCER_* are unused: no producer).
    Programs at or past COUNTS[0] exit before allocating anything."""
    gl.static_assert(D_MAIN == DV, "V is the 512-wide latent part of the row")
    gl.static_assert(STAGES == 2, "two ring slots: one per warpgroup")
    gl.static_assert(NUM_WARPS == 4, "the default partition is one warpgroup")
    gl.static_assert(BLOCK_M == 64, "wgmma's M: one warpgroup, 64 rows")
    if gl.program_id(0) >= gl.load(COUNTS):
        return
    big: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    vec: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    q_main = gl.allocate_shared_memory(gl.bfloat16, [1, BLOCK_M, D_MAIN], big)  # see _q_view
    kmain = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, D_MAIN], big)
    ktail = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, D_TAIL], big)
    p0_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_N], big)
    p1_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_N], big)
    m0_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    a0_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    m1_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    a1_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    l0_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    l1_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_BARRIERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BARRIERS):
        if i < Q_READY:  # "full": one arrival per thread of the refilling warpgroup when its copies land
            mbarrier.init(bars.index(i), count=WG_THREADS)
        else:
            mbarrier.init(bars.index(i), count=1)
    fence_async_shared()
    gl.thread_barrier()

    gl.warp_specialize(
        [
            (_wg0, (Q, KV, KV_INDICES, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
                    W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
                    num_heads, qk_scale, stride_qn, stride_qh, stride_on, stride_oh,
                    q_main, kmain, ktail, p0_smem, p1_smem, m0_s, a0_s, m1_s, a1_s, l0_s, l1_s, bars,
                    BLOCK_M, BLOCK_N, D_MAIN, D_TAIL, DV, CAUSAL, KV_START, KV_CONTIG)),
            (_wg1, (KV, KV_INDICES, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
                    W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
                    num_heads, qk_scale, stride_on, stride_oh,
                    q_main, kmain, ktail, p0_smem, p1_smem, m0_s, a0_s, m1_s, a1_s, l0_s, l1_s, bars,
                    BLOCK_M, BLOCK_N, D_MAIN, D_TAIL, DV, CAUSAL, KV_START, KV_CONTIG)),
        ],
        [4],
        [CONSUMER_REGS],
    )
