"""Tensor parallelism on GPUs: greedy tokens of TP=N against TP=1, and decode speed of both.

Run under torchrun; N = 1 runs TP=1 through the same path (a one-rank process group)::

    python -m torch.distributed.run --nproc-per-node 2 -m phases.backend.bench.tp_check --out tp_check.json

Every rank draws the preset's seeded weights once (on the CPU) and builds from them a TP=1
model (``TensorParallel()``, no collectives) and its own TP=N shard. Rank 0 prints a table and
writes the metrics (``--out``); the exit code is 1 when a token check fails.

1. Tokens (fp32 model, bf16 pool, kernel backend, as the greedy gate): requests with prompts of
   ``prompt_lens`` tokens (prefilled through the model) and requests whose ``synthetic``-token
   contexts are random latent rows (seeded: the same rows in every pool on every rank). Runs:
   TP=1 plain with CUDA graphs (the oracle; margins recorded), then TP=N plain with graphs,
   TP=N plain eager and TP=N tree speculation with graphs. A divergence from the oracle counts
   in ``mismatched_tokens_*`` unless the oracle's top-two gap there is at most one bf16 ulp
   (``near_tie_divergences_*``, as ``phases.backend.greedy.compare``). TP=N runs compare every
   step's tokens across the ranks as well (``LockstepRunner``), so a divergence stops the run.
2. Speed (bf16 model and pool, kernel backend, one request, random context rows) for TP=1
   and TP=N at each of ``speed_contexts``: decode tokens/s with CUDA graphs and eager, and the
   shares of a step: attention (graphs: a graph of the step's attention calls, as the
   decode-speed gate; eager: CUDA events around each call) and collectives (graphs: a graph of
   the step's 2 x layers all-reduces and the logits gather, replayed back to back on every
   rank; eager: events around each collective, which include waiting for the slower rank).

On the CPU (``--args '{"device": "cpu", "preset": "tiny", ...}'``, gloo) the reference backend
runs without graphs: a smoke run of the same code.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from phases.common.engines import make_engine
from phases.common.greedy import compare, graph_sizes
from phases.common.timing import attention_share
from serving.engine.engine import Request
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.model.presets import preset_config, random_weights
from serving.model.sharded_weights import keeps_fp32, shard_weights
from serving.parallel.group import TensorParallel, init_from_env, launched_by_torchrun
from serving.speculation.tree import MAX_VERIFY_TOKENS


def label(context: int) -> str:
    return f"{context // 1024}k" if context % 1024 == 0 else str(context)


def build(full: dict, cfg, device: torch.device, dtype: torch.dtype, tp: TensorParallel) -> DeepseekV3Model:
    """The model of ``full`` (float32 CPU weights) for ``tp``'s rank."""
    parts = full if tp.size == 1 else shard_weights(full, cfg, tp.size, tp.rank)
    weights = {k: v.to(device=device, dtype=torch.float32 if keeps_fp32(k) else dtype) for k, v in parts.items()}
    return DeepseekV3Model(cfg, weights, device, dtype, tp)


def seeded_pool(model: DeepseekV3Model, slots: int, max_context: int, seed: int):
    """A bf16 pool whose rows are seeded random values (the same on every rank and every run)."""
    pool = model.new_pool(slots, torch.bfloat16, max_context=max_context)
    gen = torch.Generator(device=model.device).manual_seed(seed)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=gen, device=model.device))
    return pool


def synthetic_request(engine, context: int, gen: torch.Generator, max_new: int) -> Request:
    """A request of ``context`` prompt tokens whose first ``context - 1`` are cached as the pool's
    (random) rows: its prefill computes the last one."""
    pool, vocab = engine.pool, engine.model.cfg.vocab_size
    req = engine.add_request(torch.randint(0, vocab, (context,), generator=gen).tolist(), max_new)
    pool.table.add(req.req_id)
    pool.table.append(req.req_id, pool.alloc(context - 1))
    return req


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- 1. tokens ------------------------------------------------------------------------------


