"""Model folders and files the loader must refuse, with the file named and nothing read first.

Covers the folder itself (a file, a FIFO, a symlink loop) and config.json (not JSON, not an
object, huge, a FIFO, not UTF-8).
"""

from __future__ import annotations

import os

import pytest

from serving.engine import ConfigError
from serving.engine.config import ModelConfig

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
