"""The engine against transformers' DeepseekV3ForCausalLM (the independent oracle), fp32 on CPU.

Tolerance: prefill logits within 1e-4 absolute (logits spread by a few units; fp32 reductions
in a different order differ by ~1e-5).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is the oracle of these tests (pip install -e .[test])")

from serving.kv.batch import StepBatch, StepEntry
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.stack import ServingConfig, build_engine
from tests.backend.hf_models import hf_greedy, load_hf, save_tiny

LOGIT_ATOL = 1e-4
PROMPTS = [[5, 17, 99, 3, 42, 8, 8, 1], [7], [100, 101, 102, 100, 101, 102, 100], list(range(30, 60))]

VARIANTS = {
    "moe-yarn-interleave": dict(),
    "q-lora-default-rope": dict(q_lora_rank=24, rope=dict(rope_type="default", rope_theta=10000.0)),
    "half-split-rope-dense": dict(rope_interleave=False, first_k_dense_replace=2),
    "moe-no-norm-topk": dict(norm_topk_prob=False, n_group=1, topk_group=1, first_k_dense_replace=0),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name, overrides in VARIANTS.items():
        folder = save_tiny(tmp_path_factory.mktemp(name), seed=len(out), **overrides)
        out[name] = (folder, load_hf(folder))
    return out


def engine_for(folder, backend="reference", pool_dtype=torch.float32, slots=256, drafter=None):
    model = DeepseekV3Model.from_folder(folder)
    pool = model.new_pool(slots, pool_dtype)
    return build_engine(ServingConfig(backend=backend, speculate=drafter, pool_slots=slots), model, pool).engine


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_logits_match_transformers(checkpoints, variant):
    folder, hf = checkpoints[variant]
    eng = engine_for(folder)
    for prompt in PROMPTS:
        with torch.no_grad():
            want = hf(torch.tensor([prompt])).logits[0]
        slots = eng.pool.alloc(len(prompt))
        got = eng.runner.extend(StepBatch("extend", [StepEntry(0, 0, slots, prompt, list(range(len(prompt))))]))
        eng.pool.free(slots)
        assert want.std() > 1.0, "logits should be spread (decisive greedy decoding)"
        torch.testing.assert_close(got, want, atol=LOGIT_ATOL, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_decoding_is_token_exact_with_transformers_generate(checkpoints, variant):
    folder, hf = checkpoints[variant]
    eng = engine_for(folder)
    results = eng.generate(PROMPTS, 16)
    for prompt, req in zip(PROMPTS, results):
        assert req.error is None
        assert req.output == hf_greedy(hf, prompt, 16), f"prompt {prompt}"
    assert eng.pool.leaked_slots() == 0 and eng.pool.allocator.num_free == eng.pool.allocator.capacity


def test_chunked_prefill_matches_one_shot(checkpoints):
    folder, hf = checkpoints["moe-yarn-interleave"]
    eng = engine_for(folder)
    eng.prefill_chunk = 7
    prompt = PROMPTS[3]
    assert eng.generate([prompt], 8)[0].output == hf_greedy(hf, prompt, 8)


def test_kernel_backend_under_the_interpreter_matches_transformers(checkpoints):
    """The Triton kernel (bf16 pool) decodes the same tokens as transformers in fp32."""
    folder, hf = checkpoints["moe-yarn-interleave"]
    eng = engine_for(folder, backend="kernel", pool_dtype=torch.bfloat16)
    prompts = PROMPTS[:2]
    results = eng.generate(prompts, 6)
    for prompt, req in zip(prompts, results):
        assert req.output == hf_greedy(hf, prompt, 6)
    assert eng.pool.leaked_slots() == 0