def token_runs(full, cfg, tp, device, backend, graphs_ok, prompt_lens, synthetic, max_new, speculate, seed) -> dict:
    one = build(full, cfg, device, torch.float32, TensorParallel(device=device))
    many = build(full, cfg, device, torch.float32, tp)
    gen = torch.Generator().manual_seed(seed + 1)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in prompt_lens]
    n_req = len(prompts) + len(synthetic)
    context = max(prompt_lens + synthetic) + max_new + 2 * MAX_VERIFY_TOKENS
    slots = sum(prompt_lens) + sum(synthetic) + n_req * (max_new + 4 * MAX_VERIFY_TOKENS) + 1024
    if graphs_ok:
        runs = [("oracle", one, None, True), ("plain_graphs", many, None, True), ("plain_eager", many, None, False),
                ("spec_graphs", many, speculate, True)]
    else:
        runs = [("oracle", one, None, False), ("plain_eager", many, None, False), ("spec_eager", many, speculate, False)]
    outputs, metrics = {}, {}
    for name, model, spec, graphs in runs:
        t0 = time.perf_counter()
        pool = seeded_pool(model, slots, context, seed)
        engine = make_engine(model, pool, backend, spec, cuda_graphs=graphs, graph_batch_sizes=graph_sizes(n_req, spec),
                             record_margins=name == "oracle")
        sgen = torch.Generator().manual_seed(seed + 2)
        reqs = [engine.add_request(p, max_new) for p in prompts]
        reqs += [synthetic_request(engine, n, sgen, max_new) for n in synthetic]
        engine.run(reqs)
        failed = [r.error for r in reqs if r.error]
        if failed:
            raise RuntimeError(f"run {name}: {len(failed)} request(s) failed: {failed[0]}")
        outputs[name] = reqs
        metrics[f"seconds_{name}"] = time.perf_counter() - t0
        if spec:
            metrics[f"accepted_per_step_{name}"] = engine.stats.accepted_per_step
        metrics["leaked_slots"] = metrics.get("leaked_slots", 0) + pool.leaked_slots()
        del engine, pool
        synchronize(device)
    oracle = outputs.pop("oracle")
    metrics["oracle"] = "TP=1 plain " + ("with CUDA graphs" if graphs_ok else "eager")
    metrics["tokens_compared"] = sum(len(r.output) for r in oracle)
    metrics["oracle_near_ties"] = sum(r.near_ties for r in oracle)
    for name, reqs in outputs.items():
        pairs = [compare(a, b) for a, b in zip(oracle, reqs)]
        metrics[f"mismatched_tokens_{name}"] = sum(p[0] for p in pairs)
        metrics[f"near_tie_divergences_{name}"] = sum(p[1] for p in pairs)
    metrics["tokens_pass"] = metrics["leaked_slots"] == 0 and not any(v for k, v in metrics.items() if k.startswith("mismatched_tokens_"))
    del one, many
    return metrics


# ---- 2. speed -------------------------------------------------------------------------------


