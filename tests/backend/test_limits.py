"""Memory estimates (``serving.model.limits``): exact where they count tensors, an upper bound
where they bound activations, and refusals that allocate nothing.

No test here allocates more than a few hundred MB: refusals use configs and sizes that would
need terabytes, run in a child capped by RLIMIT_DATA, and assert that its peak RSS stayed
within 50 MB of a child that only imports the engine.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

pytest.importorskip("transformers", reason="transformers writes the checkpoints of these tests (pip install -e .[test])")

from serving.model.deepseek_v3 import DeepseekV3Model
from serving.model.limits import (
    MARGIN,
    MemoryLimitError,
    available_bytes,
    check,
    count_parameters,
    estimate,
)
from serving.model.presets import PRESETS, preset_config, random_model
from serving.model.weights import expected_shapes
from tests.backend.hf_models import save_tiny
from tests.backend.processes import run_python, run_serving

VARIANTS = [
    ("tiny", {}), ("tiny", dict(q_lora_rank=24, attention_bias=True)), ("tiny", dict(tie_word_embeddings=True, n_shared_experts=0)),
    ("tiny", dict(first_k_dense_replace=5)), ("tiny", dict(first_k_dense_replace=0, n_routed_experts=None)),
] + [(name, {}) for name in PRESETS]


@pytest.mark.parametrize("preset, overrides", VARIANTS)
def test_closed_form_counts_match_the_tensor_list(preset, overrides):
    cfg = preset_config(preset, **overrides)
    shapes = expected_shapes(cfg)
    counts = count_parameters(cfg)
    routers = sum(math.prod(s) for k, s in shapes.items() if k.endswith(("mlp.gate.weight", "e_score_correction_bias")))
    assert counts.total == sum(math.prod(s) for s in shapes.values())
    assert counts.fp32 == routers and counts.tensors == len(shapes)
    assert counts.largest >= max(math.prod(s) for s in shapes.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_estimate_covers_what_the_model_holds(dtype):
    """Every tensor the model keeps, storages counted once, is within the estimate; the rest of
    the estimate is the documented transient (one MoE layer's experts twice while stacked)."""
    cfg = preset_config("tiny")
    model = random_model("tiny", dtype=dtype)
    held = list(model.w.values()) + model.w_uk + model.w_uv + [t for pair in model.experts.values() for t in pair]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
    est = estimate(cfg, "cpu", dtype)
    transient = 2 * cfg.n_routed_experts * 3 * cfg.moe_intermediate_size * cfg.hidden_size * torch.empty(0, dtype=dtype).element_size()
    assert sum(storages.values()) <= est.weights <= sum(storages.values()) + transient


def test_pool_estimate_is_exact():
    cfg = preset_config("tiny")
    pool = random_model("tiny").new_pool(1000, torch.bfloat16)
    assert estimate(cfg, "cpu", torch.float32, pool_dtype=torch.bfloat16, pool_slots=1000).pool == pool.kv.nbytes


ABSURD = [dict(num_hidden_layers=10**9), dict(n_routed_experts=400_000_000, n_group=1)]


@pytest.fixture(scope="module")
def baseline_mb():
    """Peak RSS of a child that imports the engine and does nothing else."""
    return run_python("import serving.stack.cli").peak_rss_mb


@pytest.mark.parametrize("overrides", ABSURD)
def test_absurd_random_models_are_refused_before_anything_is_built(overrides, baseline_mb):
    code = f"""
from serving.model.presets import random_model
try:
    random_model("tiny", **{overrides!r})
except Exception as exc:
    print(type(exc).__name__, exc)
"""
    run = run_python(code, timeout=60)
    assert run.stdout.startswith("MemoryLimitError Expected what the engine allocates to fit in 90% of the "), run.stderr
    assert re.search(r"got an estimated [\d.]+ (TiB|PiB)", run.stdout)
    assert run.peak_rss_mb < baseline_mb + 50


@pytest.mark.parametrize("overrides", ABSURD)
def test_absurd_configs_are_refused_before_the_checkpoint_is_read(tmp_path, overrides, baseline_mb):
    folder = save_tiny(tmp_path)
    raw = json.loads((folder / "config.json").read_text())
    raw.update(overrides)
    (folder / "config.json").write_text(json.dumps(raw))
    code = f"""
from serving.model.deepseek_v3 import DeepseekV3Model
try:
    DeepseekV3Model.from_folder({str(folder)!r})
except Exception as exc:
    print(type(exc).__name__, exc)
"""
    run = run_python(code, timeout=60)
    assert run.stdout.startswith("MemoryLimitError "), run.stderr
    assert re.search(r"weights [\d.]+ (TiB|PiB) \([\d,]+ parameters, float32\)", run.stdout)
    assert run.peak_rss_mb < baseline_mb + 50


def test_refusal_message_has_the_numbers_and_a_fix():
    cfg = preset_config("tiny")
    fp = estimate(cfg, "cpu", torch.float32, pool_slots=10_004_192, prompt_lens=[10_000_000], max_new_tokens=32)
    with pytest.raises(MemoryLimitError) as info:
        check(fp, device_free=16 << 30)
    message = str(info.value)
    assert "90% of the 16.0 GiB free on cpu" in message and "\n" not in message
    assert "KV pool 3.6 GiB (10,004,192 slots x 2 layers x 48 x 4 B)" in message
    assert "prefill 9.2 GiB for a 32,768-token chunk over 10,000,000 tokens of context, decode 3.8 GiB over up to 10,000,096 tokens" in message
    assert message.endswith("use a smaller --prefill-chunk, shorter prompts or fewer --max-new-tokens")
    check(estimate(cfg, "cpu", torch.float32, pool_slots=4096, prompt_lens=[64], max_new_tokens=32), device_free=16 << 30)


def test_prefill_estimate_has_no_queries_by_keys_term():
    cfg = preset_config("dsv3-tp8")
    prefill = [estimate(cfg, "cuda", torch.bfloat16, pool_slots=1, prompt_lens=[n], prefill_chunk=32768).prefill
               for n in (100_000, 200_000, 300_000)]
    assert prefill[2] - prefill[1] == prefill[1] - prefill[0] > 0  # linear in the context at a fixed chunk


def test_margin_and_availability():
    assert 0 < MARGIN < 1
    assert available_bytes(torch.device("cpu")) > 0
    fp = estimate(preset_config("tiny"), "cpu", torch.float32, pool_slots=4096, prompt_lens=[64])
    check(fp, device_free=math.ceil(fp.on_device / MARGIN))
    with pytest.raises(MemoryLimitError):
        check(fp, device_free=int(fp.on_device / MARGIN) - 1)


@pytest.mark.parametrize("n", [8000, 30000])
def test_estimate_bounds_the_measured_peak(n):
    """A prefill on ``tiny`` (per-token and K/V terms dominate; 30000 tokens are one chunk): the
    child's peak RSS over a one-token run stays under the estimate, and the estimate is not wildly
    pessimistic (nothing grows with queries x keys: a chunk once packed 2 T^2 bytes)."""
    small = run_serving("--random-model", "tiny", "--prompt", "1", "--max-new-tokens", 2, "--json")
    long = run_serving("--random-model", "tiny", "--random-prompt", n, "--max-new-tokens", 2, "--context-length", n + 2, "--json")
    assert small.returncode == 0 and long.returncode == 0, long.stderr
    fp = estimate(preset_config("tiny"), "cpu", torch.float32, pool_slots=n + 2 + 64 + 4096, prompt_lens=[n], max_new_tokens=2,
                  random_weights=True)
    grown = (long.peak_rss_mb - small.peak_rss_mb) * 2**20
    assert grown <= fp.on_device <= 4 * grown
