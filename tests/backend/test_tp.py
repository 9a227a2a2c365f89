"""Tensor parallelism on the CPU (gloo): the sharding arithmetic, each rank's slices of a
checkpoint, and greedy tokens of the tiny random model at TP=2 equal to TP=1, token for token.

Tolerance: none; the ranks' partial sums change the float32 summation order (about 1e-6 of a
logit), far below the top-two gaps of these prompts, so the tokens must be equal.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from serving.configs.model import ModelConfig
from serving.model import limits
from serving.model.presets import preset_config, random_model, random_weights
from serving.model.sharded_weights import (
    expected_shard_shapes,
    load_shard,
    shard_weights,
)
from serving.parallel.group import TensorParallel, launched_by_torchrun
from serving.parallel.sharding import (
    check_shardable,
    even_range,
    rank_config,
    tensor_shard,
    vocab_range,
)
from tests.backend import tp_workers

ROOT = Path(__file__).resolve().parents[2]
TP = 2

# DeepSeek-V3's dimensions (config.json of deepseek-ai/DeepSeek-V3), for arithmetic only.
DEEPSEEK_V3 = dict(
    architectures=["DeepseekV3ForCausalLM"], vocab_size=129280, hidden_size=7168, intermediate_size=18432,
    moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128, kv_lora_rank=512, q_lora_rank=1536,
    qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=256, n_shared_experts=1,
    num_experts_per_tok=8, n_group=8, topk_group=4, first_k_dense_replace=3,
)


def save_checkpoint(folder: Path, weights: dict[str, torch.Tensor], fused: bool = False, **overrides) -> Path:
    """A Hugging Face folder of the tiny preset (with ``overrides``) holding ``weights``; the
    routed experts in a second file, per expert or (``fused``) one [E, ...] tensor per kind."""
    from safetensors.torch import save_file

    from serving.model.presets import PRESETS

    raw = dict(PRESETS["tiny"], architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", **overrides)
    (folder / "config.json").write_text(json.dumps(raw))
    cfg = ModelConfig.from_folder(folder)
    routed = {k: v for k, v in weights.items() if ".mlp.experts." in k}
    save_file({k: v.contiguous() for k, v in weights.items() if k not in routed}, str(folder / "model-00001-of-00002.safetensors"))
    if fused:
        experts = {}
        for i in (i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)):
            m, ids = f"model.layers.{i}.mlp.experts.", range(cfg.n_routed_experts)
            experts[m + "gate_up_proj"] = torch.stack([torch.cat([routed[f"{m}{e}.gate_proj.weight"], routed[f"{m}{e}.up_proj.weight"]]) for e in ids])
            experts[m + "down_proj"] = torch.stack([routed[f"{m}{e}.down_proj.weight"] for e in ids])
        routed = experts
    save_file({k: v.contiguous() for k, v in routed.items()}, str(folder / "model-00002-of-00002.safetensors"))
    return folder


# ---- the sharding arithmetic --------------------------------------------------------------


def test_even_ranges_and_what_cannot_be_split():
    assert [even_range(16, 4, r, "heads") for r in range(4)] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    with pytest.raises(ValueError, match=r"Expected num_attention_heads \(16\) divisible by the tensor-parallel size 3"):
        check_shardable(preset_config("gpu-h16"), 3)
    with pytest.raises(ValueError, match="n_routed_experts"):
        check_shardable(preset_config("tiny", n_routed_experts=6, n_group=1, topk_group=1, num_attention_heads=4), 4)
    assert [vocab_range(10, 4, r) for r in range(4)] == [(0, 3, 3), (3, 6, 3), (6, 9, 3), (9, 10, 3)]


def test_deepseek_v3_over_eight_ranks():
    cfg = ModelConfig.from_dict(DEEPSEEK_V3)
    check_shardable(cfg, 8)
    shapes = expected_shard_shapes(cfg, 8, 3)
    a, m = "model.layers.5.self_attn.", "model.layers.5.mlp."
    assert shapes[a + "q_b_proj.weight"] == (16 * 192, 1536)  # 16 heads of 128 + 64
    assert shapes[a + "kv_b_proj.weight"] == (16 * 256, 512)
    assert shapes[a + "o_proj.weight"] == (7168, 16 * 128)
    assert shapes[a + "q_a_proj.weight"] == (1536, 7168) and shapes[a + "kv_a_proj_with_mqa.weight"] == (576, 7168)
    assert shapes["model.layers.0.mlp.gate_proj.weight"] == (18432 // 8, 7168)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (7168, 18432 // 8)
    assert shapes[m + "shared_experts.up_proj.weight"] == (256, 7168)
    assert shapes["lm_head.weight"] == (16160, 7168) and shapes["model.embed_tokens.weight"] == (129280, 7168)
    held = sorted({int(k.split(".")[5]) for k in shapes if k.startswith(m + "experts.")})
    assert held == list(range(96, 128)) and shapes[m + f"experts.96.gate_proj.weight"] == (2048, 7168)
    assert shapes[m + "gate.weight"] == (256, 7168)
    # The memory check of one rank: an upper bound close to what the rank holds (85.6 of 671 B parameters).
    held_params = sum(math.prod(s) for s in shapes.values())
    assert held_params <= limits.count_parameters(rank_config(cfg, 8)).total <= 1.05 * held_params


@pytest.mark.parametrize("overrides", [{}, {"vocab_size": 127}, {"q_lora_rank": 24, "attention_bias": True},
                                       {"tie_word_embeddings": True, "first_k_dense_replace": 2}])
def test_the_ranks_parts_make_up_every_tensor(overrides):
    cfg = preset_config("tiny", **overrides)
    full = random_weights(cfg, seed=1)
    parts = [shard_weights(full, cfg, TP, r) for r in range(TP)]
    for name, tensor in full.items():
        shards = [tensor_shard(name, cfg, TP, r) for r in range(TP)]
        held = [p[name] for p in parts if name in p]
        if ".experts." in name and ".shared_experts." not in name:
            assert len(held) == 1 and torch.equal(held[0], tensor)  # each expert on exactly one rank
        elif name.endswith("o_proj.bias"):
            assert torch.equal(sum(held), tensor) and not held[1].any()  # added once, by rank 0
        elif shards[0].dim is None:
            assert all(torch.equal(h, tensor) for h in held)  # replicated
        else:
            whole = torch.cat(held, dim=shards[0].dim)
            assert torch.equal(whole.narrow(shards[0].dim, 0, tensor.shape[shards[0].dim]), tensor)
            if shards[0].pad_to is not None:
                assert not whole[tensor.shape[0]:].any()  # the head's padding rows are zeros
    for r in range(TP):
        assert {k: tuple(v.shape) for k, v in parts[r].items()} == expected_shard_shapes(cfg, TP, r)


# ---- each rank reads only its slices ------------------------------------------------------


class SpyOpen:
    """``safetensors.safe_open`` that records what is read: (name, index) of every slice read
    and the names read whole with ``get_tensor``."""

    def __init__(self, real) -> None:
        self.real, self.slices, self.whole = real, [], []

    def __call__(self, path, framework):
        spy, handle = self, self.real(path, framework=framework)

        class Slice:
            def __init__(self, name):
                self.name, self.view = name, handle.get_slice(name)

            def get_shape(self):
                return self.view.get_shape()

            def __getitem__(self, index):
                spy.slices.append((self.name, index))
                return self.view[index]

        class Handle:
            def __enter__(self):
                handle.__enter__()
                return self

            def __exit__(self, *exc):
                return handle.__exit__(*exc)

            def keys(self):
                return handle.keys()

            def get_slice(self, name):
                return Slice(name)

            def get_tensor(self, name):
                spy.whole.append(name)
                return handle.get_tensor(name)

        return Handle()


def describe(index) -> tuple:
    """A slice index as plain tuples: ``[a:b]`` -> ((a, b),); ``[:, a:b]`` -> (None, (a, b))."""
    index = index if isinstance(index, tuple) else (index,)
    return tuple(None if (s.start, s.stop) == (None, None) else (s.start, s.stop) for s in index)


@pytest.mark.parametrize("fused", [False, True], ids=["per-expert", "fused-experts"])
def test_each_rank_reads_only_its_slices(tmp_path, monkeypatch, fused):
    import safetensors

    cfg = preset_config("tiny", vocab_size=127)
    full = random_weights(cfg, seed=2)
    folder = save_checkpoint(tmp_path, full, fused=fused, vocab_size=127)
    for rank in range(TP):
        spy = SpyOpen(safetensors.safe_open)
        monkeypatch.setattr(safetensors, "safe_open", spy)
        got = load_shard(folder, cfg, torch.float32, torch.device("cpu"), TP, rank)
        monkeypatch.undo()
        want = shard_weights(full, cfg, TP, rank)
        assert sorted(got) == sorted(want)
        for name in want:
            torch.testing.assert_close(got[name], want[name], atol=0, rtol=0)
        assert spy.whole == []
        reads = {}
        for name, index in spy.slices:
            reads.setdefault(name, []).append(describe(index))
        assert all(len(v) == 1 for v in reads.values()), "every tensor is read once"
        heads = even_range(cfg.num_attention_heads, TP, rank, "heads")
        assert reads["model.layers.0.self_attn.kv_b_proj.weight"] == [((heads[0] * 32, heads[1] * 32),)]
        assert reads["model.layers.1.self_attn.o_proj.weight"] == [(None, (heads[0] * 16, heads[1] * 16))]
        assert reads["model.layers.0.mlp.down_proj.weight"] == [(None, (rank * 64, rank * 64 + 64))]
        assert reads["lm_head.weight"] == [((rank * 64, min(127, rank * 64 + 64)),)]
        mine = range(rank * 2, rank * 2 + 2)
        if fused:
            assert reads["model.layers.1.mlp.experts.gate_up_proj"] == [((mine.start, mine.stop),)]
        else:
            read_experts = {int(n.split(".")[5]) for n in reads if ".mlp.experts." in n}
            assert read_experts == set(mine), "another rank's experts are never read"


# ---- TP=2 against TP=1, two processes -----------------------------------------------------


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    """Spawn the two ranks once; each writes its outputs and failure checks."""
    folder = save_checkpoint(tmp_path_factory.mktemp("ckpt"), random_weights(preset_config("tiny"), seed=5))
    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(tp_workers.engine_worker, args=(TP, tp_workers.free_port(), str(folder), str(out)), nprocs=TP, join=True)
    return folder, [json.loads((out / f"rank{r}.json").read_text()) for r in range(TP)]


@pytest.fixture(scope="module")
def tp1_outputs():
    """Plain greedy outputs of each random model in one process, the TP=2 runs' oracle."""
    return {name: tp_workers.generate(random_model("tiny", seed=3, **overrides), None) for name, overrides in tp_workers.MODELS.items()}


