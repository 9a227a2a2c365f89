"""The demo trainer: the same inputs give the same model bit for bit, its long windows are
trained, and its record says how well each position range is predicted."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from serving.demo.train import SIZES, position_buckets, run, window

# A short corpus and run, long window included (steps 3 and 7 at tiny size).
SHORT = dict(max_bytes=120_000, max_files=800, tokenizer_bytes=60_000)


def _tensors(folder):
    return {**load_file(str(folder / "model.safetensors")), **load_file(str(folder / "mtp.safetensors"))}


def _same_run(a, b) -> list[str]:
    """Names of the tensors that differ between two saved runs (all must exist in both)."""
    ta, tb = _tensors(a), _tensors(b)
    assert ta.keys() == tb.keys()
    return [k for k in ta if not torch.equal(ta[k], tb[k])]


def test_two_runs_save_the_same_model_bit_for_bit(tmp_path):
    s1 = run(tmp_path / "a", tiny=True, steps=8, log=lambda *_: None, **SHORT)
    s2 = run(tmp_path / "b", tiny=True, steps=8, log=lambda *_: None, **SHORT)
    assert _same_run(tmp_path / "a", tmp_path / "b") == []
    assert [h["loss"] for h in s1["history"]] == [h["loss"] for h in s2["history"]]
    # ... and the check can fail: another seed is another model.
    run(tmp_path / "c", tiny=True, steps=8, seed=1, log=lambda *_: None, **SHORT)
    assert _same_run(tmp_path / "a", tmp_path / "c")


def test_long_windows_are_part_of_training_and_evaluated_by_position(tmp_path):
    size = dict(SIZES["tiny"])
    steps = 8
    s = run(tmp_path / "m", tiny=True, steps=steps, log=lambda *_: None, **SHORT)
    windows = [window(size, i) for i in range(steps)]
    assert (1, size["long_seq"]) in windows and (size["batch"], size["seq"]) in windows
    assert s["tokens_seen"] == sum(b * n for b, n in windows)
    by_pos = s["heldout_by_position"]
    # the ranges cover every position of a long window, short windows' first
    assert list(by_pos) == [f"{lo}-{hi}" for lo, hi in position_buckets(size["long_seq"], size["seq"])]
    assert list(by_pos)[0] == f"0-{size['seq']}" and list(by_pos)[-1].endswith(f"-{size['long_seq']}")
    for row in by_pos.values():
        assert 0 < row["loss"] < 20 and 0 <= row["top1"] <= 1 and 0 < row["mtp_loss"] < 20
    assert json.loads((tmp_path / "m" / "train.json").read_text())["heldout_by_position"] == by_pos


def test_default_size_trains_16k_positions():
    size = SIZES["default"]
    assert size["long_seq"] >= 16384  # the speculation gate serves 16k contexts
    assert any(window(size, i) == (1, size["long_seq"]) for i in range(size["long_every"]))


def test_unknown_size_entries_are_refused(tmp_path):
    with pytest.raises(ValueError, match="Expected size entries"):
        run(tmp_path / "x", tiny=True, steps=1, log=lambda *_: None, long_sequence=4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the GPU's training kernels)")
def test_full_shape_training_on_the_gpu_is_deterministic(tmp_path):
    """The full-size model on the GPU's kernels (bf16 autocast, SDPA at 2k and 16k windows),
    a short run twice: the same tensors bit for bit."""
    short = dict(max_bytes=4_000_000, tokenizer_bytes=2_000_000, long_every=4)
    run(tmp_path / "a", steps=8, log=lambda *_: None, **short)
    run(tmp_path / "b", steps=8, log=lambda *_: None, **short)
    assert _same_run(tmp_path / "a", tmp_path / "b") == []


def test_training_attention_is_causal_attention_with_its_own_value_width():
    """The value heads padded for the flash kernels and cut back: the same attention as SDPA
    computes on the unpadded heads (float64), a mask refused."""
    import torch.nn.functional as F

    from serving.demo.train import padded_flash_attention

    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, 17, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, 17, 4, generator=gen, dtype=torch.float64)
    out, weights = padded_flash_attention(None, q, k, v, None, scaling=0.3)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3).transpose(1, 2)
    assert weights is None and out.shape == (2, 17, 3, 4)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="Expected unmasked causal"):
        padded_flash_attention(None, q, k, v, torch.ones(17, 17, dtype=torch.bool))
