"""``python -m serving generate`` refuses bad input with one ``error:`` line and an exit code:
2 for bad usage or input (before anything is allocated), 1 when a request fails while running.

Refusals that guard against huge allocations run in a child capped by RLIMIT_DATA and assert
its peak RSS stayed near that of a child that only imports the engine.
"""

from __future__ import annotations

import json
import struct

import pytest
import torch

pytest.importorskip("transformers", reason="transformers writes the checkpoints of these tests (pip install -e .[test])")

from serving.stack.cli import main
from tests.backend.hf_models import save_tiny
from tests.backend.processes import run_python, run_serving

TINY = ("--random-model", "tiny")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def baseline_mb():
    return run_python("import serving.stack.cli").peak_rss_mb


def with_config(folder, tmp_path, **changes):
    raw = json.loads((folder / "config.json").read_text())
    raw.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    return tmp_path


def run(capsys, *args):
    code = main(["generate", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_error_line(err: str, message: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


@pytest.mark.parametrize(
    "args, message",
    [
        (("--prompt", "1,2,3", "--max-new-tokens", -1), "Expected --max-new-tokens >= 1, got -1"),
        (("--prompt", "1,2,3", "--max-new-tokens", 0), "Expected --max-new-tokens >= 1, got 0"),
        (("--prompt", "1,200"), "Expected token ids in [0, 128) (the model's vocab_size), got 200 in prompt [0]"),
        (("--prompt", "1", "--prompt", ""), "Expected a non-empty --prompt"),
        (("--prompt", " , "), "Expected a non-empty --prompt"),
        (("--random-prompt", 0), "Expected --random-prompt N with N >= 1 tokens, got 0"),
        (("--random-prompt", -3), "Expected --random-prompt N with N >= 1 tokens, got -3"),
        (("--prompt", "1", "--prefill-chunk", 0), "Expected --prefill-chunk >= 1"),
        (("--prompt", "1", "--prefill-chunk", -5), "Expected --prefill-chunk >= 1"),
        (("--prompt", "1,2", "--pool-slots", 1), "Expected --pool-slots >= 2 (slot 0 is reserved), got 1"),
        (("--prompt", "1,2", "--pool-slots", 0), "Expected --pool-slots >= 2 (slot 0 is reserved), got 0"),
        (("--prompt", "1,2", "--pool-slots", 3), "Expected --pool-slots >= 4 (the prompts' 2 tokens"),
        (("--prompt", "1,2", "--random-prompt", 10, "--pool-slots", 12), "Expected --pool-slots >= 15"),
        (("--prompt", "1", "--device", "mps"), "Expected --device cpu, cuda or cuda:N, got 'mps'"),
        (("--prompt", "1", "--device", "gpu0"), "Expected --device cpu, cuda or cuda:N, got 'gpu0'"),
        (("--prompt", "1", "--seed", -1), "Expected --seed in [0, 2**63), got -1"),
        (("--prompt", "1", "--eos-token-id", 128), "Expected --eos-token-id in [0, 128)"),
        (("--prompt", "1", "--eos-token-id", 3, "--ignore-eos"), "Expected either --eos-token-id or --ignore-eos, got both"),
        (("--prompt", "hello there"), "Expected token ids like '1,2,3' (no tokenizer.json for text), got 'hello there'"),
        ((), "Expected at least one --prompt or --random-prompt, got none"),
        (("--prompt", "1", "--speculate", "tree:4x4:layers=999"), "Expected layers=K with K <= the model's 2 layers"),
        (("--prompt", "1", "--speculate", "ngram:1x1:n=0"), "Expected 1 <= min_n <= n for the n-gram drafter"),
    ],
)
def test_bad_usage_exits_2_with_one_line(capsys, args, message):
    code, out, err = run(capsys, *TINY, *args)
    assert code == 2 and out == ""
    assert_one_error_line(err, message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda(capsys):
    code, out, err = run(capsys, *TINY, "--prompt", "1", "--device", "cuda")
    assert code == 2
    assert_one_error_line(err, "Expected a CUDA GPU for --device cuda, got none (")
    assert err.rstrip().endswith("use --device cpu")


@pytest.mark.parametrize("json_out", [False, True])
def test_a_request_failing_at_run_time_exits_1(capsys, json_out):
    """The pool holds the prompt but not the whole decode: the request fails while running."""
    code, out, err = run(capsys, *TINY, "--prompt", "1,2,3", "--pool-slots", 6, "--max-new-tokens", 10, *(("--json",) if json_out else ()))
    assert code == 1
    assert err.splitlines() == ["error: request [0] failed: pool exhausted: asked 1, free 0"]
    if json_out:
        assert json.loads(out)["requests"][0]["finish_reason"] == "error"
    else:
        assert "[0] (3 prompt tokens) error: pool exhausted" in out


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(rms_norm_eps=float("nan")), "rms_norm_eps to be a finite number > 0, got nan"),
        (dict(rms_norm_eps=-1), "rms_norm_eps to be a finite number > 0, got -1"),
        (dict(routed_scaling_factor=float("nan")), "routed_scaling_factor to be a finite number > 0, got nan"),
        (dict(num_hidden_layers=-1), "num_hidden_layers to be a positive integer, got -1"),
    ],
)
def test_config_values_that_make_no_sense_exit_2_naming_key_and_file(capsys, folder, tmp_path, changes, message):
    bad = with_config(folder, tmp_path, **changes)
    code, out, err = run(capsys, "--model", bad, "--prompt", "1,2,3", "--max-new-tokens", 4)
    assert code == 2 and out == ""
    assert_one_error_line(err, f"{bad / 'config.json'}: Expected {message}")


def safetensors_claiming(path, shape, nbytes):
    header = json.dumps({"model.embed_tokens.weight": {"dtype": "F32", "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(64))


def test_truncated_and_crafted_safetensors_exit_2_naming_the_file(capsys, folder, tmp_path, baseline_mb):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    truncated, crafted = with_config(folder, tmp_path / "a"), with_config(folder, tmp_path / "b")
    (truncated / "model.safetensors").unlink()
    data = (folder / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    code, out, err = run(capsys, "--model", truncated, "--prompt", "1,2,3")
    assert code == 2
    assert_one_error_line(err, f"{truncated / 'model.safetensors'}, got data_offsets")
    assert "(truncated or corrupt file)" in err

    (crafted / "model.safetensors").unlink()
    safetensors_claiming(crafted / "model.safetensors", [1 << 20, 1 << 20], 4 << 40)  # a 4 TiB tensor
    result = run_serving("--model", crafted, "--prompt", "1,2,3")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert_one_error_line(result.stderr, f"Expected tensor 'model.embed_tokens.weight' ({4 << 40} bytes) to lie inside {crafted / 'model.safetensors'}")
    assert result.peak_rss_mb < baseline_mb + 50


@pytest.mark.parametrize("changes", [dict(num_hidden_layers=10**9), dict(n_routed_experts=400_000_000, n_group=1)])
def test_configs_too_large_for_memory_exit_2_with_the_numbers(folder, tmp_path, baseline_mb, changes):
    bad = with_config(folder, tmp_path, **changes)
    result = run_serving("--model", bad, "--prompt", "1,2,3", timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert_one_error_line(result.stderr, "Expected what the engine allocates to fit in 90% of the ")
    assert "parameters, float32)" in result.stderr and "KV pool" in result.stderr
    assert result.peak_rss_mb < baseline_mb + 50


@pytest.mark.parametrize(
    "args, message",
    [
        (("--prompt", "1", "--max-new-tokens", 10**12), "KV pool 349.2 TiB (1,000,000,004,161 slots x 2 layers x 48 x 4 B)"),
        (("--prompt", "1", "--pool-slots", 10**15), "(1,000,000,000,000,000 slots x 2 layers x 48 x 4 B)"),
    ],
)
def test_flags_too_large_for_memory_exit_2_with_the_numbers(baseline_mb, args, message):
    result = run_serving(*TINY, *args, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert_one_error_line(result.stderr, message)
    assert result.peak_rss_mb < baseline_mb + 50


def test_ten_million_token_prompt_is_refused_on_a_16_gib_host(baseline_mb):
    """Machine-independent: the child sees 16 GiB of free host memory."""
    code = ("import serving.model.limits as limits; limits.host_available_bytes = lambda: 16 << 30\n"
            "from serving.stack.cli import main\n"
            "raise SystemExit(main(['generate', '--random-model', 'tiny', '--random-prompt', '10000000', '--device', 'cpu']))")
    result = run_python(code, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert_one_error_line(result.stderr, "fit in 90% of the 16.0 GiB free on cpu, got an estimated ")
    assert "KV pool 3.6 GiB (10,004,192 slots x 2 layers x 48 x 4 B)" in result.stderr
    assert "over 10,000,000 tokens of context" in result.stderr
    assert result.peak_rss_mb < baseline_mb + 50


def test_model_folder_and_file_errors_name_the_path(capsys, folder, tmp_path):
    import os

    (tmp_path / "file").write_text("{}")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "notjson").mkdir()
    (tmp_path / "notjson" / "config.json").write_text("{'vocab_size': 128}")
    cases = [("file", "got a regular file"), ("fifo", "got a FIFO"), ("loop", "Too many levels of symbolic links"),
             ("notjson", "Expected valid JSON in ")]
    for name, message in cases:
        code, out, err = run(capsys, "--model", tmp_path / name, "--prompt", "1")
        assert code == 2
        assert_one_error_line(err, message)
        assert str(tmp_path / name) in err


def test_unreadable_tokenizer_is_named(capsys, folder, tmp_path):
    with_config(folder, tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not a tokenizer")
    code, out, err = run(capsys, "--model", tmp_path, "--prompt", "hello there")
    assert code == 2
    assert_one_error_line(err, f"Expected a valid tokenizer in {tmp_path / 'tokenizer.json'}, got: ")


def test_an_allocation_failure_past_the_estimate_is_one_line_exit_1():
    """The estimate fits (the child sees 64 GiB free), but its RLIMIT_DATA of 1 GiB does not hold the 1.1 GB pool."""
    code = ("import serving.model.limits as limits; limits.host_available_bytes = lambda: 64 << 30\n"
            "from serving.stack.cli import main\n"
            "raise SystemExit(main(['generate', '--random-model', 'tiny', '--random-prompt', '3000000', '--prefill-chunk', '16', "
            "'--context-length', '3000032', '--device', 'cpu']))")
    result = run_python(code, data_limit=1 << 30, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert_one_error_line(result.stderr, "out of memory while running (the estimate missed it): ")


def test_speculation_never_fails_a_request_that_plain_decoding_serves(capsys):
    """A batch in a pool with a few slots to spare: the first request's tree must leave the
    second its root slot (it took every free slot, and the second request failed)."""
    argv = ["generate", *TINY, "--random-prompt", "20", "--random-prompt", "12", "--max-new-tokens", "12",
            "--pool-slots", "55", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    for spec in ("ngram:4x4", "tree:4x4"):
        assert main(argv + ["--speculate", spec]) == 0, spec
        got = json.loads(capsys.readouterr().out)
        assert [r["output"] for r in got["requests"]] == [r["output"] for r in plain["requests"]]


def test_mtp_on_a_model_without_the_module_is_a_usage_error(capsys):
    assert main(["generate", *TINY, "--prompt", "1,2,3", "--speculate", "mtp:1x3"]) == 2
    assert "MTP module" in capsys.readouterr().err


def test_a_declared_mtp_module_without_weights_serves_plain_and_refuses_mtp(tmp_path, capsys):
    """transformers writes num_nextn_predict_layers: 1 and no module: such a folder decodes, and
    asking it for MTP drafts is a usage error."""
    bare = save_tiny(tmp_path / "bare", peaky=False)
    assert json.loads((bare / "config.json").read_text()).get("num_nextn_predict_layers", 1) == 1
    assert main(["generate", "--model", str(bare), "--prompt", "1,2,3", "--max-new-tokens", "4"]) == 0
    capsys.readouterr()
    assert main(["generate", "--model", str(bare), "--prompt", "1,2,3", "--speculate", "mtp:1x2"]) == 2
    assert "MTP module" in capsys.readouterr().err


def test_a_partial_mtp_module_is_refused_naming_the_tensor(folder, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    assert "model.layers.2.eh_proj.weight" in tensors  # the folder's config declares the module
    del tensors["model.layers.2.eh_proj.weight"]
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert main(["generate", "--model", str(tmp_path), "--prompt", "1,2,3"]) == 2
    err = capsys.readouterr().err
    assert "model.layers.2.eh_proj.weight" in err and err.startswith("error:")