@pytest.mark.parametrize("model", list(tp_workers.MODELS))
@pytest.mark.parametrize("spec", tp_workers.SPECS, ids=["plain", "tree-2x2"])
def test_tp2_greedy_tokens_equal_tp1(tp_run, tp1_outputs, model, spec):
    _, ranks = tp_run
    for result in ranks:
        assert result["outputs"][f"{model}/{spec}"] == tp1_outputs[model]


def test_tp2_mtp_drafts_as_one_process_does(tp_run):
    """The MTP module shards like any layer (its head vocab-sharded and gathered): under TP=2 it
    drafts what it drafts in one process, step for step, and the tokens are plain greedy's."""
    _, ranks = tp_run
    model = random_model("tiny", seed=3, **tp_workers.MTP)
    stats: dict = {}
    plain = tp_workers.generate(model, None)
    assert tp_workers.generate(model, tp_workers.MTP_SPEC, stats=stats) == plain
    for result in ranks:
        assert result["outputs"]["mtp/None"] == plain
        assert result["outputs"][f"mtp/{tp_workers.MTP_SPEC}"] == plain
        assert result["mtp_stats"] == stats


def test_tp2_from_a_checkpoint_folder(tp_run):
    from serving.model.deepseek_v3 import DeepseekV3Model

    folder, ranks = tp_run
    want = tp_workers.generate(DeepseekV3Model.from_folder(folder), None)
    assert [r["outputs"]["folder/None"] for r in ranks] == [want, want]
    assert [r["heads"] for r in ranks] == [1, 1] and [r["experts"] for r in ranks] == [[0, 1], [2, 3]]


