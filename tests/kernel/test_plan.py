"""Host-side planning: the work decomposition covers every (row block, key) once and the
workspace bound holds for any lengths."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.plan import HeadDims, TileConfig, max_work_items, plan_work

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


@settings(max_examples=300, deadline=None)
@given(batches())
def test_work_items_tile_every_row_block_and_key_once_within_the_bound(batch):
    drafts, lengths, heads, config = batch
    plan = plan_work(drafts, lengths, heads, HeadDims.of(576, 512), config)
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