class Stopwatch:
    """CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.end.record()
            self.end.synchronize()
            self.seconds = self.start.elapsed_time(self.end) / 1e3
        else:
            self.seconds = time.perf_counter() - self.t0


def time_steps(engine, req, warmup: int, steps: int) -> dict:
    """Median step seconds and the median shares of attention and collectives (eager steps: the
    backend's and the group's timers; under graphs both read 0 and are measured apart)."""
    device, tp = engine.model.device, engine.model.tp
    times, attention, collectives = [], [], []
    tp.timer.enabled = engine.profile
    for i in range(warmup + steps):
        synchronize(device)
        tp.timer.reset()
        before = engine.stats.attention_s
        with Stopwatch(device) as watch:
            engine.step([req])
        if i >= warmup:
            times.append(watch.seconds)
            attention.append((engine.stats.attention_s - before) / watch.seconds)
            collectives.append(tp.timer.total_s() / watch.seconds)
    tp.timer.enabled = False
    return {"step_s": statistics.median(times), "attention_share": statistics.median(attention),
            "collective_share": statistics.median(collectives)}


def collectives_seconds(model: DeepseekV3Model, rows: int, reps: int = 50) -> float:
    """Seconds of one step's collectives (2 x layers all-reduces of [rows, hidden] and the logits
    gather), from a CUDA graph of just them replayed ``reps`` times back to back (eager on the CPU)."""
    tp, device = model.tp, model.device
    if tp.size == 1:
        return 0.0
    x = torch.zeros(rows, model.cfg.hidden_size, dtype=model.dtype, device=device)
    head = torch.zeros(rows, model.lm_head.shape[0], dtype=model.dtype, device=device)

    def collectives() -> None:
        for _ in range(2 * model.num_layers):
            tp.all_reduce(x)
        tp.gather_vocab(head, model.cfg.vocab_size)

    run = collectives
    if device.type == "cuda":
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            collectives()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            collectives()
        run = graph.replay
    for _ in range(3):
        run()
    synchronize(device)
    dist.barrier(group=tp.group)
    with Stopwatch(device) as watch:
        for _ in range(reps):
            run()
    return watch.seconds / reps


def speed_runs(full, cfg, tp, device, backend, graphs_ok, contexts, warmup, steps, seed) -> tuple[dict, list[dict]]:
    """Flat metrics (``decode_tps_tp2_32k_graphs``, ...) and the same as rows."""
    metrics, rows = {}, []
    groups = [TensorParallel(device=device)] + ([tp] if tp.size > 1 else [])
    context_cap = max(contexts) + (warmup + steps) * 2 + 64
    modes = ("graphs", "eager") if graphs_ok else ("eager",)
    for group in groups:
        model = build(full, cfg, device, torch.bfloat16 if device.type == "cuda" else torch.float32, group)
        pool = seeded_pool(model, context_cap + 1024, context_cap, seed)
        coll_s = collectives_seconds(model, rows=1)
        for mode in modes:
            engine = make_engine(model, pool, backend, None, cuda_graphs=mode == "graphs", graph_batch_sizes=(1,),
                                 profile=mode == "eager")
            gen = torch.Generator().manual_seed(seed + 3)
            for context in contexts:
                req = synthetic_request(engine, context, gen, 10**9)
                engine.prefill(req)
                res = time_steps(engine, req, warmup, steps)
                pool.release_request(req.req_id)
                row = dict(tp=group.size, context=context, mode=mode, decode_tps=1.0 / res["step_s"], step_ms=res["step_s"] * 1e3)
                if mode == "graphs":
                    row.update(attention_share=attention_share(engine, res["step_s"]), collective_share=coll_s / res["step_s"])
                else:
                    row.update(attention_share=res["attention_share"], collective_share=res["collective_share"])
                tag = f"tp{group.size}_{label(context)}_{mode}"
                metrics.update({f"{k}_{tag}": v for k, v in row.items() if isinstance(v, float)})
                rows.append(row)
                if tp.rank == 0:
                    print(json.dumps(row), file=sys.stderr, flush=True)
            del engine
        metrics[f"collectives_us_tp{group.size}"] = coll_s * 1e6
        del model, pool
        synchronize(device)
    return metrics, rows


# ---- the run --------------------------------------------------------------------------------


def run(
    tp: TensorParallel,
    preset: str = "gpu-h16",
    prompt_lens: list[int] = (17, 300, 2048),
    synthetic: list[int] = (32768,),
    max_new_tokens: int = 32,
    speculate: str = "tree:4x4:layers=1",
    speed_contexts: list[int] = (32768, 131072),
    warmup: int = 3,
    steps: int = 10,
    seed: int = 0,
    backend: str | None = None,
) -> dict:
    """Both parts on every rank; returns the metrics (the same on every rank but for timings)."""
    device = tp.device
    backend = backend or ("kernel" if device.type == "cuda" else "reference")
    graphs_ok = device.type == "cuda" and backend == "kernel"
    cfg = preset_config(preset)
    full = random_weights(cfg, seed)
    t0 = time.perf_counter()
    metrics: dict = {"tp": tp.size, "preset": preset, "device": str(device), "backend": backend}
    metrics.update(token_runs(full, cfg, tp, device, backend, graphs_ok, list(prompt_lens), list(synthetic),
                              max_new_tokens, speculate, seed))
    metrics["tokens_s"] = time.perf_counter() - t0
    if tp.rank == 0:
        print(json.dumps(metrics), file=sys.stderr, flush=True)
    speed, rows = speed_runs(full, cfg, tp, device, backend, graphs_ok, list(speed_contexts), warmup, steps, seed)
    metrics.update(speed, speed_rows=rows)
    metrics["wall_s"] = time.perf_counter() - t0
    return metrics


def markdown(m: dict) -> str:
    lines = [f"TP={m['tp']} ({m['preset']}, {m['backend']} backend on {m['device']})", "",
             f"tokens: {'PASS' if m['tokens_pass'] else 'FAIL'}, {m['tokens_compared']} compared against {m['oracle']}; "
             f"near ties in the oracle: {m['oracle_near_ties']}; leaked slots: {m['leaked_slots']}",
             "", "| run | mismatched tokens | near-tie divergences |", "|---|---|---|"]
    for name in sorted(k[len("mismatched_tokens_"):] for k in m if k.startswith("mismatched_tokens_")):
        lines.append(f"| TP={m['tp']} {name} | {m[f'mismatched_tokens_{name}']} | {m[f'near_tie_divergences_{name}']} |")
    lines += ["", "| TP | context | mode | decode tok/s | step ms | attention share | collective share |", "|---|---|---|---|---|---|---|"]
    for r in sorted(m["speed_rows"], key=lambda r: (r["context"], r["mode"], r["tp"])):
        lines.append(f"| {r['tp']} | {label(r['context'])} | {r['mode']} | {r['decode_tps']:.1f} | {r['step_ms']:.2f} | "
                     f"{r['attention_share']:.2f} | {r['collective_share']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--args", default="{}", help="JSON keyword arguments for run()")
    parser.add_argument("--device", default=None, help="cuda (default with a GPU) or cpu (gloo)")
    parser.add_argument("--out", default=None, help="write the metrics as JSON here (rank 0)")
    ns = parser.parse_args()
    device_type = ns.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not launched_by_torchrun():
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    tp = init_from_env(device_type, check_steps=True)
    try:
        metrics = run(tp, **json.loads(ns.args))
    finally:
        tp.close()
    if tp.rank == 0:
        if ns.out:
            with open(ns.out, "w") as f:
                json.dump(metrics, f, indent=1)
        print(markdown(metrics))
    return 0 if metrics["tokens_pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
