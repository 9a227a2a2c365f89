"""End-to-end decode throughput, the numbers a user of the engine compares: tokens/s per context
and batch, plain decoding and tree speculation, the engine with CUDA graphs against its eager
steps and the reference backend.

Rows (each: ``steps`` engine steps after ``warmup``, CUDA-event timed, tokens/s = emitted
tokens / step time):

- presets ``gpu-h16`` (4 layers, the gates' model) and ``dsv3-tp8`` (61 layers, one TP=8 rank
  of DeepSeek-V3), B in ``batches``, contexts in ``contexts`` (per preset);
- ``plain``: greedy decoding; ``tree``: the layer-skip drafter (``tree:4x4:layers=1``; a
  random model accepts few of its drafts); ``accept-all``: the target itself as drafter
  (``layers`` = all), which accepts every draft it proposes except at near ties: the verify
  machinery's best case for the tree (its drafting costs a full forward per depth).

The context's latent rows are random (written into the pool, not prefilled): decode cost does
not depend on their values, and a 185k-token prefill of 61 layers would cost minutes per row.
What a first request pays (prefill, warm-up) is the ``overhead`` gate's measurement.

    python -m phases.cudagraph.bench.throughput --out e2e.json   (H200: about 3 minutes)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from phases.common.engines import make_engine
from phases.cudagraph.decode_speed import label
from serving.engine.engine import Request
from serving.model.presets import random_model

SPECS = {"plain": None, "tree": "tree:4x4:layers=1", "accept-all": "tree:4x4:layers={all}"}


def synthetic_requests(engine, batch: int, context: int, gen: torch.Generator) -> list[Request]:
    """``batch`` requests whose ``context`` cached rows are random, ready to decode."""
    pool, vocab = engine.pool, engine.model.cfg.vocab_size
    reqs = []
    for _ in range(batch):
        prompt = torch.randint(0, vocab, (context,), generator=gen).tolist()
        req = engine.add_request(prompt, 10**9)
        pool.table.add(req.req_id)
        pool.table.append(req.req_id, pool.alloc(context - 1))
        req.output.append(prompt[-1])
        reqs.append(req)
    return reqs


def time_decode(engine, reqs, warmup: int, steps: int) -> dict:
    from phases.cudagraph.decode_speed import time_steps

    times, emitted = [], []
    for i in range(warmup + steps):
        before = sum(len(r.output) for r in reqs)
        seconds, _ = time_steps(engine, reqs, 0, 1)
        if i >= warmup:
            times.append(seconds)
            emitted.append(sum(len(r.output) for r in reqs) - before)
    step = statistics.median(times)
    return {"tokens_per_s": sum(emitted) / sum(times), "step_ms": step * 1e3, "tokens_per_step": sum(emitted) / len(emitted)}


def run_preset(preset: str, contexts: list[int], batches: list[int], runs: dict[str, list[str]],
               warmup: int, steps: int, seed: int = 0, device: str = "cuda") -> list[dict]:
    """``runs``: speculation mode -> the backends to time it with (``reference``, ``kernel``,
    ``kernel+graphs``)."""
    device = torch.device(device)
    model = random_model(preset, device, torch.bfloat16 if device.type == "cuda" else torch.float32, seed)
    rows = []
    room = max(batches) * (max(contexts) + (warmup + steps) * 80 + 256)
    pool = model.new_pool(room, torch.bfloat16, max_requests=max(batches), max_context=max(contexts) + (warmup + steps) * 80)
    pool.kv.normal_()
    gen = torch.Generator().manual_seed(seed)
    for spec_name, backends in runs.items():
        spec = SPECS[spec_name]
        if spec is not None:
            spec = spec.format(all=model.num_layers)
        for backend in backends:
            graphs = backend == "kernel+graphs"
            t0 = time.perf_counter()
            engine = make_engine(model, pool, backend.split("+")[0], spec, cuda_graphs=graphs and device.type == "cuda",
                                 graph_batch_sizes=(1, 2, 4, 8, 16, 32))
            capture_s = time.perf_counter() - t0
            for context in contexts:
                for batch in batches:
                    reqs = synthetic_requests(engine, batch, context, gen)
                    result = time_decode(engine, reqs, warmup, steps)
                    for r in reqs:
                        if not r.finished:
                            pool.release_request(r.req_id)
                    row = dict(preset=preset, spec=spec_name, backend=backend, context=context, batch=batch,
                               capture_s=capture_s if graphs else 0.0, **result)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
            del engine
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| preset | spec | backend | context | B | tokens/s | step ms | tokens/step |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['preset']} | {r['spec']} | {r['backend']} | {label(r['context'])} | {r['batch']} | "
                     f"{r['tokens_per_s']:.1f} | {r['step_ms']:.2f} | {r['tokens_per_step']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument("--quick", action="store_true", help="fewer rows (a smoke run)")
    args = parser.parse_args()
    rows = []
    if args.quick:
        rows += run_preset("gpu-h16", [4096], [1], {"plain": ["kernel+graphs"]}, 2, 5)
    else:
        rows += run_preset("gpu-h16", [4096, 32768, 131072, 185000], [1, 8], {
            "plain": ["reference", "kernel+graphs"],  # the decode-speed gate has the kernel's eager steps
            "tree": ["reference", "kernel+graphs"],
            "accept-all": ["kernel+graphs"],
        }, 2, 8)
        rows += run_preset("dsv3-tp8", [65536, 185000], [1], {"plain": ["kernel", "kernel+graphs"]}, 2, 8)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(markdown(rows))


if __name__ == "__main__":
    main()
