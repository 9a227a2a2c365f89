"""Hopper (sm_90) MLA tree-verify attention written in Gluon, with explicit pipelining.

Same contract, numerics and work decomposition as the Triton path (``kernel.plan``): work
items over (request, block of packed (draft token, head) rows, key range), fp32 partial
outputs + log2-sum-exp per split, merged by a combine kernel. Same masking (prefix visible,
tree mask on the last T_b keys, causal without a mask), ragged batches, no atomics
(bitwise-identical reruns), output written only at real rows of ``out``.

Two split kernels, both warp-specialized around the same producer:

* producer partition (4 warps): gathers 64 KV rows per stage with 16-byte ``cp.async`` into
  a 2-deep ring (the 512-wide latent part and the 64-wide rope part in separate power-of-two
  shared buffers). The next tile's slot indices are loaded before waiting for a free slot, so
  no gather waits on a dependent index load. Each producer thread arrives on the slot's "full"
  mbarrier when its copies land (``cp.async.mbarrier.arrive.noinc``); the consumer releases
  the slot on its "empty" mbarrier.
* ``_mla_verify_hopper_split_kernel`` (64 packed rows per work item, 8-warp consumer = two
  warpgroups): S = Q Kᵀ with ``warpgroup_mma`` where the warpgroups own different key columns
  of S (no duplicated Q·Kᵀ), online softmax in fp32, P staged in shared memory, O += P V with
  each warpgroup owning 256 of the 512 output columns.
* ``_mla_verify_hopper_keys_as_m_kernel`` (16 packed rows, one-warpgroup consumer): keys are
  the wgmma M dimension (Sᵀ = K Qᵀ, Oᵀ += Vᵀ Pᵀ), a quarter of the padded tensor work of the
  64-row tile; chosen for up to 16 rows (``choose_variant``).

Public: ``supported``, ``choose_variant``, ``make_plan``, ``allocate_workspace``,
``run_split_and_combine``, ``mla_verify_attention_hopper``; ``compile_for_sm90`` and
``resource_stats`` compile without a GPU and report registers, spills and shared memory.
Measurements and every variant tried: docs/kernel-hopper-notes.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:  # Gluon ships with Triton >= 3.5; keep the module importable without it.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.language.extra.cuda import gdc_launch_dependents
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

from kernel.plan import HeadDims, MLAVerifyPlan, TileConfig, plan_work

LOG2E = 1.4426950408889634
HEAD_DIM = 576
V_HEAD_DIM = 512
D_MAIN = 512
D_TAIL = 64
BLOCK_M = 64
PRODUCER_WARPS = 4
PRODUCER_REGS = 56
CONSUMER_WARPS = 8
COMBINE_SPLITS = 32
COMBINE_COLS = 128


@dataclass(frozen=True)
class Variant:
    """Compile-time shape of the split kernel's pipeline.

    keys_as_m: the one-warpgroup keys-as-M consumer for ``block_m`` packed rows (16 measured).
    block_n: keys per tile; stages: tiles in the shared ring; overlap: software-pipeline the
    consumer (S of tile i on the tensor cores while P V of tile i-1 is issued and accumulates).
    """

    block_n: int = 64
    stages: int = 2
    overlap: bool = False
    keys_as_m: bool = False
    block_m: int = BLOCK_M

    def describe(self) -> str:
        name = f"BN{self.block_n}_S{self.stages}" + ("_ovl" if self.overlap else "")
        return f"kM{self.block_m}_" + name if self.keys_as_m else name

    @property
    def num_warps(self) -> int:
        return 4 if self.keys_as_m else CONSUMER_WARPS


DEFAULT_VARIANT = Variant()  # 64-row tiles, two warpgroups: every row count
KEYS_AS_M_VARIANT = Variant(64, 2, False, True, 16)  # one warpgroup, keys as M: up to 16 packed rows
VARIANTS = (Variant(64, 2, False), Variant(32, 4, True), Variant(64, 2, False, True, 16), Variant(32, 4, False),
            Variant(16, 8, True))


def choose_variant(max_rows: int) -> Variant:
    """The variant for a batch whose widest request has ``max_rows`` = max_b T_b * H packed rows.

    Measured on an H200 (docs/kernel-hopper-notes.md): keys-as-M wins by 1.3-1.5x for up to 16
    rows (H=16 decode) and loses by 1.15-2.4x from 128 rows (each extra 16-row block re-reads the
    chunk); the 64-key, 2-stage two-warpgroup kernel beat every 32- and 16-key variant everywhere.
    """
    return KEYS_AS_M_VARIANT if max_rows <= KEYS_AS_M_VARIANT.block_m else DEFAULT_VARIANT


def tile_config(num_sms: int, variant: Variant = DEFAULT_VARIANT) -> TileConfig:
    """The work decomposition ``variant`` consumes: ``block_m``-row blocks, ``block_n``-key tiles,
    about one program per SM."""
    return TileConfig(block_m=variant.block_m, block_n=variant.block_n, num_warps=variant.num_warps,
                      num_stages=variant.stages, target_programs=num_sms, keys_as_m=variant.keys_as_m)


if HAVE_GLUON:

    @gluon.jit
    def _producer(KV, KV_INDICES, KV_INDPTR, W_REQ, W_KV_START, W_KV_END, kmain, ktail, full, empty,
                  BLOCK_N: gl.constexpr, D_MAIN: gl.constexpr, D_TAIL: gl.constexpr, HEAD_DIM: gl.constexpr,
                  STAGES: gl.constexpr):
        """Gather the work item's KV rows, tile by tile, into the shared ring."""
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
        slot = gl.load(KV_INDICES + kv_base + keys, mask=ok, other=0)
        for i in range(n_tiles):
            s = i % STAGES
            phase = (i // STAGES) & 1
            cur_slot = slot
            cur_ok = ok
            # Next tile's indices before waiting for a free slot.
            keys = kv_start + (i + 1) * BLOCK_N + offs_n
            ok = keys < kv_end
            slot = gl.load(KV_INDICES + kv_base + keys, mask=ok, other=0)
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
        """Online-softmax step for one score tile (log2 domain): returns P, new max, new sum, rescale."""
        sc = sc * qk_scale
        if start + BLOCK_N > full_end:
            sc = _mask_scores(sc, start, kv_end, prefix_len, num_draft, t_idx, row_ok, TREE_MASK, mask_offset,
                              s_layout, BLOCK_N, CAUSAL)
        m_new = gl.maximum(m_i, gl.max(sc, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw no key yet
        p = gl.exp2(sc - m_safe[:, None])
        alpha = gl.exp2(m_i - m_safe)
        l_i = l_i * alpha + gl.sum(p, 1)
        return p, m_new, l_i, alpha

    @gluon.jit
    def _consumer(Q, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
                  W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
                  num_heads, qk_scale, stride_qn, stride_qh, stride_on, stride_oh,
                  q_main, q_tail, kmain, ktail, p_smem, full, empty,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_MAIN: gl.constexpr, D_TAIL: gl.constexpr,
                  DV: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, NUM_WARPS: gl.constexpr,
                  OVERLAP: gl.constexpr):
        """Scores, online softmax and P·V for one work item; writes the output or a split partial."""
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, BLOCK_N // 2, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, DV // 2, 16])
        q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0])
        srow: gl.constexpr = gl.SliceLayout(1, s_layout)
        orow: gl.constexpr = gl.SliceLayout(1, o_layout)

        w = gl.program_id(0)
        b = gl.load(W_REQ + w)
        mblk = gl.load(W_MBLK + w)
        kv_start = gl.load(W_KV_START + w)
        kv_end = gl.load(W_KV_END + w)
        full_end = gl.load(W_FULL_END + w)
        nsplit = gl.load(W_NSPLIT + w)
        qo_start = gl.load(QO_INDPTR + b)
        num_draft = gl.load(QO_INDPTR + b + 1) - qo_start
        kv_len = gl.load(KV_INDPTR + b + 1) - gl.load(KV_INDPTR + b)
        prefix_len = kv_len - num_draft
        mask_offset = gl.load(MASK_OFFSETS + b)
        num_rows = num_draft * num_heads

        # Q block -> shared memory (rows past the request's packed rows are zero).
        qr = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, q_layout))
        q_ok = qr < num_rows
        q_row = Q + (qo_start + qr // num_heads).to(gl.int64) * stride_qn + (qr % num_heads) * stride_qh
        offs_main = gl.arange(0, D_MAIN, layout=gl.SliceLayout(0, q_layout))
        offs_tail = D_MAIN + gl.arange(0, D_TAIL, layout=gl.SliceLayout(0, q_layout))
        q_main.store(gl.load(q_row[:, None] + offs_main[None, :], mask=q_ok[:, None], other=0.0))
        q_tail.store(gl.load(q_row[:, None] + offs_tail[None, :], mask=q_ok[:, None], other=0.0))
        fence_async_shared()
        gl.thread_barrier()

        rows = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=srow)
        row_ok = rows < num_rows
        t_idx = rows // num_heads

        acc = gl.zeros([BLOCK_M, DV], gl.float32, layout=o_layout)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=srow)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=srow)
        n_tiles = gl.cdiv(kv_end - kv_start, BLOCK_N)
        if OVERLAP:
            # Software pipeline: S(i) runs on the tensor cores while P(i-1) V(i-1) is issued,
            # and softmax(i) runs while P(i-1) V(i-1) accumulates.
            mbarrier.wait(full.index(0), 0)
            fence_async_shared()
            sacc = warpgroup_mma(q_tail, ktail.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            sacc = warpgroup_mma(q_main, kmain.index(0).permute((1, 0)), sacc, is_async=True)
            sc = warpgroup_mma_wait(0, deps=[sacc])
            p, m_i, l_i, alpha = _softmax_tile(sc, m_i, l_i, kv_start, kv_end, full_end, prefix_len, num_draft,
                                               t_idx, row_ok, TREE_MASK, mask_offset, qk_scale,
                                               s_layout, BLOCK_N, CAUSAL)
            for i in range(1, n_tiles):
                s = i % STAGES
                sp = (i - 1) % STAGES
                mbarrier.wait(full.index(s), (i // STAGES) & 1)
                fence_async_shared()
                sacc = warpgroup_mma(q_tail, ktail.index(s).permute((1, 0)), s_zero, use_acc=False, is_async=True)
                sacc = warpgroup_mma(q_main, kmain.index(s).permute((1, 0)), sacc, is_async=True)
                p_smem.store(p.to(gl.bfloat16))
                fence_async_shared()
                gl.thread_barrier()  # both warpgroups' halves of P(i-1) are in shared memory
                acc = acc * gl.convert_layout(alpha, orow)[:, None]
                acc = warpgroup_mma(p_smem, kmain.index(sp), acc, is_async=True)
                sc = warpgroup_mma_wait(1, deps=[sacc])  # S(i) was issued first
                p, m_i, l_i, alpha = _softmax_tile(sc, m_i, l_i, kv_start + i * BLOCK_N, kv_end, full_end,
                                                   prefix_len, num_draft, t_idx, row_ok, TREE_MASK, mask_offset,
                                                   qk_scale, s_layout, BLOCK_N, CAUSAL)
                acc = warpgroup_mma_wait(0, deps=[acc])
                gl.thread_barrier()  # every warp is done with slot sp and with P(i-1)
                mbarrier.arrive(empty.index(sp), count=1)
            sl = (n_tiles - 1) % STAGES
            p_smem.store(p.to(gl.bfloat16))
            fence_async_shared()
            gl.thread_barrier()
            acc = acc * gl.convert_layout(alpha, orow)[:, None]
            acc = warpgroup_mma(p_smem, kmain.index(sl), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            gl.thread_barrier()
            mbarrier.arrive(empty.index(sl), count=1)
        else:
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
    def _mla_verify_hopper_split_kernel(
        Q, KV, KV_INDICES, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE,
        QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
        W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
        num_heads, qk_scale, stride_qn, stride_qh, stride_on, stride_oh,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_MAIN: gl.constexpr, D_TAIL: gl.constexpr,
        DV: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
        PRODUCER_WARPS: gl.constexpr, PRODUCER_REGS: gl.constexpr, NUM_WARPS: gl.constexpr,
        OVERLAP: gl.constexpr, EARLY_LAUNCH: gl.constexpr,
    ):
        """Grid: (num_work,). Q: [N, H, 576] bf16; KV: [slots, 576] bf16 (contiguous rows);
        OUT: [N, H, 512]; PARTIAL_O: fp32 [num_work, 64, 512]; PARTIAL_LSE: fp32 [num_work, 64] (log2)."""
        gl.static_assert(D_MAIN == DV, "V is the 512-wide latent part of the row")
        if EARLY_LAUNCH:
            # Let the combine kernel's programs launch now; they wait (griddepcontrol.wait) for this grid to finish.
            gdc_launch_dependents()
        HEAD_DIM: gl.constexpr = D_MAIN + D_TAIL
        big: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        q_main = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D_MAIN], big)
        q_tail = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D_TAIL], big)
        kmain = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D_MAIN], big)
        ktail = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D_TAIL], big)
        p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], gl.bfloat16)
        p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_N], p_layout)
        full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(full.index(s), count=PRODUCER_WARPS * 32)
            mbarrier.init(empty.index(s), count=1)
        fence_async_shared()

        gl.warp_specialize(
            [
                (_consumer, (Q, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
                             W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
                             num_heads, qk_scale, stride_qn, stride_qh, stride_on, stride_oh,
                             q_main, q_tail, kmain, ktail, p_smem, full, empty,
                             BLOCK_M, BLOCK_N, D_MAIN, D_TAIL, DV, STAGES, CAUSAL, NUM_WARPS, OVERLAP)),
                (_producer, (KV, KV_INDICES, KV_INDPTR, W_REQ, W_KV_START, W_KV_END, kmain, ktail, full, empty,
                             BLOCK_N, D_MAIN, D_TAIL, HEAD_DIM, STAGES)),
            ],
            [PRODUCER_WARPS],
            [PRODUCER_REGS],
        )


