"""The greedy comparison several gates run: speculation through one backend against plain greedy
decoding through the reference backend, on one model and pool (see ``phases.backend.greedy``
for what is counted). Phase ``backend``'s ``greedy`` gate runs it at full size; phase
``cudagraph``'s ``replay`` gate runs it small with graphs on.
"""


from __future__ import annotations

import json
import sys
import time

import torch

from phases.common.engines import SharedContext, make_engine
from serving.device.select import DTYPES, pick_device
from serving.engine.engine import Request
from serving.kv.pool import PoolExhausted
from serving.model.presets import random_model
from serving.speculation.drafters import parse_speculate
from serving.speculation.tree import MAX_VERIFY_TOKENS

RUNS = (("reference", None), ("reference", "spec"), ("kernel", "spec"))


def graph_sizes(requests: int, speculate: str) -> tuple[int, ...]:
    """Buckets for a group of ``requests``: powers of two up to what its steps need (a
    drafter's chain steps carry ``requests * width`` entries)."""
    width = parse_speculate(speculate).width if speculate else 1
    top = requests * width
    return tuple(1 << i for i in range(max(1, top - 1).bit_length() + 1))


def compare(ref: Request, got: Request) -> tuple[int, int]:
    """(mismatched tokens, 1 if the first divergence is a reference near tie else 0)."""
    a, b = ref.output, got.output
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i] != b[i]:
            if i < len(ref.tie_flags) and ref.tie_flags[i]:
                return 0, 1
            return max(len(a), len(b)) - i, 0
    return 0, 0


def greedy_check(
    prompts: int = 64,
    max_new_tokens: int = 256,
    contexts: list[int] = (4096, 65536, 131072),
    preset: str = "gpu-h16",
    speculate: str = "tree:4x4:layers=1",
    dtype: str = "fp32",
    suffix_tokens: int = 16,
    prefill_chunk: int = 8192,
    device: str | None = None,
    seed: int = 0,
    cuda_graphs: bool = False,
    gatekit=None,
) -> dict:
    """Run the comparison; returns its scalar metrics (see ``phases.backend.greedy``). ``cuda_graphs``:
    the kernel-backend run replays its steps from CUDA graphs (phase ``cudagraph``'s check).
    ``gatekit``: ``runner.gatekit`` to report progress and write the ``greedy.md`` artifact (None: neither)."""
    dev = pick_device(device)
    model = random_model(preset, dev, DTYPES[dtype], seed)
    gen = torch.Generator().manual_seed(seed + 1)
    contexts = list(contexts)
    groups = [[i for i in range(prompts) if i % len(contexts) == k] for k in range(len(contexts))]
    totals = dict(requests=0, requests_failed=0, mismatched_tokens=0, near_tie_divergences=0, near_ties=0,
                  reference_spec_mismatched_tokens=0, tokens_compared=0, leaked_slots=0)
    accepted = {"reference": [0, 0], "kernel": [0, 0]}  # drafts, request-steps
    rows, done, t_start = [], 0, time.perf_counter()
    for context, members in zip(contexts, groups):
        if not members:
            continue
        suffix_len = min(suffix_tokens, context - 1) if context > 1 else 1
        prefix = torch.randint(0, model.cfg.vocab_size, (context - suffix_len,), generator=gen).tolist()
        suffixes = [torch.randint(0, model.cfg.vocab_size, (suffix_len,), generator=gen).tolist() for _ in members]
        slots = context + len(members) * (context + max_new_tokens + 2 * MAX_VERIFY_TOKENS) + 1024
        pool = model.new_pool(slots, torch.bfloat16)
        builder = make_engine(model, pool, "reference", None, prefill_chunk=prefill_chunk)
        shared = SharedContext(builder, prefix) if prefix else None
        outputs, seconds = [], []
        for backend, spec in RUNS:
            engine = make_engine(model, pool, backend, speculate if spec else None, prefill_chunk=prefill_chunk,
                                 record_margins=spec is None, cuda_graphs=cuda_graphs and backend == "kernel",
                                 graph_batch_sizes=graph_sizes(len(members), speculate))
            reqs = []
            for suffix in suffixes:
                if shared is None:
                    reqs.append(engine.add_request(suffix, max_new_tokens))
                    continue
                try:
                    reqs.append(shared.start(engine, suffix, max_new_tokens))
                except PoolExhausted as exc:
                    req = engine.add_request(prefix + suffix, max_new_tokens)
                    req.error, req.finished = str(exc), True
                    reqs.append(req)
            t0 = time.perf_counter()
            engine.run(reqs)
            seconds.append(time.perf_counter() - t0)
            outputs.append(reqs)
            if spec:
                accepted[backend][0] += engine.stats.accepted_drafts
                accepted[backend][1] += engine.stats.request_steps
        if shared is not None:
            shared.release()
        totals["leaked_slots"] += pool.allocator.capacity - pool.allocator.num_free
        plain, ref_spec, kern_spec = outputs
        group = dict(context=context, requests=len(members), mismatched=0, near_tie_divergences=0, near_ties=0)
        for a, b, c in zip(plain, ref_spec, kern_spec):
            totals["requests"] += 1
            if a.error or b.error or c.error:
                totals["requests_failed"] += 1
                continue
            mismatched, tie = compare(a, c)
            totals["mismatched_tokens"] += mismatched
            totals["near_tie_divergences"] += tie
            totals["reference_spec_mismatched_tokens"] += compare(a, b)[0]
            totals["near_ties"] += a.near_ties
            totals["tokens_compared"] += len(a.output)
            group["mismatched"] += mismatched
            group["near_tie_divergences"] += tie
            group["near_ties"] += a.near_ties
        group.update(plain_s=seconds[0], reference_spec_s=seconds[1], kernel_spec_s=seconds[2])
        rows.append(group)
        print(json.dumps(group), file=sys.stderr, flush=True)
        del pool, builder, shared
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        done += len(members)
        if gatekit:
            gatekit.progress(done, prompts)
    acc_ref = accepted["reference"][0] / max(1, accepted["reference"][1])
    acc_kern = accepted["kernel"][0] / max(1, accepted["kernel"][1])
    metrics = dict(totals)
    metrics.update(
        accepted_per_step_reference=acc_ref,
        accepted_per_step_kernel=acc_kern,
        accepted_length_delta=abs(acc_kern - acc_ref) / acc_ref if acc_ref else float(acc_kern != acc_ref),
        wall_s=time.perf_counter() - t_start,
    )
    if gatekit:
        table = ["| context | requests | mismatched | near-tie divergences | near ties | plain s | ref spec s | kernel spec s |",
                 "|---|---|---|---|---|---|---|---|"]
        table += [f"| {r['context']} | {r['requests']} | {r['mismatched']} | {r['near_tie_divergences']} | {r['near_ties']} | "
                  f"{r['plain_s']:.1f} | {r['reference_spec_s']:.1f} | {r['kernel_spec_s']:.1f} |" for r in rows]
        gatekit.write_artifact("greedy.md", f"preset {preset}, {speculate}, {dtype} model, bf16 pool\n\n" + "\n".join(table) + "\n")
    return metrics
