"""What each rank of the tensor-parallel tests runs (gloo on the CPU).

``engine_worker`` is spawned by ``torch.multiprocessing.spawn``; ``python -m
tests.backend.tp_workers fail-mid-run`` runs under torchrun. Both set torchrun's environment
(``rank_env``) and join through ``parallel.init_from_env`` as the engine does.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch

from phases.backend.bench import tp_check
from serving.engine.tp_launch import LockstepRunner, run_on_ranks
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.model.presets import random_model
from serving.model.sharded_weights import load_sharded_weights
from serving.parallel.group import (
    LockstepError,
    RankFailed,
    TensorParallel,
    init_from_env,
)
from serving.speculation.tree import DraftTree
from serving.stack import ServingConfig, build_engine

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9] * 6, list(range(20, 61))]
MAX_NEW = 10
SPECS = (None, "tree:2x2")
MODELS = {"tiny": {}, "tiny-odd-vocab": {"vocab_size": 127}}  # 127: the last rank's head rows are padded
MTP = {"num_nextn_predict_layers": 1, "vocab_size": 127}  # the MTP module's head is vocab-sharded like lm_head
MTP_SPEC = "mtp:2x3"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, size: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def generate(model: DeepseekV3Model, spec: str | None, tp: TensorParallel | None = None, stats: dict | None = None) -> list[list[int]]:
    """Greedy outputs of PROMPTS (reference backend, fp32 pool); ``tp``: through the lockstep runner;
    ``stats``: filled with the engine's steps and accepted drafts."""
    pool = model.new_pool(1024)
    engine = build_engine(ServingConfig(backend="reference", speculate=spec, pool_slots=pool.num_slots), model, pool).engine
    assert isinstance(engine.runner, LockstepRunner) == (tp is not None and tp.size > 1)
    trees: list = []
    if stats is not None and engine.drafter is not None:  # record every tree the drafter proposes
        propose = engine.drafter.propose
        engine.drafter.propose = lambda ctx, reqs: trees.append([[t.tokens, t.parents] for t in (x.read() for x in propose(ctx, reqs))]) or \
            [DraftTree(list(a), list(b)) for a, b in trees[-1]]
    requests = engine.generate(PROMPTS, MAX_NEW)
    assert all(r.error is None for r in requests) and pool.leaked_slots() == 0
    if stats is not None:
        stats.update(steps=engine.stats.steps, accepted=engine.stats.accepted_drafts, trees=trees)
    return [r.output for r in requests]


def expect_failure(call, kind) -> str:
    try:
        call()
    except kind as exc:
        return str(exc)
    return "no error"


def engine_worker(rank: int, size: int, port: int, folder: str, out: str) -> None:
    """TP outputs of the random presets and of ``folder`` (a tiny checkpoint), then the failure
    checks; writes ``out/rank{rank}.json``."""
    os.environ.update(rank_env(rank, size, port))
    torch.set_num_threads(1)  # as torchrun sets OMP_NUM_THREADS: the ranks share the CPU's cores
    tp = init_from_env("cpu", check_steps=True)
    try:
        result: dict = {"outputs": {}}
        for name, overrides in MODELS.items():
            model = random_model("tiny", seed=3, tp=tp, **overrides)
            for spec in SPECS:
                result["outputs"][f"{name}/{spec}"] = generate(model, spec, tp)
        mtp_model = random_model("tiny", seed=3, tp=tp, **MTP)
        result["mtp_stats"] = {}
        result["outputs"]["mtp/None"] = generate(mtp_model, None, tp)
        result["outputs"][f"mtp/{MTP_SPEC}"] = generate(mtp_model, MTP_SPEC, tp, result["mtp_stats"])
        model = DeepseekV3Model.from_folder(folder, tp=tp)
        result["outputs"]["folder/None"] = generate(model, None, tp)
        result["heads"] = model.num_local_heads
        result["experts"] = list(model.local_experts)
        # A rank whose load fails alone ends every rank at the agreement point, with its message.
        bad = folder if rank == 0 else str(Path(folder) / "missing")
        result["load_failure"] = expect_failure(lambda: load_sharded_weights(bad, model.cfg, torch.float32, tp.device, tp), RankFailed)
        result["diverged"] = expect_failure(lambda: tp.assert_same([rank], "a test value"), LockstepError)
        result["tp_check"] = tp_check.run(tp, preset="tiny", prompt_lens=[5, 40], synthetic=[100], max_new_tokens=6,
                                          speculate="tree:2x2", speed_contexts=[64], warmup=1, steps=2)
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        tp.close()


def fp8_worker(rank: int, size: int, port: int, folder: str, out: str, keep_fp8: bool) -> None:
    """Greedy outputs (plain and ``MTP_SPEC``) of the block-FP8 ``folder`` at TP=``size``;
    writes ``out/rank{rank}.json``."""
    os.environ.update(rank_env(rank, size, port))
    torch.set_num_threads(1)
    tp = init_from_env("cpu", check_steps=True)
    try:
        model = DeepseekV3Model.from_folder(folder, tp=tp, keep_fp8=keep_fp8)
        result = {"plain": generate(model, None, tp), "mtp": generate(model, MTP_SPEC, tp)}
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        tp.close()


def _fail_mid_run(args, tp: TensorParallel) -> dict:
    """A generation whose rank 1 fails after the first collective, while rank 0 goes on."""
    tp.all_reduce(torch.ones(4))
    if tp.rank == 1:
        raise RuntimeError("injected failure on rank 1")
    for _ in range(3):
        tp.all_reduce(torch.ones(4))
    return {"requests": []}


if __name__ == "__main__":
    if sys.argv[1:] == ["fail-mid-run"]:
        run_on_ranks(type("Args", (), {"device": "cpu"})(), _fail_mid_run)
