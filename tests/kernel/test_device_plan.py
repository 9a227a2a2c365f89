"""The uniform split planned on the device (``kernel.device_plan``) is the host's plan, bit for bit.

CPU: Triton's interpreter; on a GPU the same checks run on the device."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel import MLAVerifyWrapper
from kernel.device_plan import plan_uniform_on_device
from kernel.plan import (
    HeadDims,
    PlanLayout,
    TileConfig,
    max_row_blocks,
    max_work_items,
    plan_work,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROOT = Path(__file__).resolve().parents[2]
DIMS = HeadDims.of(576, 512)
CONFIGS = [
    TileConfig(block_m=16, block_n=64, num_warps=4, num_stages=2, target_programs=132, keys_as_m=True),  # Hopper, H=16
    TileConfig(block_m=64, block_n=64, num_warps=8, num_stages=2, target_programs=132),
    TileConfig(block_m=16, block_n=16, num_warps=1, num_stages=1, target_programs=4, min_chunk=16),  # interpreter
    TileConfig(block_m=32, block_n=32, num_warps=8, num_stages=2, target_programs=7, min_chunk=64),
]
POISON = -7


@st.composite
def bucket_steps(draw):
    """A bucket (batch size, widest entry) and a step it holds: fewer entries than the bucket
    (the rest padding), lengths from a few keys to 300k."""
    bucket = draw(st.sampled_from([1, 2, 3, 8, 16, 32, 64]))
    width = draw(st.sampled_from([1, 4, 8, 16]))
    batch = draw(st.integers(1, bucket))
    drafts = draw(st.lists(st.integers(1, width), min_size=batch, max_size=batch))
    lengths = [t + draw(st.one_of(st.integers(0, 70), st.integers(0, 300_000))) for t in drafts]
    return bucket, width, drafts, lengths, draw(st.sampled_from([1, 16, 128])), draw(st.sampled_from(CONFIGS))


def padded_indptrs(lengths: list[int], bucket: int) -> torch.Tensor:
    """int32 [bucket + 1]: exclusive sums of ``lengths``, the entries past them empty."""
    out = np.zeros(bucket + 1, dtype=np.int32)
    out[1 : len(lengths) + 1] = np.cumsum(lengths)
    out[len(lengths) + 1 :] = out[len(lengths)]
    return torch.from_numpy(out).to(DEVICE)


def device_plan(drafts, lengths, heads, config, layout, bucket) -> np.ndarray:
    """The device's metadata (poisoned first, with poisoned elements past the layout)."""
    meta = torch.full((layout.numel + 9,), POISON, dtype=torch.int32, device=DEVICE)
    plan_uniform_on_device(padded_indptrs(drafts, bucket), padded_indptrs(lengths, bucket), meta, layout, heads, config)
    out = meta.cpu().numpy()
    assert (out[layout.numel :] == POISON).all(), "wrote past the layout"
    return out[: layout.numel]


@settings(max_examples=60, deadline=None)
@given(bucket_steps())
def test_device_plan_is_the_host_plan_bit_for_bit(step):
    bucket, width, drafts, lengths, heads, config = step
    layout = PlanLayout(bucket, max_work_items(bucket, width, heads, config), max_row_blocks(bucket, width, heads, config))
    want = layout.pack(plan_work(drafts, lengths, heads, DIMS, config, schedule="uniform"))
    got = device_plan(drafts, lengths, heads, config, layout, bucket)
    offsets = layout.offsets()
    wrong = [name for name, size in layout.sizes().items()
             if not np.array_equal(got[offsets[name] : offsets[name] + size], want[offsets[name] : offsets[name] + size])]
    assert not wrong, f"fields differ: {wrong}"


def test_device_plan_of_other_lengths_differs():
    """The comparison can fail: one key fewer moves the last split's end."""
    config, layout = CONFIGS[0], PlanLayout(1, max_work_items(1, 1, 16, CONFIGS[0]), max_row_blocks(1, 1, 16, CONFIGS[0]))
    want = layout.pack(plan_work([1], [131_073], 16, DIMS, config, schedule="uniform"))
    assert not np.array_equal(device_plan([1], [131_072], 16, config, layout, 1), want)


def test_device_plan_refuses_what_it_cannot_write():
    layout = PlanLayout(2, 16, 4)
    meta = torch.zeros(layout.numel, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="at most the layout's 2 requests"):
        plan_uniform_on_device(padded_indptrs([1, 1, 1], 3), padded_indptrs([5, 5, 5], 3), meta, layout, 16, CONFIGS[2])
    with pytest.raises(ValueError, match="int32"):
        plan_uniform_on_device(padded_indptrs([1], 1).long(), padded_indptrs([5], 1), meta, layout, 16, CONFIGS[2])
    with pytest.raises(ValueError, match="at least"):
        plan_uniform_on_device(padded_indptrs([1], 1), padded_indptrs([5], 1), meta[:8], layout, 16, CONFIGS[2])


