"""Gate ``integrity``: compaction never corrupts, leaks or changes an output.

Three parts, one pool each:

1. Churn (``requests`` live requests, ``rounds`` rounds). Every row is written from a stamp
   (``common.stamped_rows``), so it can be regenerated and compared byte for byte. The pool
   starts scattered (its free stack shuffled, then every request grown in small pieces); each
   round some requests finish and new ones of log-uniform length arrive, the rest grow a few
   tokens, then the pool is compacted: on even rounds all at once, on odd rounds a budget of
   moves at a time with more churn (finishes, growth, arrivals) between the pieces, as between
   engine steps. After every round and every piece: every live row against its stamp, the
   device slot table against the host lists, no slot owned twice, no slot allocated to nobody
   beyond the compaction's reservation. Every ``attention_every`` rounds the verify attention
   (the kernel, random queries and trees over ``attention_requests`` live requests, first and
   last layer) runs before and after the compaction, after it both by index and through the
   contiguous fast path (the plan told each request's leading run): outputs must be bitwise equal.
2. Engine: tree speculative decoding of ``engine_prompts`` prompts from a scattered pool,
   without compaction, then with a full compaction at random steps, then with the incremental
   defragmenter under a small budget; tokens must equal the first run's, and after every step
   the live rows are unchanged across the compaction and the bookkeeping consistent.
3. Planner: ``planner_pools`` random host-list pools planned and simulated move by move, in
   chunks and at once (``serving.defrag.planner.simulate``).

Metrics: ``corrupted_rows`` (rows differing from their stamp, table entries differing from the
host lists, slots owned twice, engine rows changed by a compaction, planner simulations that
failed), ``leaked_slots`` (summed over every check), ``output_mismatches`` (attention calls
not bitwise equal + tokens differing in the engine runs), with their parts and counts beside.

Gate: ``call: phases.defrag.integrity:run`` with ``args: {requests: 256, rounds: 50}`` (CUDA).
CPU profile (tests): ``run(**CPU_PROFILE)``. Standalone: ``python -m phases.defrag.integrity`` (``--cpu`` with
``TRITON_INTERPRET=1``; ``--args`` JSON keyword arguments).
"""

from __future__ import annotations

import json
import math
import random
import sys
import time

import numpy as np
import torch

from kernel import MLAVerifyWrapper
from kernel.bench_api import contiguous_runs
from phases.defrag.stamped_pool import (
    StampedPool,
    attention_batch,
    gate_main,
    kv_indices,
)
from serving.defrag import (
    Compaction,
    Defragmenter,
    DefragPolicy,
    measure_pool,
    plan_compaction,
    simulate,
)
from serving.device.select import DTYPES, pick_device
from serving.model.presets import random_model
from serving.stack import ServingConfig, build_engine

try:
    from runner import gatekit
except ImportError:  # the gate also runs where the runner is not importable
    gatekit = None

CPU_PROFILE = dict(requests=10, rounds=4, layers=2, row_dim=64, v_head_dim=32, heads=2, context=(4, 60),
                   attention_every=2, attention_requests=3, engine_prompts=2, engine_context=24, engine_tokens=8,
                   preset="tiny", speculate="tree:2x2", planner_pools=40, device="cpu")


def run(
    requests: int = 256,
    rounds: int = 50,
    layers: int = 4,
    row_dim: int = 576,
    v_head_dim: int = 512,
    heads: int = 16,
    dtype: str = "bf16",
    context: tuple[int, int] = (64, 8192),
    attention_every: int = 5,
    attention_requests: int = 64,
    engine_prompts: int = 8,
    engine_context: int = 2048,
    engine_tokens: int = 32,
    preset: str = "gpu-h16",
    speculate: str = "tree:4x4:layers=1",
    planner_pools: int = 200,
    device: str | None = None,
    seed: int = 0,
) -> dict:
    """Run the gate; returns its metrics (see the module docstring)."""
    dev = pick_device(device)
    t_start = time.perf_counter()
    total = rounds + 4
    metrics = churn_part(requests, rounds, layers, row_dim, v_head_dim, heads, DTYPES[dtype], tuple(context),
                         attention_every, attention_requests, dev, seed, progress=lambda i: _progress(i, total))
    engine = engine_part(engine_prompts, engine_context, engine_tokens, preset, speculate, dev, seed)
    _progress(rounds + 3, total)
    violations = planner_part(planner_pools, seed)
    _progress(total, total)
    metrics.update(engine)
    metrics["planner_violations"] = violations
    metrics["corrupted_rows"] += engine["engine_corrupted_rows"] + violations
    metrics["leaked_slots"] += engine["engine_leaked_slots"]
    metrics["output_mismatches"] = metrics["attention_mismatches"] + engine["token_mismatches"]
    metrics["wall_s"] = time.perf_counter() - t_start
    return metrics


