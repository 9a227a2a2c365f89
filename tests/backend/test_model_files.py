"""Model folders and files the loader must refuse, with the file named and nothing read first.

Covers the folder itself (a file, a FIFO, a symlink loop), config.json (not JSON, not an object,
huge, a FIFO, not UTF-8) and the safetensors files: the header is read and checked by hand
(length, JSON, dtypes, shapes against data offsets against the file size) before any tensor is
materialised, and tensors of a non-floating dtype are refused by name.
"""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch

pytest.importorskip("transformers", reason="transformers writes the checkpoints of these tests (pip install -e .[test])")
from safetensors.torch import load_file, save_file

from serving.configs.model import ConfigError, ModelConfig
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.model.weights import WeightError, read_header
from tests.backend.hf_models import save_tiny


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny"))


def copy_with(folder, tmp_path, edit=None, config=None):
    """A copy of the tiny folder; ``edit(tensors)`` rewrites model.safetensors, ``config`` replaces config.json's text."""
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text(config if config is not None else (folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    if edit is not None:
        edit(tensors)
    save_file(tensors, str(out / "model.safetensors"))
    return out


def raw_safetensors(path, header: dict, data: bytes = b"", header_len: int | None = None):
    """Write a safetensors file by hand: 8-byte little-endian header length, JSON header, data."""
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if header_len is None else header_len) + text + data)
    return path


# ---- the folder and config.json -----------------------------------------------------------


def test_model_folder_that_is_a_file_a_fifo_or_a_symlink_loop(tmp_path):
    (tmp_path / "file").write_text("{}")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for name, message in [("file", "got a regular file"), ("fifo", "got a FIFO"), ("loop", "unreadable path: Too many levels of symbolic links"),
                          ("missing", "unreadable path: No such file or directory")]:
        with pytest.raises(ConfigError, match=message) as info:
            ModelConfig.from_folder(tmp_path / name)
        assert str(tmp_path / name) in str(info.value)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"{not json", r"Expected valid JSON in .*config.json, got: Expecting property name"),
        (b"[1, 2, 3]", r"Expected a JSON object in .*config.json, got a list"),
        (b"\xff\xfe{}", r"Expected UTF-8 JSON in .*config.json"),
        (b"[" * 100_000 + b"]" * 100_000, r"Expected JSON in .*config.json, got nesting too deep"),
    ],
)
def test_config_json_that_is_not_a_json_object(tmp_path, content, message):
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_folder(tmp_path)


def test_huge_or_fifo_config_json_is_refused_without_reading_it(tmp_path):
    with open(tmp_path / "config.json", "wb") as f:
        f.truncate(1 << 40)  # sparse: 1 TiB claimed, nothing written
    with pytest.raises(ConfigError, match=r"config.json of at most 16 MiB, got 1099511627776 bytes"):
        ModelConfig.from_folder(tmp_path)
    (tmp_path / "config.json").unlink()
    os.mkfifo(tmp_path / "config.json")  # reading it would block forever
    with pytest.raises(ConfigError, match=r"config.json to be a regular file, got a FIFO"):
        ModelConfig.from_folder(tmp_path)


# ---- weights ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.int32, torch.uint8])
def test_non_floating_weights_of_the_right_shape_are_refused(folder, tmp_path, dtype):
    name = "model.layers.0.self_attn.o_proj.weight"
    bad = copy_with(folder, tmp_path, lambda t: t.__setitem__(name, t[name].to(dtype)))
    with pytest.raises(WeightError, match=rf"Expected tensor {name} in .*model.safetensors to be floating point .* got (I8|BOOL|I32|U8)"):
        DeepseekV3Model.from_folder(bad)


def test_every_floating_dtype_loads(folder, tmp_path):
    dtypes = {"model.norm.weight": torch.float64, "model.layers.0.mlp.up_proj.weight": torch.float16,
              "model.layers.0.mlp.down_proj.weight": torch.bfloat16}
    good = copy_with(folder, tmp_path, lambda t: t.update({k: t[k].to(d) for k, d in dtypes.items()}))
    model = DeepseekV3Model.from_folder(good)
    assert all(model.w[k].dtype == torch.float32 for k in dtypes)


