"""Block-FP8 checkpoints under tensor parallelism on the CPU (gloo): each rank's FP8 slices and
scale slices are the full tensors' slices, dequantized they are the TP=1 weights' parts, and
greedy tokens at TP=2 (plain and MTP speculation) equal TP=1's.

Tolerance: none for weights (slices of the same bytes); tokens equal, as in ``test_tp``.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("transformers", reason="transformers writes the config.json of these tests (pip install -e .[test])")

from serving.configs.model import ModelConfig
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.model.sharded_weights import load_shard, shard_weights
from serving.model.weights import load_weights
from serving.parallel.sharding import tensor_shard
from serving.quant.fp8 import BlockFP8Weight
from tests.backend import tp_workers
from tests.backend.fp8_models import save_fp8

TP = 2
BLOCK = 128
# Every rank's part of every sharded projection on 128-block boundaries at TP=2: 4 heads of
# q 64 / kv_b 64 / o 32 per rank = 256 / 256 / 128 rows or columns; dense MLP 128 and the two
# shared experts 128 per rank.
TP_ALIGNED = dict(num_attention_heads=8, num_key_value_heads=8, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32,
                  kv_lora_rank=128, intermediate_size=256, moe_intermediate_size=128, n_shared_experts=2)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_fp8(tmp_path_factory.mktemp("fp8-tp"), seed=21, **TP_ALIGNED)


def test_each_rank_holds_the_slices_of_the_fp8_bytes_and_their_scales(folder):
    from safetensors.torch import load_file

    cfg = ModelConfig.from_folder(folder)
    stored = {}
    for path in folder.glob("*.safetensors"):
        stored.update(load_file(str(path)))
    full = load_weights(folder, cfg, torch.float32, torch.device("cpu"), keep_fp8=False)
    sharded_seen = set()
    for rank in range(TP):
        held = load_shard(folder, cfg, torch.float32, torch.device("cpu"), TP, rank, keep_fp8=True)
        dequantized = load_shard(folder, cfg, torch.float32, torch.device("cpu"), TP, rank, keep_fp8=False)
        want = shard_weights(full, cfg, TP, rank)
        assert sorted(held) == sorted(dequantized) == sorted(want)
        for name, w in held.items():
            assert torch.equal(dequantized[name], want[name]), name
            if not isinstance(w, BlockFP8Weight):
                assert stored[name].dtype != torch.float8_e4m3fn, name
                continue
            assert torch.equal(w.dequantize(), want[name]), name
            shard = tensor_shard(name, cfg, TP, rank)
            if shard.dim is None:
                assert torch.equal(w.q.view(torch.uint8), stored[name].view(torch.uint8)), name
                continue
            sharded_seen.add(name.split(".", 3)[-1])
            q = stored[name].view(torch.uint8).narrow(shard.dim, shard.start, shard.stop - shard.start)
            scale = stored[name + "_scale_inv"].narrow(shard.dim, shard.start // BLOCK, -(-shard.stop // BLOCK) - shard.start // BLOCK)
            assert torch.equal(w.q.view(torch.uint8), q) and torch.equal(w.scale_inv, scale), name
    assert {"self_attn.q_proj.weight", "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight",
            "mlp.shared_experts.gate_proj.weight"} <= sharded_seen


@pytest.mark.parametrize("keep_fp8", [False, True], ids=["dequantized", "fp8-held"])
def test_tp2_greedy_tokens_of_an_fp8_folder_equal_tp1(folder, tmp_path, keep_fp8):
    model = DeepseekV3Model.from_folder(folder, keep_fp8=keep_fp8)
    want = tp_workers.generate(model, None)
    assert tp_workers.generate(model, tp_workers.MTP_SPEC) == want
    mp.spawn(tp_workers.fp8_worker, args=(TP, tp_workers.free_port(), str(folder), str(tmp_path), keep_fp8), nprocs=TP, join=True)
    for rank in range(TP):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result == {"plain": want, "mtp": want}
