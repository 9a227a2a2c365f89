"""Block-FP8 checkpoints the engine does not serve are refused before anything is allocated,
with the key or the tensor named: other quantization formats, another fmt or block size,
missing, mis-shaped or bad scales, FP8 where DeepSeek's layout keeps a tensor unquantized, and
tensor-parallel shard boundaries inside a 128-block. Through the command line: exit 2, one line.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers writes the config.json of these tests (pip install -e .[test])")

from serving.configs.model import ConfigError, ModelConfig
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.model.weights import WeightError
from serving.stack.cli import main
from tests.backend.fp8_models import (
    FP8_CONFIG,
    rewrite,
    save_fp8,
    with_quantization_config,
)

Q_PROJ = "model.layers.0.self_attn.q_proj.weight"
EXPERT = "model.layers.1.mlp.experts.3.down_proj.weight"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_fp8(tmp_path_factory.mktemp("fp8"), seed=0)


def generate(capsys, folder) -> tuple[int, str, str]:
    code = main(["generate", "--model", str(folder), "--prompt", "1,2,3", "--max-new-tokens", "2"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "quant, message",
    [
        (dict(quant_method="awq", bits=4), "Expected quantization_config.quant_method 'fp8' (DeepSeek's block FP8, the one quantized format served), got 'awq' (int4 weights)"),
        (dict(quant_method="gptq", bits=4), "got 'gptq' (int4 weights)"),
        (dict(quant_method="compressed-tensors", format="pack-quantized"), "got 'compressed-tensors' (int4 or int8 packed weights)"),
        (dict(quant_method="int8"), "got 'int8' (int8 weights)"),
        (dict(FP8_CONFIG, fmt="e5m2"), "Expected quantization_config.fmt 'e4m3' (float8_e4m3fn weights), got 'e5m2'"),
        (dict(FP8_CONFIG, weight_block_size=[64, 64]), "Expected quantization_config.weight_block_size [128, 128] (the block the FP8 kernels support), got [64, 64]"),
        (dict(FP8_CONFIG, weight_block_size=[1, 128]), "got [1, 128]"),
        (dict(FP8_CONFIG, activation_scheme="static"), "Expected quantization_config.activation_scheme 'dynamic', got 'static'"),
    ],
)
def test_unsupported_quantization_configs_exit_2_naming_the_key(capsys, folder, tmp_path, quant, message):
    bad = with_quantization_config(folder, tmp_path / "bad", quant)
    with pytest.raises(ConfigError, match="quantization_config"):
        ModelConfig.from_folder(bad)
    code, out, err = generate(capsys, bad)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad / 'config.json'}: ") and message in lines[0], err


def edited(folder, tmp_path, edit):
    return rewrite(folder, tmp_path / "edited", edit)


def drop(name):
    return lambda t: {k: v for k, v in t.items() if k != name}


def replace(name, value):
    return lambda t: {**t, name: value(t[name])}


def rename(old, new):
    return lambda t: {(new if k == old else k): v for k, v in t.items()}


@pytest.mark.parametrize(
    "edit, message",
    [
        (drop(Q_PROJ + "_scale_inv"), f"Expected the block scales {Q_PROJ}_scale_inv beside the FP8 weight {Q_PROJ}"),
        (drop(EXPERT + "_scale_inv"), f"Expected the block scales {EXPERT}_scale_inv beside the FP8 weight {EXPERT}"),
        (replace(Q_PROJ + "_scale_inv", lambda s: torch.ones(1, 1)),
         f"Expected {Q_PROJ}_scale_inv of shape (1, 2) (ceil([128, 256] / 128) per 128x128 block), got (1, 1)"),
        (replace(Q_PROJ + "_scale_inv", lambda s: torch.ones(2, 4)), "of shape (1, 2) (ceil([128, 256] / 128) per 128x128 block), got (2, 4)"),
        (replace(Q_PROJ + "_scale_inv", lambda s: s.to(torch.bfloat16)), f"Expected {Q_PROJ}_scale_inv as float32 block scales, got BF16"),
        (replace("model.embed_tokens.weight", lambda w: w.float().to(torch.float8_e4m3fn)),
         "Expected model.embed_tokens.weight unquantized (embeddings, norms, the router and the heads stay in bf16/fp32"),
        (replace("lm_head.weight", lambda w: w.float().to(torch.float8_e4m3fn)), "Expected lm_head.weight unquantized"),
        (replace("model.layers.1.mlp.gate.weight", lambda w: w.float().to(torch.float8_e4m3fn)), "Expected model.layers.1.mlp.gate.weight unquantized"),
        (replace(Q_PROJ, lambda w: w.float().to(torch.float8_e5m2)), f"Expected FP8 weights as float8_e4m3fn (fmt e4m3), got {Q_PROJ} as F8_E5M2"),
        (replace(Q_PROJ, lambda w: w.float().to(torch.bfloat16)), f"only beside an FP8 weight, got {Q_PROJ} unquantized"),  # kept its scale
        (rename(Q_PROJ + "_scale_inv", "model.norm.weight_scale_inv"), "Expected scales only beside an FP8 projection's weight, got model.norm.weight_scale_inv"),
    ],
    ids=["missing-scale", "missing-expert-scale", "scale-too-small", "scale-too-large", "scale-bf16", "fp8-embeddings",
         "fp8-lm-head", "fp8-router", "e5m2-weight", "scale-beside-bf16", "scale-of-a-norm"],
)
def test_bad_fp8_layouts_are_refused_naming_the_tensor(capsys, folder, tmp_path, edit, message):
    bad = edited(folder, tmp_path, edit)
    with pytest.raises(WeightError) as info:
        DeepseekV3Model.from_folder(bad)
    assert message in str(info.value)
    code, out, err = generate(capsys, bad)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and message in err


class ReadSpy:
    """``safetensors.safe_open`` recording the names of the tensors read (whole or sliced)."""

    def __init__(self, real) -> None:
        self.real, self.read = real, []

    def __call__(self, path, framework):
        spy, handle = self, self.real(path, framework=framework)

        class Handle:
            def __enter__(self):
                handle.__enter__()
                return self

            def __exit__(self, *exc):
                return handle.__exit__(*exc)

            def get_tensor(self, name):
                spy.read.append(name)
                return handle.get_tensor(name)

            def get_slice(self, name):
                spy.read.append(name)
                return handle.get_slice(name)

        return Handle()


@pytest.mark.parametrize("value", [float("nan"), 0.0, -0.5, float("inf")], ids=["nan", "zero", "negative", "inf"])
def test_a_bad_scale_value_is_refused_before_any_weight_is_read(capsys, folder, tmp_path, monkeypatch, value):
    import safetensors

    def poison(s):
        s = s.clone()
        s[0, 1] = value
        return s

    bad = edited(folder, tmp_path, replace(EXPERT + "_scale_inv", poison))
    spy = ReadSpy(safetensors.safe_open)
    monkeypatch.setattr(safetensors, "safe_open", spy)
    with pytest.raises(WeightError) as info:
        DeepseekV3Model.from_folder(bad)
    monkeypatch.undo()
    assert f"Expected every block scale of {EXPERT}_scale_inv finite and > 0, got {value} at block [0, 1]" in str(info.value)
    assert spy.read and all(name.endswith("_scale_inv") for name in spy.read), "only scales are read before the check"
    code, _, err = generate(capsys, bad)
    assert code == 2 and f"scale of {EXPERT}_scale_inv finite and > 0" in err


def test_fp8_tensors_without_a_quantization_config_are_refused(folder, tmp_path):
    bad = with_quantization_config(folder, tmp_path / "plain", None)
    with pytest.raises(WeightError, match="while config.json has no quantization_config"):
        DeepseekV3Model.from_folder(bad)


def test_shard_boundaries_inside_a_block_are_refused_with_the_numbers(folder):
    from serving.parallel.sharding import check_shardable

    cfg = ModelConfig.from_folder(folder)  # 2 heads of 48 + 16: one head's q rows are 64 of a 128-block
    with pytest.raises(ValueError) as info:
        check_shardable(cfg, 2)
    assert str(info.value).startswith("Expected each rank's rows of q_proj (heads x qk_head_dim = 1 x 64) to be a multiple of "
                                      "the FP8 block size 128 under tensor-parallel size 2, got 64: the shard boundary at 64 cuts a 128-block")
    unquantized = ModelConfig.from_dict({**cfg_raw(folder), "quantization_config": None})
    check_shardable(unquantized, 2)  # the same dimensions split unquantized


def cfg_raw(folder):
    import json

    return json.loads((folder / "config.json").read_text())
