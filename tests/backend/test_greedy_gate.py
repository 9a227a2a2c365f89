"""Phase backend's gate ``greedy``: its CPU profile (kernel under the interpreter), its near-tie
accounting, and a small GPU profile."""

from __future__ import annotations

import pytest
import torch

from phases.backend import greedy
from phases.common.greedy import compare
from serving.engine.engine import Request

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (H200 profile)")


def test_greedy_gate_cpu_profile_passes():
    m = greedy.run(prompts=2, max_new_tokens=6, contexts=[8, 24], preset="tiny", speculate="tree:2x2", device="cpu")
    assert m["requests"] == 2 and m["requests_failed"] == 0
    assert m["mismatched_tokens"] == 0 and m["leaked_slots"] == 0
    assert m["tokens_compared"] == 12
    assert m["accepted_length_delta"] <= 0.01
    assert m["accepted_per_step_kernel"] > 0


def test_compare_counts_real_mismatches_and_separates_near_ties():
    ref = Request(1, [0], 5, output=[1, 2, 3, 4, 5], tie_flags=[False, False, True, False, False])
    assert compare(ref, Request(2, [0], 5, output=[1, 2, 3, 4, 5])) == (0, 0)
    assert compare(ref, Request(2, [0], 5, output=[1, 9, 3, 4, 5])) == (4, 0)
    assert compare(ref, Request(2, [0], 5, output=[1, 2, 9, 9, 9])) == (0, 1)
    assert compare(ref, Request(2, [0], 5, output=[1, 2, 3])) == (2, 0)


@gpu
@needs_cuda
def test_greedy_gate_small_gpu_profile():
    m = greedy.run(prompts=6, max_new_tokens=32, contexts=[512, 4096], preset="gpu-h16")
    assert m["requests_failed"] == 0 and m["mismatched_tokens"] == 0 and m["leaked_slots"] == 0


def test_greedy_gate_fp8_cpu_profile_passes():
    """The FP8 profile's path (a block-FP8 preset, dequantized at load on the CPU) end to end."""
    m = greedy.run(prompts=2, max_new_tokens=6, contexts=[8, 24], preset="tiny-fp8", speculate="tree:2x2", device="cpu")
    assert m["requests"] == 2 and m["requests_failed"] == 0
    assert m["mismatched_tokens"] == 0 and m["leaked_slots"] == 0 and m["tokens_compared"] == 12


@gpu
@needs_cuda
def test_greedy_gate_small_fp8_gpu_profile():
    """FP8 weights kept FP8 on CUDA: the streaming GEMM in every decode and verify step."""
    m = greedy.run(prompts=4, max_new_tokens=16, contexts=[256, 2048], preset="dsv3-tp8-fp8")
    assert m["requests_failed"] == 0 and m["mismatched_tokens"] == 0 and m["leaked_slots"] == 0
