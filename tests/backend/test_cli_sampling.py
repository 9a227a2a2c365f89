"""``serving generate`` with sampling flags, a prompt past the model's context length, and usage
errors under ``torchrun``: each refusal is one ``error:`` line and exit code 2, on every rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="transformers writes the checkpoints of these tests (pip install -e .[test])")

from serving.stack.cli import main
from tests.backend.hf_models import save_tiny
from tests.backend.processes import ROOT, run_python
from tests.backend.tp_workers import free_port, rank_env

TINY = ("--random-model", "tiny")
PROMPTS = ("--prompt", "1,2,3", "--prompt", "1,2,3", "--random-prompt", "20")


def run(capsys, *args):
    code = main(["generate", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def outputs(capsys, *args) -> tuple[list[list[int]], dict]:
    code, out, err = run(capsys, *TINY, *PROMPTS, "--max-new-tokens", 12, "--json", *args)
    assert code == 0, err
    result = json.loads(out)
    return [r["output"] for r in result["requests"]], result


@pytest.mark.parametrize("args, message", [
    (("--temperature", -0.5), "Expected --temperature >= 0 (0: greedy), got -0.5"),
    (("--temperature", "nan"), "Expected --temperature as a finite number, got nan"),
    (("--temperature", "inf"), "Expected --temperature as a finite number, got inf"),
    (("--top-p", 0), "Expected --top-p in (0, 1] (1: off), got 0.0"),
    (("--top-p", 1.5), "Expected --top-p in (0, 1] (1: off), got 1.5"),
    (("--top-p", "nan"), "Expected --top-p as a finite number, got nan"),
    (("--top-k", -1), "Expected --top-k as an integer >= 0 (0: off), got -1"),
    (("--min-p", 1.5), "Expected --min-p in [0, 1] (0: off), got 1.5"),
    (("--sampling-seed", -1), "Expected --sampling-seed as an integer in [0, 2**63), got -1"),
    (("--context-length", 1), "Expected --context-length >= 2 (a prompt token and a new one), got 1"),
])
def test_bad_sampling_flags_exit_2_with_one_line_naming_the_flag(capsys, args, message):
    code, out, err = run(capsys, *TINY, "--prompt", "1,2,3", *args)
    assert code == 2 and out == ""
    assert err == f"error: {message}\n"


def test_a_seed_repeats_the_run_and_each_request_draws_its_own(capsys):
    greedy, _ = outputs(capsys)
    first, result = outputs(capsys, "--temperature", 0.9, "--top-p", 0.95, "--top-k", 40, "--sampling-seed", 11)
    again, _ = outputs(capsys, "--temperature", 0.9, "--top-p", 0.95, "--top-k", 40, "--sampling-seed", 11,
                       "--speculate", "tree:2x2")
    assert result["sampling"] == {"temperature": 0.9, "top_p": 0.95, "top_k": 40, "min_p": 0.0, "seed": 11}
    assert first != greedy and first[0] != first[1]  # one prompt twice: seeds 11 and 12 draw apart
    other, _ = outputs(capsys, "--temperature", 0.9, "--top-p", 0.95, "--top-k", 40, "--sampling-seed", 11)
    assert other == first
    assert [len(o) for o in again] == [12] * 3  # speculation samples as well (its draws are coupled otherwise)
    assert outputs(capsys, "--temperature", 0)[0] == greedy
    _, unseeded = outputs(capsys, "--temperature", 0.9)
    assert isinstance(unseeded["sampling"]["seed"], int)  # drawn, and reported so the run can be repeated


def test_text_output_says_how_it_sampled(capsys):
    code, out, err = run(capsys, *TINY, "--prompt", "1,2", "--max-new-tokens", 3, "--temperature", 0.7, "--top-p", 0.95,
                         "--sampling-seed", 4)
    assert code == 0, err
    assert "sampled (temperature 0.7, top-p 0.95, seed 4), backend reference on cpu: decode" in out
    code, out, _ = run(capsys, *TINY, "--prompt", "1,2", "--max-new-tokens", 3)
    assert "greedy, backend reference on cpu" in out


def test_the_model_folders_generation_config_gives_the_defaults(capsys, tmp_path):
    folder = save_tiny(tmp_path / "model")
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6, "top_p": 0.9}))
    args = ("--model", folder, "--prompt", "1,2,3", "--max-new-tokens", 6, "--json")
    code, out, err = run(capsys, *args, "--sampling-seed", 3)
    assert code == 0, err
    assert json.loads(out)["sampling"] == {"temperature": 0.6, "top_p": 0.9, "top_k": 0, "min_p": 0.0, "seed": 3}
    code, out, _ = run(capsys, *args, "--temperature", 0, "--top-k", 5)
    assert json.loads(out)["sampling"] == {"temperature": 0.0, "top_p": 0.9, "top_k": 5, "min_p": 0.0, "seed": None}
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": True, "top_k": -2}))
    code, out, err = run(capsys, *args)
    assert code == 2 and err == f"error: Expected top_k in {folder / 'generation_config.json'} as an integer >= 0 (0: off), got -2\n"


def test_a_prompt_past_the_context_length_is_refused_unless_allowed(capsys):
    code, _, err = run(capsys, *TINY, "--random-prompt", 4090, "--max-new-tokens", 8)
    assert code == 2 and err.startswith("error: Expected each prompt plus --max-new-tokens within the context length "
                                        "(4,096 tokens: the model's max_position_embeddings), got a 4,090-token prompt + 8; ")
    code, _, err = run(capsys, *TINY, "--random-prompt", 4090, "--max-new-tokens", 8, "--context-length", 4098, "--json")
    assert code == 0, err


def test_a_ten_million_token_prompt_is_refused_up_front_on_any_host():
    """The memory estimate allows it on a 64 GiB host; the context length does not, before a byte
    is allocated (it would allocate a 3.8 GB pool and take days to prefill)."""
    baseline = run_python("import serving.stack.cli").peak_rss_mb
    code = ("import serving.model.limits as limits; limits.host_available_bytes = lambda: 64 << 30\n"
            "from serving.stack.cli import main\n"
            "raise SystemExit(main(['generate', '--random-model', 'tiny', '--random-prompt', '10000000', '--device', 'cpu']))")
    result = run_python(code, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "got a 10,000,000-token prompt + 32" in result.stderr
    assert result.peak_rss_mb < baseline + 50


def rank_runs(*args: str) -> list[subprocess.CompletedProcess]:
    """``python -m serving generate *args`` as the two ranks torchrun would start (its environment,
    without its agent, so each rank's exit code is its own)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    procs = [subprocess.Popen([sys.executable, "-m", "serving", "generate", *args], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(env, SERVING_TP_TIMEOUT_S="30", **rank_env(rank, 2, port))) for rank in range(2)]
    for p in procs:
        p.wait(timeout=90)
    return [subprocess.CompletedProcess(p.args, p.returncode, p.stdout.read(), p.stderr.read()) for p in procs]


@pytest.mark.parametrize("args", [("--max-new-tokens", "0"), ("--device", "cuda")])
def test_under_torchrun_a_usage_error_is_one_process_line_and_exit_2_on_every_rank(capsys, args):
    if args[0] == "--device" and __import__("torch").cuda.is_available():
        pytest.skip("needs a machine without a GPU")
    argv = [*TINY, "--prompt", "1,2,3", *args]
    code, _, one = run(capsys, *argv)
    assert code == 2
    for rank in rank_runs(*argv):
        assert rank.returncode == 2 and rank.stderr == one, rank.stderr


def test_torchrun_ranks_sample_in_lockstep_as_one_process_with_rank_zeros_seed(capsys):
    """No --sampling-seed: rank 0 draws the seed for every rank (each step's tokens compared
    across the ranks), and one process with that seed samples the same tokens."""
    argv = [*TINY, "--prompt", "1,2,3", "--random-prompt", "20", "--max-new-tokens", "8", "--temperature", "0.9",
            "--speculate", "tree:2x2", "--json"]
    env = dict(os.environ, SERVING_TP_CHECK_STEPS="1", SERVING_TP_TIMEOUT_S="60")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
                          "-m", "serving", "generate", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    code, one, err = run(capsys, *argv, "--sampling-seed", got["sampling"]["seed"])
    assert code == 0, err
    assert [r["output"] for r in got["requests"]] == [r["output"] for r in json.loads(one)["requests"]]
