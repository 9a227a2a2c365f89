"""Inputs the engine must refuse, each with a message that says what was expected."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is the oracle of these tests (pip install -e .[test])")
from safetensors.torch import load_file, save_file

from serving.attention.backends import KernelBackend
from serving.configs.model import ConfigError, ModelConfig
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.model.presets import random_model
from serving.model.weights import WeightError
from serving.stack import ServingConfig, build_engine
from tests.backend.hf_models import save_tiny


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny"))


def edit_config(folder, tmp_path, **changes):
    raw = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            raw.pop(k, None)
        else:
            raw[k] = v
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    return tmp_path


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(sliding_attention_window=4), r"unknown key\(s\) \['sliding_attention_window'\]"),
        (dict(architectures=["LlamaForCausalLM"]), r"architectures to include one of \('DeepseekV3ForCausalLM',\)"),
        (dict(model_type="llama"), r"model_type in \('deepseek_v3',\), got 'llama'"),
        (dict(rope_parameters=dict(rope_type="longrope", rope_theta=1e4)), r"rope_parameters.rope_type in \('default', 'yarn'\), got 'longrope'"),
        (dict(rope_parameters=None, rope_scaling=dict(type="dynamic", factor=2.0)), r"rope_scaling.rope_type in .*got 'dynamic'"),
        (dict(rope_parameters=dict(rope_type="yarn", rope_theta=1e4, original_max_position_embeddings=64)), r"rope_parameters.factor"),
        (dict(quantization_config=dict(quant_method="fp8")), r"Expected quantization_config.weight_block_size \[128, 128\].*got None"),
        (dict(scoring_func="softmax"), r"scoring_func 'sigmoid', got 'softmax'"),
        (dict(topk_method="greedy"), r"topk_method 'noaux_tc', got 'greedy'"),
        (dict(num_key_value_heads=1), r"num_key_value_heads == num_attention_heads"),
        (dict(kv_lora_rank=None), r"got none for \['kv_lora_rank'\]"),
        (dict(n_group=3), r"n_routed_experts divisible by n_group=3"),
        (dict(moe_layer_freq=2), r"moe_layer_freq 1 .*got 2"),
        (dict(hidden_act="gelu"), r"hidden_act 'silu', got 'gelu'"),
        (dict(rms_norm_eps=float("nan")), r"rms_norm_eps to be a finite number > 0, got nan"),
        (dict(rms_norm_eps=-1), r"rms_norm_eps to be a finite number > 0, got -1"),
        (dict(routed_scaling_factor=float("nan")), r"routed_scaling_factor to be a finite number > 0, got nan"),
        (dict(routed_scaling_factor=float("inf")), r"routed_scaling_factor to be a finite number > 0, got inf"),
        (dict(num_hidden_layers=-1), r"num_hidden_layers to be a positive integer, got -1"),
        (dict(hidden_size=0), r"hidden_size to be a positive integer, got 0"),
        (dict(vocab_size=128.5), r"vocab_size to be a positive integer, got 128.5"),
        (dict(num_attention_heads=True, num_key_value_heads=None), r"num_attention_heads to be a positive integer, got True"),
        (dict(q_lora_rank=0), r"q_lora_rank to be a positive integer, got 0"),
        (dict(n_routed_experts=-4), r"n_routed_experts to be a positive integer, got -4"),
        (dict(first_k_dense_replace=-1), r"first_k_dense_replace to be a non-negative integer, got -1"),
        (dict(moe_intermediate_size=0), r"positive moe_intermediate_size for the MoE layers, got 0"),
        (dict(topk_group=3, n_group=2), r"topk_group <= n_group=2, got 3"),
        (dict(num_experts_per_tok=3), r"num_experts_per_tok <= topk_group x experts per group \(2\), got 3"),
        (dict(qk_rope_head_dim=15), r"even qk_rope_head_dim"),
        (dict(attention_bias="yes"), r"attention_bias to be true or false, got 'yes'"),
        (dict(rope_parameters="yarn"), r"rope_parameters to be an object, got 'yarn'"),
        (dict(rope_parameters=dict(rope_type="default", rope_theta=float("nan"))), r"rope_parameters.rope_theta to be a finite number > 1, got nan"),
        (dict(rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=-4.0, original_max_position_embeddings=64)),
         r"rope_parameters.factor to be a finite number > 0, got -4.0"),
        (dict(rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0, original_max_position_embeddings=0)),
         r"rope_parameters.original_max_position_embeddings to be a positive integer, got 0"),
        (dict(architectures="DeepseekV3ForCausalLM"), r"architectures to be a list"),
        (dict(quantization_config="fp8"), r"Expected quantization_config to be an object, got 'fp8'"),
    ],
)
def test_bad_configs_name_the_key(folder, tmp_path, changes, message):
    bad = edit_config(folder, tmp_path, **changes)
    with pytest.raises(ConfigError, match=message) as info:
        DeepseekV3Model.from_folder(bad)
    assert str(info.value).startswith(f"{bad / 'config.json'}: ")  # the file is named


def test_missing_config(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        ModelConfig.from_folder(tmp_path)


def rewrite_weights(folder, tmp_path, edit):
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_weight_shape_mismatch(folder, tmp_path):
    name = "model.layers.0.self_attn.kv_b_proj.weight"
    bad = rewrite_weights(folder, tmp_path, lambda t: t.__setitem__(name, t[name][:-1].clone()))
    with pytest.raises(WeightError, match=r"Expected model.layers.0.self_attn.kv_b_proj.weight of shape \(64, 32\), got \(63, 32\)"):
        DeepseekV3Model.from_folder(bad)


def test_missing_and_unexpected_tensors(folder, tmp_path):
    bad = rewrite_weights(folder, tmp_path, lambda t: t.pop("model.layers.1.mlp.experts.3.up_proj.weight"))
    with pytest.raises(WeightError, match=r"Expected tensor 'model.layers.1.mlp.experts.3.up_proj.weight'"):
        DeepseekV3Model.from_folder(bad)
    other = tmp_path / "other"
    other.mkdir()
    bad = rewrite_weights(folder, other, lambda t: t.__setitem__("model.layers.0.self_attn.q_norm.weight", torch.ones(4)))
    with pytest.raises(WeightError, match=r"unexpected tensor 'model.layers.0.self_attn.q_norm.weight'"):
        DeepseekV3Model.from_folder(bad)


def test_fused_expert_tensors_load_like_per_expert_ones(folder, tmp_path):
    def fuse(t):
        p = "model.layers.1.mlp.experts."
        t[p + "gate_up_proj"] = torch.stack([torch.cat([t.pop(f"{p}{e}.gate_proj.weight"), t.pop(f"{p}{e}.up_proj.weight")]) for e in range(4)])
        t[p + "down_proj"] = torch.stack([t.pop(f"{p}{e}.down_proj.weight") for e in range(4)])

    fused = DeepseekV3Model.from_folder(rewrite_weights(folder, tmp_path, fuse))
    plain = DeepseekV3Model.from_folder(folder)
    for a, b in zip(fused.experts[1], plain.experts[1]):
        assert torch.equal(a, b)


def make_engine(slots, backend="reference", dtype=torch.float32):
    model = random_model("tiny")
    pool = model.new_pool(slots, dtype)
    return build_engine(ServingConfig(backend=backend, pool_slots=slots), model, pool).engine


def test_prompt_longer_than_the_pool():
    eng = make_engine(16)
    req = eng.generate([list(range(40))], 4)[0]
    assert req.error == "Expected a prompt shorter than the pool (15 slots), got 40 tokens" and req.output == []
    assert eng.pool.allocator.num_free == 15


@pytest.mark.parametrize("prompt, message", [([], "at least one token"), ([1, 128], r"token ids in \[0, 128\), got 128")])
def test_bad_prompts(prompt, message):
    eng = make_engine(16)
    req = eng.generate([prompt], 4)[0]
    assert req.error is not None and pytest.approx(0) == eng.pool.leaked_slots()
    import re

    assert re.search(message, req.error)


def test_pool_exhausted_mid_batch_fails_one_request_and_leaks_nothing():
    """Two prompts fill most of the pool; decoding runs out: the request that cannot get a slot
    fails with the pool's message, the other one finishes, every slot is free afterwards."""
    eng = make_engine(24)
    reqs = eng.generate([[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16]], 10)
    failed = [r for r in reqs if r.error]
    done = [r for r in reqs if not r.error]
    assert len(failed) == 1 and len(done) == 1
    assert failed[0].error.startswith("pool exhausted: asked 1, free 0")
    assert len(done[0].output) == 10
    assert eng.pool.allocator.num_free == eng.pool.allocator.capacity and eng.pool.leaked_slots() == 0
    alone = make_engine(64).generate([done[0].prompt], 10)[0]
    assert alone.output == done[0].output  # the failure did not disturb the survivor


def test_kernel_backend_refuses_a_float32_pool():
    model = random_model("tiny")
    with pytest.raises(ValueError, match="bf16 or fp16 KV pool for the kernel backend, got torch.float32"):
        KernelBackend(model.new_pool(8), 2, 32, model.sm_scale)
    with pytest.raises(ValueError, match="backend in"):
        ServingConfig(backend="flash")


def test_pool_exhausted_during_prefill_fails_that_request_only():
    eng = make_engine(21)  # 20 usable slots
    reqs = eng.generate([[1, 2, 3, 4, 5, 6, 7, 8], list(range(10, 23))], 3)
    assert reqs[0].error is None and len(reqs[0].output) == 3
    assert reqs[1].error == "pool exhausted: asked 13, free 12" and reqs[1].output == []
    assert eng.pool.allocator.num_free == 20 and eng.pool.leaked_slots() == 0