def test_truncated_safetensors_names_the_file(folder, tmp_path):
    bad = copy_with(folder, tmp_path)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(WeightError, match=r"model.safetensors, got data_offsets .* past its \d+ bytes of data \(truncated or corrupt file\)"):
        DeepseekV3Model.from_folder(bad)
    (bad / "model.safetensors").write_bytes(data[:5])
    with pytest.raises(WeightError, match=r"model.safetensors, got 5 bytes \(truncated: no 8-byte header length\)"):
        DeepseekV3Model.from_folder(bad)
    (bad / "model.safetensors").write_bytes(data[:200])
    with pytest.raises(WeightError, match=r"-byte header in .*model.safetensors, got a file of 200 bytes \(truncated\)"):
        DeepseekV3Model.from_folder(bad)


ENTRY = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}


@pytest.mark.parametrize(
    "header, data, header_len, message",
    [
        ({"w": ENTRY}, bytes(16), 1 << 62, r"header of at most 100000000 bytes .*got a length of 4611686018427387904"),
        ({"w": {"dtype": "F32", "shape": [1_000_000, 1_000_000], "data_offsets": [0, 4_000_000_000_000]}}, bytes(16), None,
         r"'w' \(4000000000000 bytes\) to lie inside .*x.safetensors, got data_offsets \[0, 4000000000000\] past its 16 bytes"),
        ({"w": {"dtype": "F32", "shape": [1_000_000, 1_000_000], "data_offsets": [0, 16]}}, bytes(16), None,
         r"shape \(1000000, 1000000\) F32 to span 4000000000000 bytes, got data_offsets \[0, 16\]"),
        ({"w": ENTRY, "v": ENTRY}, bytes(16), None, r"to tile its data, got '(v|w)' at byte 0 where the previous one ends at 16"),
        ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [16, 32]}}, bytes(32), None, r"got 'w' at byte 16 where the previous one ends at 0"),
        ({"w": ENTRY}, bytes(20), None, r"to end where its data ends \(20 bytes\), got 16"),
        ({"w": {"dtype": "Q4", "shape": [2, 2], "data_offsets": [0, 16]}}, bytes(16), None, r"of a safetensors dtype .* got 'Q4'"),
        ({"w": {"dtype": "F32", "shape": [-2, 2], "data_offsets": [0, 16]}}, bytes(16), None, r"with dtype, shape and data_offsets"),
        ({"w": {"dtype": "F32", "shape": [2, 2]}}, bytes(16), None, r"with dtype, shape and data_offsets"),
        ([1, 2], b"", None, r"JSON object as the header of .*x.safetensors, got a list"),
    ],
)
def test_crafted_headers_are_refused_before_reading_data(tmp_path, header, data, header_len, message):
    path = raw_safetensors(tmp_path / "x.safetensors", header, data, header_len)
    with pytest.raises(WeightError, match=message):
        read_header(path)


def test_header_that_is_not_json(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 5) + b"{abc}")
    with pytest.raises(WeightError, match=r"JSON header in .*x.safetensors, got one that does not parse"):
        read_header(path)


def test_safetensors_that_is_a_directory_or_a_dangling_link(folder, tmp_path):
    bad = copy_with(folder, tmp_path)
    (bad / "extra.safetensors").mkdir()
    with pytest.raises(WeightError, match=r"extra.safetensors to be a regular safetensors file"):
        DeepseekV3Model.from_folder(bad)
    (bad / "extra.safetensors").rmdir()
    (bad / "extra.safetensors").symlink_to(tmp_path / "nowhere")
    with pytest.raises(WeightError, match=r"readable safetensors file at .*extra.safetensors, got: No such file"):
        DeepseekV3Model.from_folder(bad)


def test_a_bad_second_file_fails_before_any_tensor_is_read(folder, tmp_path, monkeypatch):
    """Every header is checked before the first tensor is materialised."""
    bad = copy_with(folder, tmp_path)
    raw_safetensors(bad / "z.safetensors", {"model.layers.0.self_attn.o_proj.weight": {"dtype": "I8", "shape": [64, 32], "data_offsets": [0, 2048]}},
                    bytes(2048))
    import safetensors

    def no_read(*args, **kwargs):
        raise AssertionError("a tensor was read before every header was checked")

    monkeypatch.setattr(safetensors, "safe_open", no_read)
    with pytest.raises(WeightError, match=r"o_proj.weight in .*z.safetensors to be floating point"):
        DeepseekV3Model.from_folder(bad)


def test_a_tensor_in_two_files_is_refused(folder, tmp_path):
    bad = copy_with(folder, tmp_path)
    name = "model.norm.weight"
    save_file({name: torch.ones(64)}, str(bad / "second.safetensors"))
    with pytest.raises(WeightError, match=rf"Expected tensor {name} once in the checkpoint, got it in .*model.safetensors and .*second.safetensors"):
        DeepseekV3Model.from_folder(bad)