if HAVE_GLUON:

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
        q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0])
        scol: gl.constexpr = gl.SliceLayout(0, st_layout)
        skey: gl.constexpr = gl.SliceLayout(1, st_layout)

        w = gl.program_id(0)
        b = gl.load(W_REQ + w)
        mblk = gl.load(W_MBLK + w)
        kv_start = gl.load(W_KV_START + w)
        kv_end = gl.load(W_KV_END + w)
        full_end = gl.load(W_FULL_END + w)
        nsplit = gl.load(W_NSPLIT + w)
        qo_start = gl.load(QO_INDPTR + b)
        num_draft = gl.load(QO_INDPTR + b + 1) - qo_start
        kv_len = gl.load(KV_INDPTR + b + 1) - gl.load(KV_INDPTR + b)
        prefix_len = kv_len - num_draft
        mask_offset = gl.load(MASK_OFFSETS + b)
        num_rows = num_draft * num_heads

        qr = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, q_layout))
        q_ok = qr < num_rows
        q_row = Q + (qo_start + qr // num_heads).to(gl.int64) * stride_qn + (qr % num_heads) * stride_qh
        offs_main = gl.arange(0, D_MAIN, layout=gl.SliceLayout(0, q_layout))
        offs_tail = D_MAIN + gl.arange(0, D_TAIL, layout=gl.SliceLayout(0, q_layout))
        q_main.store(gl.load(q_row[:, None] + offs_main[None, :], mask=q_ok[:, None], other=0.0))
        q_tail.store(gl.load(q_row[:, None] + offs_tail[None, :], mask=q_ok[:, None], other=0.0))
        fence_async_shared()
        gl.thread_barrier()

        rows = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=scol)
        row_ok = rows < num_rows
        t_idx = rows // num_heads

        acc = gl.zeros([DV, BLOCK_M], gl.float32, layout=ot_layout)
        s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=scol)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=scol)
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
            l_i = l_i * alpha + gl.sum(pt, 0)
            m_i = m_new
            p_smem.store(pt.to(gl.bfloat16))
            fence_async_shared()
            gl.thread_barrier()
            acc = acc * alpha[None, :]
            acc = warpgroup_mma(km.permute((1, 0)), p_smem, acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            gl.thread_barrier()
            mbarrier.arrive(empty.index(s), count=1)

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
        QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
        W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
        num_heads, qk_scale, stride_qn, stride_qh, stride_on, stride_oh,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_MAIN: gl.constexpr, D_TAIL: gl.constexpr,
        DV: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
        PRODUCER_WARPS: gl.constexpr, PRODUCER_REGS: gl.constexpr, NUM_WARPS: gl.constexpr,
        OVERLAP: gl.constexpr, EARLY_LAUNCH: gl.constexpr,
    ):
        """As ``_mla_verify_hopper_split_kernel`` for BLOCK_M <= 32 packed rows, with a one-warpgroup
        keys-as-M consumer (``_consumer_keys_as_m``); PARTIAL_O: fp32 [num_work, BLOCK_M, 512]."""
        gl.static_assert(D_MAIN == DV, "V is the 512-wide latent part of the row")
        if EARLY_LAUNCH:
            gdc_launch_dependents()
        HEAD_DIM: gl.constexpr = D_MAIN + D_TAIL
        big: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        q_main = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D_MAIN], big)
        q_tail = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D_TAIL], big)
        kmain = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D_MAIN], big)
        ktail = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D_TAIL], big)
        p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], gl.bfloat16)
        p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, BLOCK_M], p_layout)
        full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(full.index(s), count=PRODUCER_WARPS * 32)
            mbarrier.init(empty.index(s), count=1)
        fence_async_shared()

        gl.warp_specialize(
            [
                (_consumer_keys_as_m, (Q, TREE_MASK, OUT, PARTIAL_O, PARTIAL_LSE, QO_INDPTR, KV_INDPTR, MASK_OFFSETS,
                                       W_REQ, W_MBLK, W_KV_START, W_KV_END, W_FULL_END, W_NSPLIT,
                                       num_heads, qk_scale, stride_qn, stride_qh, stride_on, stride_oh,
                                       q_main, q_tail, kmain, ktail, p_smem, full, empty,
                                       BLOCK_M, BLOCK_N, D_MAIN, D_TAIL, DV, STAGES, CAUSAL, NUM_WARPS)),
                (_producer, (KV, KV_INDICES, KV_INDPTR, W_REQ, W_KV_START, W_KV_END, kmain, ktail, full, empty,
                             BLOCK_N, D_MAIN, D_TAIL, HEAD_DIM, STAGES)),
            ],
            [PRODUCER_WARPS],
            [PRODUCER_REGS],
        )