def test_wrapper_plans_on_device_only_where_its_host_plan_is_uniform():
    """A graph wrapper plans on the device once a host plan pinned its path, and its device plan
    then matches the host's for new lengths; an eager wrapper refuses."""
    eager = MLAVerifyWrapper(torch.device(DEVICE))
    qo, kv = padded_indptrs([1], 1), padded_indptrs([300], 1)
    eager.plan(qo.cpu(), kv.cpu(), 16)
    assert not eager.plans_on_device
    with pytest.raises(ValueError, match="planned once on the host"):
        eager.plan_on_device(qo, kv)
    workspace = MLAVerifyWrapper(torch.device(DEVICE)).allocate_workspace(max_batch=1, max_draft=4, num_heads=16,
                                                                          use_cuda_graph=True)
    graph = MLAVerifyWrapper(torch.device(DEVICE), workspace=workspace, use_cuda_graph=True)
    assert not graph.plans_on_device  # no host plan yet: path and tiles unknown
    graph.plan(qo.cpu(), kv.cpu(), 16)
    assert graph.plans_on_device
    graph.plan_on_device(padded_indptrs([3], 1), padded_indptrs([9000], 1))
    assert graph.device_plan_matches([3], [9000]) and not graph.device_plan_matches([3], [9001])



def test_a_graph_wrapper_keeps_the_schedule_a_plan_named():
    """A graph wrapper planned once with ``schedule="uniform"`` plans uniformly after (a plan
    naming none keeps it) and on the device; a bad schedule is refused and kept nowhere."""
    workspace = MLAVerifyWrapper(torch.device(DEVICE)).allocate_workspace(max_batch=4, max_draft=4, num_heads=16,
                                                                          use_cuda_graph=True)
    graph = MLAVerifyWrapper(torch.device(DEVICE), workspace=workspace, use_cuda_graph=True)
    with pytest.raises(ValueError, match="Expected schedule in"):
        graph.plan(padded_indptrs([4, 4], 2).cpu(), padded_indptrs([900, 900], 2).cpu(), 16, schedule="even")
    assert graph.planned is None and not graph.plans_on_device
    graph.plan(padded_indptrs([4] * 4, 4).cpu(), padded_indptrs([700] * 4, 4).cpu(), 16, schedule="uniform")
    graph.plan(padded_indptrs([4, 3], 2).cpu(), padded_indptrs([5000, 40], 2).cpu(), 16)
    want = plan_work([4, 3], [5000, 40], 16, DIMS, graph.planned.config, schedule="uniform")
    assert np.array_equal(graph.planned.work_kv_end, want.work_kv_end) and graph.plans_on_device
    graph.plan_on_device(padded_indptrs([2, 4, 1], 4), padded_indptrs([12000, 300, 64], 4))
    assert graph.device_plan_matches([2, 4, 1], [12000, 300, 64])


@pytest.mark.gpu
def test_hopper_graph_wrapper_plans_several_requests_on_the_device_when_uniform():
    """On the Hopper path a graph workspace of several requests plans on the device once its host
    plan was uniform (a drafter's buckets), and not with the default schedule ("waves")."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU")
    plans = {}
    for schedule in (None, "uniform"):
        workspace = MLAVerifyWrapper(torch.device("cuda")).allocate_workspace(max_batch=8, max_draft=4, num_heads=16,
                                                                              use_cuda_graph=True)
        graph = MLAVerifyWrapper(torch.device("cuda"), workspace=workspace, use_cuda_graph=True)
        graph.plan(padded_indptrs([4] * 8, 8).cpu(), padded_indptrs([2048] * 8, 8).cpu(), 16, schedule=schedule)
        plans[schedule] = graph
    assert plans[None].path == plans["uniform"].path == "hopper"
    assert not plans[None].plans_on_device and plans["uniform"].plans_on_device
    graph = plans["uniform"]
    graph.plan_on_device(padded_indptrs([4, 4, 4, 4], 8), padded_indptrs([17000, 17000, 17001, 16999], 8))
    assert graph.device_plan_matches([4, 4, 4, 4], [17000, 17000, 17001, 16999])
    assert not graph.device_plan_matches([4, 4, 4, 4], [17000, 17000, 17001, 17000])


# Compiled in a child process: the suite runs Triton's interpreter, which never compiles.
_COMPILE_FOR_HOPPER = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernel.device_plan import _uniform_plan_kernel as kernel
pointers = {"QO_INDPTR", "KV_INDPTR", "META"}
signature = {n: "constexpr" if n.startswith("BLOCK_") else "*i32" if n in pointers else "i32" for n in kernel.arg_names}
for block_b in map(int, sys.argv[1:]):
    try:
        triton.compile(ASTSource(kernel, signature=signature, constexprs={"BLOCK_B": block_b, "BLOCK_I": 64}),
                       target=GPUTarget("cuda", 90, 128))
    except Exception as error:
        print(f"BLOCK_B={block_b}: {str(error).splitlines()[0]}")
"""


def test_device_plan_compiles_for_hopper():
    """Every bucket's plan kernel compiles for sm_90 (no GPU needed). The interpreter runs any
    bucket, but Triton's compiler failed at 32 and 64 requests (a sum over the same broadcast
    entries in two loops), which only a capture on a GPU would have shown."""
    blocks = [2, 4, 8, 16, 32, 64, 128, 256]  # a graph bucket's requests, padded to a power of two
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_HOPPER, *map(str, blocks)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not done.stdout.strip(), done.stdout
