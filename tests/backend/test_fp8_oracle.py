"""Block-FP8 checkpoints in DeepSeek's layout (experts, shared experts and the MTP module) against
transformers' own fine-grained FP8 path loading the same folder (on a CPU it dequantizes into
the model dtype), fp32 compute; the engine's dequantization against a float64 block reference;
and the FP8-held model (``keep_fp8``, the CUDA representation) against the dequantized one.

Tolerance: tokens exact; prefill logits within 1e-4 of transformers' (as the unquantized oracle
test: both dequantize to the same float32 weights, then reduce in different orders). The
FP8-held model computes the same float32 products in the same order on the CPU: logits equal.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is the oracle of these tests (pip install -e .[test])")
pytest.importorskip("accelerate", reason="transformers loads FP8 checkpoints only with accelerate (pip install -e .[test])")

from serving.configs.model import ModelConfig
from serving.kv.batch import StepBatch, StepEntry
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.model.weights import load_weights
from serving.quant.fp8 import BlockFP8Weight
from serving.stack import ServingConfig, build_engine
from tests.backend.fp8_models import block_dequantize, save_fp8
from tests.backend.hf_models import hf_greedy, load_hf

PROMPTS = [[5, 17, 99, 3, 42, 8, 8, 1], [7], [200, 201, 202, 200, 201, 202, 200], list(range(30, 70))]
NEW_TOKENS = 12
LOGIT_ATOL = 1e-4
VARIANTS = {
    "moe-shared-mtp": dict(),
    # q LoRA of one block (q_a_proj + kv_a_proj_with_mqa fused in FP8), experts of one block, yarn rope
    "q-lora-aligned": dict(q_lora_rank=128, moe_intermediate_size=128, rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64, mscale=1.0,
        mscale_all_dim=1.0, beta_fast=32, beta_slow=1)),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for i, (name, overrides) in enumerate(VARIANTS.items()):
        folder = save_fp8(tmp_path_factory.mktemp(name), seed=10 + i, **overrides)
        out[name] = (folder, load_hf(folder))
    return out


def engine_for(model, speculate=None):
    return build_engine(ServingConfig(backend="reference", speculate=speculate, pool_slots=512), model).engine


def prefill_logits(engine, prompt):
    slots = engine.pool.alloc(len(prompt))
    logits = engine.runner.extend(StepBatch("extend", [StepEntry(0, 0, slots, prompt, list(range(len(prompt))))]))
    engine.pool.free(slots)
    return logits


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_decoding_is_token_exact_with_transformers_fp8(checkpoints, variant):
    folder, hf = checkpoints[variant]
    stored = stored_tensors(folder)  # transformers applied the scales (its FP8 path, not a plain cast)
    o = "model.layers.0.self_attn.o_proj.weight"
    assert torch.equal(hf.model.layers[0].self_attn.o_proj.weight, block_dequantize(stored[o], stored[o + "_scale_inv"]).float())
    model = DeepseekV3Model.from_folder(folder)
    assert model.has_mtp
    engine = engine_for(model)
    for prompt in PROMPTS[:2]:
        with torch.no_grad():
            want = hf(torch.tensor([prompt])).logits[0]
        assert want.std() > 1.0, "logits should be spread (decisive greedy decoding)"
        torch.testing.assert_close(prefill_logits(engine, prompt), want, atol=LOGIT_ATOL, rtol=0)
    want = [hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]
    assert [r.output for r in engine.generate(PROMPTS, NEW_TOKENS)] == want
    speculative = engine_for(model, "mtp:2x3")  # the FP8 MTP module drafts; verification keeps greedy's tokens
    assert [r.output for r in speculative.generate(PROMPTS, NEW_TOKENS)] == want
    assert speculative.stats.accepted_drafts >= 0 and speculative.pool.leaked_slots() == 0


def stored_tensors(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    stored = {}
    for path in folder.glob("*.safetensors"):
        stored.update(load_file(str(path)))
    return stored


def test_dequantized_weights_equal_a_float64_block_reference(tmp_path):
    """Distinct scales in partial blocks (176-row kv_a, 224 x 160 kv_b, 160-wide experts)."""
    folder = save_fp8(tmp_path, seed=3, oracle=False)
    cfg = ModelConfig.from_folder(folder)
    got = load_weights(folder, cfg, torch.float32, torch.device("cpu"), keep_fp8=False)
    stored = stored_tensors(folder)
    fp8 = [n for n, t in stored.items() if t.dtype == torch.float8_e4m3fn]
    assert len(fp8) > 20 and any(".experts." in n for n in fp8) and any(n.startswith("model.layers.2.") for n in fp8)
    kv_a = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv"
    assert stored[kv_a].shape == (2, 2) and len(stored[kv_a].unique()) == 4, "the partial blocks have their own scales"
    for name in fp8:
        want = block_dequantize(stored[name], stored[name + "_scale_inv"]).float()
        assert torch.equal(got[name], want), name
    assert not any(n.endswith("_scale_inv") for n in got)


def test_the_fp8_held_model_computes_what_the_dequantized_one_does(checkpoints):
    """``keep_fp8``: projections held as FP8 bytes + scales (fused and stacked in FP8 where the
    blocks line up), dequantized per GEMM on the CPU; kv_b_proj dequantized once at load."""
    folder, _ = checkpoints["q-lora-aligned"]
    held = DeepseekV3Model.from_folder(folder, keep_fp8=True)
    plain = DeepseekV3Model.from_folder(folder)
    a = "model.layers.1.self_attn."
    assert isinstance(held.fused[a + "q_a_kv_a"], BlockFP8Weight) and isinstance(held.w[a + "o_proj.weight"], BlockFP8Weight)
    assert isinstance(held.fused["model.layers.0.mlp.gate_up"], BlockFP8Weight)
    assert all(isinstance(w, BlockFP8Weight) for w in held.experts[1])  # stacked routed experts
    assert isinstance(held.w["model.layers.2.mlp.shared_experts.down_proj.weight"], BlockFP8Weight)  # the MTP block
    kv_b = a + "kv_b_proj.weight"
    assert isinstance(held.w[kv_b], torch.Tensor) and torch.equal(held.w[kv_b], plain.w[kv_b])
    assert torch.equal(held.w_uk[1], plain.w_uk[1]) and torch.equal(held.w_uv[1], plain.w_uv[1])
    assert not isinstance(plain.w[a + "o_proj.weight"], BlockFP8Weight)
    for prompt in PROMPTS[2:]:
        assert torch.equal(prefill_logits(engine_for(held), prompt), prefill_logits(engine_for(plain), prompt))
    want = [r.output for r in engine_for(plain).generate(PROMPTS, NEW_TOKENS)]
    assert [r.output for r in engine_for(held).generate(PROMPTS, NEW_TOKENS)] == want
    assert [r.output for r in engine_for(held, "mtp:2x3").generate(PROMPTS, NEW_TOKENS)] == want