@triton.jit(do_not_specialize=["num_heads"])
def _hopper_combine_kernel(
    OUT, PARTIAL_O, PARTIAL_LSE,
    QO_INDPTR, MB_REQ, MB_MBLK, MB_WORK_START, MB_NSPLIT, MB_STRIDE,
    num_heads, stride_on, stride_oh,
    DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid: (num_row_blocks, BLOCK_M, cdiv(DV, BLOCK_C)). Merges one packed row's splits by their
    LSEs into OUT [N, H, DV]. PARTIAL_O: fp32 [num_work, BLOCK_M, DV]; PARTIAL_LSE: fp32 [num_work, BLOCK_M]."""
    i = tl.program_id(0)
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


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------

def _split_constexprs(variant: Variant) -> dict:
    return dict(BLOCK_M=variant.block_m, BLOCK_N=variant.block_n, D_MAIN=D_MAIN, D_TAIL=D_TAIL, DV=V_HEAD_DIM,
                STAGES=variant.stages, PRODUCER_WARPS=PRODUCER_WARPS, PRODUCER_REGS=PRODUCER_REGS,
                NUM_WARPS=variant.num_warps, OVERLAP=variant.overlap)


def _split_kernel(variant: Variant):
    return _mla_verify_hopper_keys_as_m_kernel if variant.keys_as_m else _mla_verify_hopper_split_kernel


def supported(q: torch.Tensor, kv_cache: torch.Tensor, v_head_dim: int = V_HEAD_DIM,
              kv_indices: torch.Tensor | None = None) -> bool:
    """Whether this Hopper kernel serves the call: Gluon available, an sm_90 CUDA device, bf16,
    576-wide rows (512 latent + 64 rope, V = latent), contiguous KV rows and q's last dim, int32 indices."""
    if not HAVE_GLUON or q.device.type != "cuda":
        return False
    if torch.cuda.get_device_capability(q.device) != (9, 0):
        return False
    rows = kv_cache.reshape(kv_cache.shape[0], -1) if kv_cache.dim() == 3 else kv_cache
    return (
        q.dtype == torch.bfloat16 and kv_cache.dtype == torch.bfloat16
        and q.dim() == 3 and q.shape[-1] == HEAD_DIM and v_head_dim == V_HEAD_DIM
        and rows.dim() == 2 and rows.shape[-1] == HEAD_DIM and rows.stride(-1) == 1 and rows.stride(0) == HEAD_DIM
        and q.stride(-1) == 1
        and (kv_indices is None or kv_indices.dtype == torch.int32)
    )


def make_plan(qo_lens: list[int], kv_lens: list[int], num_heads: int, num_sms: int,
              variant: Variant | None = None) -> MLAVerifyPlan:
    """``kernel.plan.plan_work`` with the tile configuration of ``variant`` (None: ``choose_variant``).

    The work decomposition is the Triton path's: work items over (request, row block, key
    range), a combine kernel merging the splits of every row block that has more than one.
    """
    if variant is None:
        variant = choose_variant(max(qo_lens, default=1) * num_heads)
    return plan_work(qo_lens, kv_lens, num_heads, HeadDims.of(HEAD_DIM, V_HEAD_DIM), tile_config(num_sms, variant))


def allocate_workspace(num_work: int, device: torch.device, block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partial outputs [num_work, block_m, 512] and LSEs [num_work, block_m] for ``num_work``
    work items (room for every variant when block_m is 64)."""
    n = max(1, num_work)
    return (torch.empty((n, block_m, V_HEAD_DIM), dtype=torch.float32, device=device),
            torch.empty((n, block_m), dtype=torch.float32, device=device))


def run_split_and_combine(
    plan: MLAVerifyPlan,
    plan_tensors: dict[str, torch.Tensor],
    q: torch.Tensor,
    kv: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    tree_mask: torch.Tensor | None,
    sm_scale: float,
    out: torch.Tensor,
    partial_o: torch.Tensor,
    partial_lse: torch.Tensor,
    use_pdl: bool = False,
    variant: Variant | None = None,
    pdl_trigger: bool = True,
) -> None:
    """Launch the Gluon split kernel over ``plan`` (from ``make_plan``; its config must be
    ``tile_config``) and, when a row block has several splits, the combine kernel.

    q: [N, H, 576] bf16; kv: [slots, 576] bf16 rows; kv_indices: int32; tree_mask: bool/uint8
    [sum T_b^2] or None (causal); out: [N, H, 512] (written only at real rows);
    partial_o / partial_lse: from ``allocate_workspace`` with at least ``plan.num_work`` items.
    variant: the one ``plan`` was made for (None: ``choose_variant``, as ``make_plan`` does).
    use_pdl: launch the combine with programmatic dependent launch, the split kernel releasing it
    at its start. Off by default: measured 7-18 µs slower at 64k-128k on an H200 than plain
    stream order (docs/kernel-hopper-notes.md). pdl_trigger=False keeps PDL but lets the combine
    launch only as split programs exit (not measured yet).
    Launches only device work (no host sync), so it can be captured in a CUDA graph.
    """
    if variant is None:
        variant = choose_variant(max(plan.qo_lens, default=1) * plan.num_heads)
    cfg = plan.config
    assert cfg.block_m == variant.block_m and cfg.block_n == variant.block_n, "plan made for another variant"
    if plan.num_work == 0:
        return
    bm = cfg.block_m
    assert partial_o.numel() >= plan.num_work * bm * V_HEAD_DIM and partial_lse.numel() >= plan.num_work * bm
    kv = kv.reshape(kv.shape[0], -1) if kv.dim() == 3 else kv
    assert kv.stride(0) == HEAD_DIM and kv.stride(1) == 1 and q.stride(2) == 1 and out.stride(2) == 1
    assert kv_indices.dtype == torch.int32, "the Hopper kernel reads int32 slot indices"
    causal = tree_mask is None
    mask_arg = kv_indices if causal else tree_mask.view(torch.uint8)
    _split_kernel(variant)[(plan.num_work,)](
        q, kv, kv_indices, mask_arg, out, partial_o, partial_lse,
        qo_indptr, kv_indptr, plan_tensors["mask_offsets"],
        plan_tensors["work_req"], plan_tensors["work_mblk"], plan_tensors["work_kv_start"],
        plan_tensors["work_kv_end"], plan_tensors["work_full_end"], plan_tensors["work_nsplit"],
        plan.num_heads, sm_scale * LOG2E, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        CAUSAL=causal, EARLY_LAUNCH=use_pdl and pdl_trigger and plan.needs_combine, num_warps=variant.num_warps,
        **_split_constexprs(variant),
    )
    if plan.needs_combine:
        grid = (len(plan.mb_req), bm, triton.cdiv(V_HEAD_DIM, COMBINE_COLS))
        _hopper_combine_kernel[grid](
            out, partial_o, partial_lse,
            qo_indptr, plan_tensors["mb_req"], plan_tensors["mb_mblk"], plan_tensors["mb_work_start"],
            plan_tensors["mb_nsplit"], plan_tensors["mb_stride"],
            plan.num_heads, out.stride(0), out.stride(1),
            DV=V_HEAD_DIM, BLOCK_M=bm, BLOCK_S=COMBINE_SPLITS, BLOCK_C=COMBINE_COLS, USE_PDL=use_pdl,
            num_warps=4, launch_pdl=use_pdl,
        )


def mla_verify_attention_hopper(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    sm_scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One-call form (plans on the host: one sync). Same arguments as ``mla_verify_attention``."""
    qo = qo_indptr.tolist()
    kv = kv_indptr.tolist()
    qo_lens = [b - a for a, b in zip(qo, qo[1:])]
    kv_lens = [b - a for a, b in zip(kv, kv[1:])]
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    plan = make_plan(qo_lens, kv_lens, q.shape[1], sms)
    if out is None:
        out = torch.empty((q.shape[0], q.shape[1], V_HEAD_DIM), dtype=q.dtype, device=q.device)
    partial_o, partial_lse = allocate_workspace(plan.num_work, q.device)
    scale = 1.0 / math.sqrt(HEAD_DIM) if sm_scale is None else float(sm_scale)
    run_split_and_combine(plan, plan.to_device(q.device), q, kv_cache, qo_indptr, kv_indptr, kv_indices,
                          tree_mask, scale, out, partial_o, partial_lse)
    return out


def compile_for_sm90(causal: bool = False, variant: Variant = DEFAULT_VARIANT, early_launch: bool = False):
    """Compile the split kernel for sm_90 without a GPU (pointer args 16-byte aligned).

    Returns the compiled kernel: ``.n_regs``, ``.n_spills``, ``.metadata.shared``."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = _split_kernel(variant)
    pointers = {"Q": "*bf16", "KV": "*bf16", "KV_INDICES": "*i32", "TREE_MASK": "*u8", "OUT": "*bf16",
                "PARTIAL_O": "*fp32", "PARTIAL_LSE": "*fp32", "QO_INDPTR": "*i32", "KV_INDPTR": "*i32",
                "MASK_OFFSETS": "*i32", "W_REQ": "*i32", "W_MBLK": "*i32", "W_KV_START": "*i32",
                "W_KV_END": "*i32", "W_FULL_END": "*i32", "W_NSPLIT": "*i32"}
    scalars = {"num_heads": "i32", "qk_scale": "fp32", "stride_qn": "i32", "stride_qh": "i32",
               "stride_on": "i32", "stride_oh": "i32"}
    constexprs = dict(_split_constexprs(variant), CAUSAL=causal, EARLY_LAUNCH=early_launch)
    signature = {name: pointers.get(name) or scalars.get(name) or "constexpr" for name in fn.arg_names}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in pointers}
    src = GluonASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": variant.num_warps})


def resource_stats(compiled) -> dict:
    """Registers, spill bytes and shared memory of a kernel compiled by ``compile_for_sm90``,
    read from ``ptxas -v`` on its PTX (a CPU-side compile carries no driver statistics)."""
    import os
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        log = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", ptx, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    spills = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)]
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", log)]
    maxnreg = [int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+);", compiled.asm["ptx"])]
    return {"n_regs": max(regs), "n_spills": sum(spills), "shared_bytes": int(compiled.metadata.shared),
            "setmaxnreg": sorted(set(maxnreg))}