def _progress(done: int, total: int) -> None:
    if gatekit:
        gatekit.progress(done, total)


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))) if hi > lo else lo


# ---- part 1: churn -------------------------------------------------------------------


def churn_part(requests, rounds, layers, row_dim, v_head_dim, heads, dtype, context, attention_every,
               attention_requests, dev, seed, progress) -> dict:
    rng = random.Random(seed)
    lo, hi = context
    mean = (hi - lo) / math.log(hi / lo) if hi > lo else lo
    num_slots = int(2.2 * requests * mean) + 8 * hi + 1024
    sp = StampedPool.make(layers, num_slots, row_dim, dtype, dev, max_requests=2 * requests,
                          max_context=hi + 16 * rounds + 64, seed=seed)
    pool = sp.pool
    targets = [_log_uniform(rng, lo, hi) for _ in range(requests)]
    ids = [sp.new_request(max(1, n // 2)) for n in targets]
    sp.scatter_free_stack()
    for _ in range(4):  # the second halves in pieces, interleaved: every request scattered
        for req, n in zip(ids, targets):
            if req is not None:
                sp.grow(req, max(0, n - n // 2) // 4)
    totals = dict(corrupted_rows=0, leaked_slots=0, attention_mismatches=0, attention_checks=0, compactions=0,
                  moved_rows=0, deferred_requests=0, incomplete_requests=0, pieces=0, dropped_moves=0)
    table_rows = []
    sm_scale = 1.0 / math.sqrt(192.0)
    for r in range(rounds):
        finished = sum(rng.random() < 0.08 for _ in range(requests))
        sp.churn(0.08, (1, 8), [_log_uniform(rng, lo, hi) for _ in range(finished)])
        _add(totals, sp.check())
        before = measure_pool(pool).summary()
        attention = attention_every and r % attention_every == 0 and r % 2 == 0
        if attention:
            live = pool.table.requests()
            chosen = rng.sample(live, min(attention_requests, len(live)))
            batch = attention_batch(pool, chosen, heads, rng)
            out_before = _attend(pool, batch, kv_indices(pool, chosen), v_head_dim, sm_scale)
        plan = _plan(pool)
        c = Compaction(pool, plan)
        if r % 2 == 0:
            c.run()
        else:  # a budget at a time, the engine going on in between
            budget = max(1, plan.num_moves // 4 + 1)
            while not c.done:
                c.step(budget)
                sp.churn(0.02, (1, 3), [_log_uniform(rng, lo, hi // 4 + lo)] if rng.random() < 0.3 else [])
                _add(totals, sp.check(reserved=len(c.reserved)))
        _add(totals, sp.check())
        if attention:  # after: by index, and through the contiguous fast path
            indices = kv_indices(pool, chosen)
            for fast in (False, True):
                out_after = _attend(pool, batch, indices, v_head_dim, sm_scale, fast)
                totals["attention_checks"] += len(out_before)
                totals["attention_mismatches"] += sum(not torch.equal(a.view(torch.int16), b.view(torch.int16))
                                                      for a, b in zip(out_before, out_after))
        after = measure_pool(pool).summary()
        totals["compactions"] += 1
        totals["moved_rows"] += c.stats.applied
        totals["pieces"] += c.stats.pieces
        totals["dropped_moves"] += c.stats.dropped
        totals["deferred_requests"] += len(plan.deferred)
        totals["incomplete_requests"] += len(plan.incomplete)
        table_rows.append((r, after["live_tokens"], plan.num_moves, len(plan.deferred), before["runs_per_1k"],
                           after["runs_per_1k"], before["largest_free_run"], after["largest_free_run"],
                           totals["corrupted_rows"], totals["leaked_slots"]))
        print(json.dumps(dict(round=r, live=after["live_tokens"], moves=plan.num_moves, runs_per_1k_before=before["runs_per_1k"],
                              runs_per_1k_after=after["runs_per_1k"], corrupted=totals["corrupted_rows"])),
              file=sys.stderr, flush=True)
        progress(r + 1)
    totals["live_rows_final"] = table_rows[-1][1] if table_rows else 0
    if gatekit:
        head = ("| round | live rows | moves | deferred | runs/1k before | after | largest free run before | after "
                "| corrupted (total) | leaked (total) |\n|---|---|---|---|---|---|---|---|---|---|\n")
        gatekit.write_artifact("integrity.md", f"{requests} requests, {layers} layers x {row_dim} ({dtype}), "
                               f"{num_slots} slots\n\n" + head + "\n".join(
                                   "| " + " | ".join(str(x) for x in row) + " |" for row in table_rows) + "\n")
    return totals


def _plan(pool):
    t = pool.table
    return plan_compaction({r: t.slots(r) for r in t.requests()}, np.flatnonzero(pool.allocator.free_mask()),
                           pool.num_slots, reserve=lambda n: max(8, n // 50))


def _add(totals: dict, check: dict) -> None:
    totals["corrupted_rows"] += check["corrupted_rows"]
    totals["leaked_slots"] += check["leaked_slots"]


def _attend(pool, batch, indices, v_head_dim, sm_scale, fast: bool = False) -> list[torch.Tensor]:
    """Outputs of the first and last layer for ``batch`` over ``indices``; ``fast``: the plan
    is told each request's leading contiguous run (from the slot table's host lists)."""
    runs = (None, None)
    if fast:
        t = pool.table
        runs = contiguous_runs(batch.kv_indptr.numpy(), [s for r in batch.requests for s in t.slots(r)])
    wrapper = MLAVerifyWrapper(pool.kv.device)
    wrapper.plan(batch.qo_indptr, batch.kv_indptr, batch.q.shape[1], head_dim=pool.kv.shape[2],
                 v_head_dim=v_head_dim, dtype=batch.q.dtype, kv_start=runs[0], kv_contig=runs[1])
    outs = []
    for layer in sorted({0, pool.kv.shape[0] - 1}):
        outs.append(wrapper.run(batch.q, pool.layer(layer), indices, batch.tree_mask, sm_scale).clone())
    return outs


# ---- part 2: the engine ----------------------------------------------------------------


class _StepChecks:
    """Between steps: optionally a compaction (random full ones, or a defragmenter's budget),
    with every live row compared across it and the bookkeeping checked after."""

    def __init__(self, defrag: Defragmenter, rng: random.Random | None) -> None:
        self.defrag, self.rng = defrag, rng
        self.corrupted = self.leaked = self.steps = 0

    def __call__(self, engine) -> None:
        pool, t = engine.pool, engine.pool.table
        rows = {r: pool.kv[:, t.slots(r)].clone() for r in t.requests()}
        if self.rng is None:
            self.defrag(engine)
        elif self.rng.random() < 0.3:
            self.defrag.compact()
        self.steps += 1
        owned = [s for r in t.requests() for s in t.slots(r)]
        self.corrupted += len(owned) - len(set(owned))
        for r in t.requests():
            self.corrupted += int((pool.kv[:, t.slots(r)] != rows[r]).any(dim=2).any(dim=0).sum())
            self.corrupted += sum(a != b for a, b in zip(t.device_slots(r).tolist(), t.slots(r)))
        self.leaked += abs(pool.leaked_slots() - self.defrag.reserved_slots)


def engine_part(prompts, context, tokens, preset, speculate, dev, seed) -> dict:
    model_dtype = torch.float32
    model = random_model(preset, dev, model_dtype, seed)
    backend = "kernel" if dev.type == "cuda" else "reference"
    gen = torch.Generator().manual_seed(seed + 7)
    texts = [torch.randint(0, model.cfg.vocab_size, (context,), generator=gen).tolist() for _ in range(prompts)]
    slots = prompts * (context + tokens * 80) + 4096
    outputs, checks = [], []
    for mode in ("none", "random", "budget"):
        pool = model.new_pool(slots, torch.bfloat16)
        scatter = pool.allocator.alloc(pool.allocator.num_free)
        random.Random(seed).shuffle(scatter)
        pool.allocator.free(scatter)
        hooks = []
        if mode != "none":
            policy = DefragPolicy(threshold=0.0, min_tokens=1, min_runs=2, max_moves=256, min_reserve=8)
            hooks.append(_StepChecks(Defragmenter(pool, policy), random.Random(seed + 1) if mode == "random" else None))
            checks.append(hooks[-1])
        config = ServingConfig(backend=backend, speculate=speculate, pool_slots=pool.num_slots)
        engine = build_engine(config, model, pool, hooks).engine
        reqs = engine.generate(texts, tokens)
        outputs.append([r.output if r.error is None else None for r in reqs])
        if mode != "none":
            checks[-1].leaked += pool.leaked_slots()
        del pool, engine
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    mismatched = compared = 0
    for ref, *others in zip(*outputs):
        for got in others:
            if ref is None or got is None:
                mismatched += tokens
                continue
            compared += len(ref)
            first = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
            mismatched += max(len(ref), len(got)) - first
    return {
        "token_mismatches": mismatched,
        "tokens_compared": compared,
        "engine_corrupted_rows": sum(h.corrupted for h in checks),
        "engine_leaked_slots": sum(h.leaked for h in checks),
        "engine_steps_checked": sum(h.steps for h in checks),
        "engine_moved_rows": sum(h.defrag.stats.moved_rows for h in checks),
        "engine_compactions": sum(h.defrag.stats.compactions for h in checks),
    }


# ---- part 3: the planner -------------------------------------------------------------------


def planner_part(pools: int, seed: int) -> int:
    """Random host-list pools planned and simulated; returns the plans that failed a check."""
    failures = 0
    rng = random.Random(seed + 11)
    for i in range(pools):
        num_slots = rng.choice((16, 64, 256, 2048))
        reqs, free = _random_lists(num_slots, rng.randint(0, 3 * num_slots // 2), rng)
        chosen = None if rng.random() < 0.7 else [r for r in reqs if rng.random() < 0.5]
        try:
            plan = plan_compaction(reqs, free, num_slots, select=chosen, reserve=rng.randint(0, 5))
            for chunk in (None, 1, rng.randint(2, 9)):
                out, out_free = simulate(plan, reqs, free, chunk)
                assert {r: len(s) for r, s in out.items()} == {r: len(s) for r, s in reqs.items()}
                assert len(out_free) == len(free)
                for r, start in plan.targets.items():
                    assert r in plan.incomplete or out[r] == list(range(start, start + len(out[r])))
        except AssertionError as exc:
            failures += 1
            print(f"planner pool {i}: {exc}", file=sys.stderr, flush=True)
    return failures


def _random_lists(num_slots: int, steps: int, rng: random.Random) -> tuple[dict[int, list[int]], list[int]]:
    free = list(range(num_slots - 1, 0, -1))
    reqs: dict[int, list[int]] = {}
    for step in range(steps):
        if reqs and rng.random() < 0.12:
            free.extend(reqs.pop(rng.choice(list(reqs))))
            continue
        if not reqs or rng.random() < 0.2:
            reqs[step] = []
        r = rng.choice(list(reqs))
        k = rng.randint(1, 6)
        if k <= len(free):
            reqs[r].extend(free.pop() for _ in range(k))
        if rng.random() < 0.05:
            rng.shuffle(free)
    for r in [r for r in reqs if rng.random() < 0.3]:
        free.extend(reqs.pop(r))
    return {r: s for r, s in reqs.items() if s}, free


def main(argv: list[str] | None = None) -> int:
    return gate_main(run, CPU_PROFILE, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