def test_a_rank_failing_alone_ends_every_rank_with_its_message(tp_run):
    _, ranks = tp_run
    for result in ranks:
        assert "loading the weights failed on 1 rank(s): rank 1: WeightError: Expected *.safetensors" in result["load_failure"]
        assert "ranks [1] differ from rank 0 on a test value" in result["diverged"]


def test_the_gpu_check_script_runs_on_two_cpu_ranks(tp_run):
    """``phases.backend.bench.tp_check``'s CPU smoke (reference backend, no graphs) on the same ranks."""
    _, ranks = tp_run
    m = ranks[0]["tp_check"]
    assert m["tp"] == TP and m["tokens_pass"] and m["tokens_compared"] == 18
    assert {(r["tp"], r["mode"]) for r in m["speed_rows"]} == {(1, "eager"), (TP, "eager")}
    assert m["collectives_us_tp2"] > 0


def test_one_process_is_unchanged_by_the_collectives():
    tp = TensorParallel()
    x = torch.randn(3, 5)
    assert tp.all_reduce(x) is x and tp.gather_vocab(x, 5) is x
    assert tp.heads(16) == range(16) and tp.experts(4) == range(4) and tp.experts(None) == range(0)
    with pytest.raises(KeyError):
        tp.agree(KeyError("mine"), "a step")  # one process re-raises its own error
    assert not launched_by_torchrun({"RANK": "0"})


# ---- torchrun -m serving generate ---------------------------------------------------------


def torchrun(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, SERVING_TP_CHECK_STEPS="1", SERVING_TP_TIMEOUT_S="60")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(TP), "--master-port", str(tp_workers.free_port()), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_torchrun_generate_prints_once_and_matches_one_process():
    from serving.stack.cli import build_parser, generate

    argv = ["generate", "--random-model", "tiny", "--prompt", "1,2,3", "--random-prompt", "30", "--max-new-tokens", "8",
            "--speculate", "tree:2x2", "--json"]
    out = torchrun("-m", "serving", *argv)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, out.stdout  # rank 0 prints
    got = json.loads(lines[0])
    want = generate(build_parser().parse_args(argv))
    assert got["tensor_parallel"] == TP and got["leaked_slots"] == 0
    assert [r["output"] for r in got["requests"]] == [r["output"] for r in want["requests"]]


def test_a_rank_failing_mid_run_ends_every_rank():
    out = torchrun("-m", "tests.backend.tp_workers", "fail-mid-run", timeout=60)
    assert out.returncode != 0
    assert "error: rank 1 of 2: RuntimeError: injected failure on rank 1" in out.stderr
