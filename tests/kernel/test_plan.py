"""Host-side planning: the work decomposition covers every (row block, key) once and the
workspace bound holds for any lengths."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.plan import (
    ITEM_OVERHEAD_TILES,
    SCHEDULES,
    HeadDims,
    PlanLayout,
    TileConfig,
    max_work_items,
    plan_work,
    program_makespan,
)

CONFIGS = [
    TileConfig(block_m=16, block_n=64, num_warps=8, num_stages=3, target_programs=132),
    TileConfig(block_m=64, block_n=64, num_warps=8, num_stages=2, target_programs=132),
    TileConfig(block_m=16, block_n=16, num_warps=1, num_stages=1, target_programs=4, min_chunk=16),
]


@st.composite
def batches(draw):
    batch = draw(st.integers(1, 12))
    drafts = draw(st.lists(st.integers(1, 64), min_size=batch, max_size=batch))
    lengths = [t + draw(st.integers(0, 300_000)) for t in drafts]
    return drafts, lengths, draw(st.sampled_from([1, 3, 16, 128])), draw(st.sampled_from(CONFIGS))


@st.composite
def serving_batches(draw):
    """Many requests of mixed lengths (a few keys to 40k), as a serving step batches them."""
    batch = draw(st.integers(1, 96))
    drafts = draw(st.lists(st.integers(1, 8), min_size=batch, max_size=batch))
    lengths = [t + draw(st.one_of(st.integers(0, 300), st.integers(0, 40_000))) for t in drafts]
    return drafts, lengths, draw(st.sampled_from([1, 16, 128])), draw(st.sampled_from(CONFIGS))


@settings(max_examples=300, deadline=None)
@given(st.one_of(batches(), serving_batches()), st.sampled_from(SCHEDULES))
def test_work_items_tile_every_row_block_and_key_once_within_the_bound(batch, schedule):
    drafts, lengths, heads, config = batch
    plan = plan_work(drafts, lengths, heads, HeadDims.of(576, 512), config, schedule=schedule)
    assert plan.num_work <= max_work_items(len(drafts), max(drafts), heads, config)
    covered = {}
    for w in range(plan.num_work):
        b, m = plan.work_req[w], plan.work_mblk[w]
        start, end, full = plan.work_kv_start[w], plan.work_kv_end[w], plan.work_full_end[w]
        assert 0 <= start < end <= lengths[b] and start <= full <= end
        # Unmasked tiles are whole tiles of prefix keys (none when the chunk starts past the prefix).
        assert (full - start) % config.block_n == 0 and (full == start or full <= lengths[b] - drafts[b])
        covered.setdefault((b, m), []).append((start, end))
    for b, (t, length) in enumerate(zip(drafts, lengths)):
        for m in range(-(-t * heads // config.block_m)):
            spans = sorted(covered[(b, m)])
            assert spans[0][0] == 0 and spans[-1][1] == length
            assert all(a[1] == c[0] for a, c in zip(spans, spans[1:]))  # contiguous, no overlap
    for i, (w0, n, stride) in enumerate(zip(plan.mb_work_start, plan.mb_nsplit, plan.mb_stride)):
        assert {(plan.work_req[w0 + s * stride], plan.work_mblk[w0 + s * stride]) for s in range(n)} == {
            (plan.mb_req[i], plan.mb_mblk[i])
        }


def loop_plan(qo_lens, kv_lens, num_heads, config):
    """The decomposition written as loops (the definition ``plan_work`` vectorizes)."""
    mblocks = [-(-t * num_heads // config.block_m) for t in qo_lens]
    chunk = max(config.min_chunk, -(-sum(m * l for m, l in zip(mblocks, kv_lens)) // max(1, config.target_programs)))
    chunk = -(-chunk // config.block_n) * config.block_n
    work, rows, masks, offset = [], [], [], 0
    for b, (t, l, nm) in enumerate(zip(qo_lens, kv_lens, mblocks)):
        masks.append(offset)
        offset += t * t
        nsplit, first = -(-l // chunk), len(work)
        for s in range(nsplit):
            start, end = s * chunk, min(l, (s + 1) * chunk)
            full_end = start + max(0, min(end, l - t) - start) // config.block_n * config.block_n
            work += [(b, m, start, end, full_end, nsplit) for m in range(nm)]
        rows += [(b, m, first + m, nsplit, nm) for m in range(nm)]
    return chunk, work, rows, masks


@settings(max_examples=300, deadline=None)
@given(batches())
def test_vectorized_plan_equals_the_loop_definition(batch):
    drafts, lengths, heads, config = batch
    plan = plan_work(drafts, lengths, heads, HeadDims.of(576, 512), config)
    chunk, work, rows, masks = loop_plan(drafts, lengths, heads, config)
    assert plan.chunk == chunk
    assert list(zip(*(a.tolist() for a in (plan.work_req, plan.work_mblk, plan.work_kv_start, plan.work_kv_end,
                                           plan.work_full_end, plan.work_nsplit)))) == work
    assert list(zip(*(a.tolist() for a in (plan.mb_req, plan.mb_mblk, plan.mb_work_start, plan.mb_nsplit,
                                           plan.mb_stride)))) == rows
    assert plan.mask_offsets.tolist() == masks
    assert plan.max_nsplit == max((r[3] for r in rows), default=0)
    assert plan.needs_combine == any(r[3] > 1 for r in rows)


def test_layout_pack_writes_every_array_at_its_offset_and_zeros_the_rest():
    config = CONFIGS[0]
    plan = plan_work([1, 8, 3], [100, 70_000, 5], 16, HeadDims.of(576, 512), config)
    layout = PlanLayout(5, plan.num_work + 3, plan.num_row_blocks + 2)
    staging = np.full(layout.numel + 7, -1, dtype=np.int32)  # stale values from an earlier plan
    packed = layout.pack(plan, into=staging)
    views = layout.views(torch.from_numpy(staging))
    assert packed.shape == (layout.numel,) and (staging[layout.numel:] == -1).all()
    assert views["counts"].tolist() == [plan.num_work, plan.num_row_blocks]
    assert views["qo_indptr"].tolist() == [0, 1, 9, 12, 0, 0]
    assert views["kv_indptr"].tolist() == [0, 100, 70_100, 70_105, 0, 0]
    assert views["work_kv_end"].tolist() == plan.work_kv_end.tolist() + [0, 0, 0]
    assert views["mb_stride"].tolist() == plan.mb_stride.tolist() + [0, 0]
    assert (layout.pack(plan) == packed).all()


@pytest.mark.parametrize("max_batch,max_work,max_row_blocks", [(1, 1, 1), (5, 131, 7), (64, 196, 130), (3, 2, 6)])
def test_every_layout_view_starts_16_byte_aligned(max_batch, max_work, max_row_blocks):
    """Kernels specialize on 16-byte pointer alignment: views at offsets that move with the sizes
    would compile new variants per batch size (and defeat a warm-up)."""
    layout = PlanLayout(max_batch, max_work, max_row_blocks)
    buffer = torch.zeros(layout.numel, dtype=torch.int32)
    views = layout.views(buffer)
    assert all((view.data_ptr() - buffer.data_ptr()) % 16 == 0 for view in views.values())
    assert {name: view.numel() for name, view in views.items()} == layout.sizes()
    spans = sorted(((v.data_ptr() - buffer.data_ptr()) // 4, v.numel()) for v in views.values())
    assert all(start + size <= following for (start, size), (following, _) in zip(spans, spans[1:]))  # disjoint
    end = spans[-1][0] + spans[-1][1]
    assert end <= layout.numel < end + PlanLayout.ALIGN


@settings(max_examples=200, deadline=None)
@given(serving_batches())
def test_balanced_schedule_splits_only_long_requests_into_near_equal_pieces(batch):
    """Balanced: a request is split only when it holds at least 1.5 shares of the batch's work per
    program, its pieces differ by at most one tile, and no piece is shorter than min_chunk (or a
    tile) unless the request itself is."""
    drafts, lengths, heads, config = batch
    plan = plan_work(drafts, lengths, heads, HeadDims.of(576, 512), config, schedule="balanced")
    mblocks = [-(-t * heads // config.block_m) for t in drafts]
    share = max(1.0, sum(m * l for m, l in zip(mblocks, lengths)) / config.target_programs)
    floor = max(config.min_chunk, config.block_n)
    for b, length in enumerate(lengths):
        pieces = [(s, e) for w, (s, e) in enumerate(zip(plan.work_kv_start, plan.work_kv_end))
                  if plan.work_req[w] == b and plan.work_mblk[w] == 0]
        if length < 1.5 * share or length < 2 * floor:
            assert len(pieces) == 1, (length, share, pieces)
        sizes = [e - s for s, e in pieces]
        assert max(sizes) - min(sizes) <= config.block_n or len(sizes) == 1
        assert len(sizes) == 1 or min(sizes) >= min(floor, length) - config.block_n


def test_balanced_schedule_fills_the_sms_with_a_serving_batch_in_one_wave():
    """B=64 requests of 4096 keys, 128 heads, 64-row blocks on 132 SMs: the uniform chunk (4032 keys)
    leaves a 64-key sliver per row block (256 programs, half of them one tile); balanced gives one
    4096-key program per row block (128 programs, one wave)."""
    config = CONFIGS[1]
    uniform = plan_work([1] * 64, [4096] * 64, 128, HeadDims.of(576, 512), config)
    balanced = plan_work([1] * 64, [4096] * 64, 128, HeadDims.of(576, 512), config, schedule="balanced")
    assert uniform.num_work == 256 and sorted(set((uniform.work_kv_end - uniform.work_kv_start).tolist())) == [64, 4032]
    assert balanced.num_work == 128 and set((balanced.work_kv_end - balanced.work_kv_start).tolist()) == {4096}
    with pytest.raises(ValueError, match="schedule"):
        plan_work([1], [10], 16, HeadDims.of(576, 512), config, schedule="persistent")


def test_program_makespan_follows_the_block_scheduler():
    """Items go to the SM that frees first, in launch order: [3, 1, 1, 1] on 2 SMs ends at 3 (the short
    ones share one SM); [1, 3, 3] ends at 4 (the third waits for the first)."""
    assert program_makespan([3, 1, 1, 1], 2, overhead=0) == 3
    assert program_makespan([1, 3, 3], 2, overhead=0) == 4
    assert program_makespan([1, 3, 3], 2, overhead=1) == 6
    assert program_makespan([5, 2], 4, overhead=0) == 5


def _makespan(plan, config):
    return program_makespan(-(-(plan.work_kv_end - plan.work_kv_start) // config.block_n), config.target_programs)


@settings(max_examples=200, deadline=None)
@given(st.one_of(batches(), serving_batches()))
def test_waves_schedule_finishes_no_later_than_uniform_balanced_or_one_wave(batch):
    """The waves plan's last program ends no later (by ``program_makespan``) than the uniform or the
    balanced plan's, nor than the shortest equal pieces that fit one wave, found here by scanning
    piece lengths upward (independent of the planner's bisection)."""
    drafts, lengths, heads, config = batch
    plans = {s: plan_work(drafts, lengths, heads, HeadDims.of(576, 512), config, schedule=s) for s in SCHEDULES}
    waves = _makespan(plans["waves"], config)
    assert waves <= _makespan(plans["uniform"], config) and waves <= _makespan(plans["balanced"], config)
    mblocks = np.array([-(-t * heads // config.block_m) for t in drafts])
    tiles = -(-np.array(lengths) // config.block_n)
    cap = np.maximum(1, np.array(lengths) // max(config.min_chunk, config.block_n))
    if mblocks.sum() <= config.target_programs:
        p = max(1, -(-int((mblocks * tiles).sum()) // config.target_programs))
        while (mblocks * np.minimum(-(-tiles // p), cap)).sum() > config.target_programs:
            p += 1
        pieces = np.minimum(-(-tiles // p), cap)
        assert waves <= (-(-tiles // pieces)).max() + ITEM_OVERHEAD_TILES


def test_waves_schedule_keeps_the_ragged_batch_in_one_wave():
    """The benchmark's ragged batch (B=8, T=8, H=16: two 64-row blocks per request, 1k..128k keys) on 132
    SMs: round(L / share) pieces make 134 programs, the last four waiting for a free SM (their request's
    pieces end 83 tiles in); waves cuts 32-, 16-, ... tile pieces into 130 programs, done at 67."""
    config = CONFIGS[1]
    lengths = [1024, 2011, 4093, 8209, 16411, 32771, 65539, 131072]
    balanced = plan_work([8] * 8, lengths, 16, HeadDims.of(576, 512), config, schedule="balanced")
    waves = plan_work([8] * 8, lengths, 16, HeadDims.of(576, 512), config, schedule="waves")
    assert balanced.num_work == 134 and _makespan(balanced, config) == 83
    assert waves.num_work == 130 and _makespan(waves, config) == 67 and waves.chunk == 65 * 64
