"""What MTP trees buy on a random preset: DeepSeek's MTP drafter with its acceptance set.

``AcceptAllMTP`` runs the MTP drafter's device work unchanged (the module on the target's steps
and its chain step), then replaces each request's first chain by the tokens plain greedy
decoding emitted there (``futures``, from a plain run of the same requests), so its drafts are
accepted: all of them, or ``accepted`` per step on average (a trained model's measured mean),
the chain then turning off the greedy path. Random models accept almost nothing; this measures
the verify machinery at a given acceptance, at the cost of the real drafter's work.


``measure`` times it on a preset at long contexts (``python -m phases.speculation.bench.accept_all``):
plain decoding, then each acceptance, on one prefilled context per length, and checks every
speculative run's tokens against plain decoding's.

Decisions:
- A fractional ``accepted`` a is met exactly over a request's steps: step i keeps
  floor((i+1)a) - floor(ia) drafts, so the mean tokens per step is a + 1 (the bonus token).
- The other chains never start with the greedy token, so nothing is accepted by chance.
"""

from __future__ import annotations

import math
import sys
import time

import torch

from serving.speculation.drafters import MTPDrafter
from serving.speculation.tree import DraftTree


class AcceptAllMTP(MTPDrafter):
    """``MTPDrafter(width, depth)`` whose first chain is plain greedy's continuation.

    futures: request id -> the tokens plain decoding emits for it (its whole output).
    accepted: drafts kept per step on average (0 .. depth); None: all of them.
    Requests must be the engine's ``Request`` objects (their ``output`` says where they are).
    """

    def __init__(self, width: int, depth: int, futures: dict[int, list[int]], accepted: float | None = None) -> None:
        super().__init__(width, depth)
        if accepted is not None and not 0 <= accepted <= depth:
            raise ValueError(f"Expected 0 <= accepted <= depth ({depth}), got {accepted}")
        self.futures = futures
        self.accepted = accepted
        self._steps: dict[int, int] = {}

    def _keep(self, req_id: int) -> int:
        if self.accepted is None:
            return self.depth
        i = self._steps.get(req_id, 0)
        self._steps[req_id] = i + 1
        return math.floor((i + 1) * self.accepted) - math.floor(i * self.accepted)

    def propose(self, ctx, requests):
        trees = [tree.read() for tree in super().propose(ctx, requests)]  # its paths need the drafts' values
        out = []
        for r, tree in zip(requests, trees):
            future = self.futures[r.req_id][len(r.output) :]
            if not future:
                out.append(tree)
                continue
            keep = self._keep(r.req_id)
            chain = future[: min(keep, self.depth)]
            if len(chain) < self.depth and len(chain) < len(future):
                wrong = _other_than(future[len(chain)])  # the chain leaves the greedy path here
                chain = chain + [wrong] * (self.depth - len(chain))
            others = [p for p in _paths(tree) if p[0] not in (future[0], chain[0])]
            out.append(DraftTree.from_paths([chain] + others[: self.width - 1]))
        return out


def _other_than(token: int) -> int:
    return token - 1 if token > 0 else token + 1


def _paths(tree: DraftTree) -> list[list[int]]:
    """Root-to-leaf token paths of ``tree``."""
    children = {p for p in tree.parents if p >= 0}
    paths = []
    for leaf in range(len(tree)):
        if leaf in children:
            continue
        path, node = [], leaf
        while node >= 0:
            path.append(tree.tokens[node])
            node = tree.parents[node]
        paths.append(path[::-1])
    return paths


def measure(preset: str = "dsv3-tp8", contexts: list[int] = (65536, 185000), width: int = 4, depth: int = 3,
            accepted: list[float | None] = (None,), max_new_tokens: int = 128, prefill_chunk: int = 8192,
            passes: int = 4, device: str | None = None, seed: int = 0) -> dict:
    """Decode tokens/s of one request, plain and with ``mtp:{width}x{depth}`` at each acceptance,
    per context (on CUDA: kernel backend, bf16, CUDA graphs; on a CPU: the reference backend,
    fp32); all requests start from copies of one
    prefilled random context. Metrics per context label: ``plain_tok_s``; per acceptance
    (``all`` or the value): ``mtp_{a}_tok_s``, ``_tokens_per_step``, ``_ratio``, ``_passes``,
    ``_self_consistent`` and ``_mismatched_tokens`` (against plain decoding's tokens).

    The oracle of a speculative run is first plain decoding's tokens, then (up to ``passes``
    runs) the previous run's own output, until a run emits exactly its oracle: on a deep random
    model in bf16 the verify steps' tokens part from plain decoding's within a few tokens (61
    random layers amplify the rounding differences between decode- and verify-shaped GEMMs),
    and an oracle taken from plain decoding alone would then accept nothing."""
    from phases.common.engines import SharedContext, make_engine
    from serving.device.select import DTYPES, pick_device
    from serving.model.presets import random_model

    dev = pick_device(device)
    cuda = dev.type == "cuda"
    dtype = DTYPES["bf16" if cuda else "fp32"]
    backend = "kernel" if cuda else "reference"
    model = random_model(preset, dev, dtype, seed, num_nextn_predict_layers=1)
    gen = torch.Generator().manual_seed(seed + 1)
    metrics: dict[str, float] = {}
    for context in contexts:
        tag = f"{context // 1024}k" if context % 1024 == 0 else f"{round(context / 1000)}k" if context >= 1000 else str(context)
        prefix = torch.randint(0, model.cfg.vocab_size, (context - 1,), generator=gen).tolist()
        suffix = [int(torch.randint(0, model.cfg.vocab_size, (1,), generator=gen))]
        room = max_new_tokens + (depth + 1) * (width + 2) + 64
        pool = model.new_pool(2 * context + 2 * room + 1024, dtype, max_requests=4, max_context=context + room)
        # buckets for the request's steps and its drafter's chains (one entry per chain)
        buckets = tuple(1 << i for i in range(max(1, width - 1).bit_length() + 1))
        options = dict(cuda_graphs=cuda, graph_batch_sizes=buckets, prefill_chunk=prefill_chunk, eos_token_ids=())
        builder = make_engine(model, pool, backend, MTPDrafter(width, depth), **options)  # writes the module's rows too
        t0 = time.perf_counter()
        shared = SharedContext(builder, prefix)
        metrics[f"prefill_s_{tag}"] = time.perf_counter() - t0
        print(f"{tag}: prefill {metrics[f'prefill_s_{tag}']:.1f} s", file=sys.stderr, flush=True)
        plain_tokens: list[int] = []
        for a in (False, *accepted):
            name = "plain" if a is False else f"mtp_{'all' if a is None else a}"
            futures = plain_tokens
            for attempt in range(1 if a is False else passes):
                drafter = None if a is False else AcceptAllMTP(width, depth, {}, a)
                engine = make_engine(model, pool, backend, drafter, **options)
                req = shared.start(engine, suffix, max_new_tokens)
                if drafter is not None:
                    drafter.futures[req.req_id] = futures
                engine.prefill(req)
                tok_s, per_step = _decode(engine, req)
                output = list(req.output)
                pool.release_request(req.req_id)
                del engine
                print(f"{tag} {name} (pass {attempt + 1}): {tok_s:.1f} tok/s, {per_step:.2f} tokens per step",
                      file=sys.stderr, flush=True)
                if output == futures:
                    break  # its own stream: every draft the oracle chose was the target's choice
                futures = output
            metrics[f"{name}_tok_s_{tag}"] = tok_s
            if a is False:
                plain_tokens = output
                continue
            metrics[f"{name}_tokens_per_step_{tag}"] = per_step
            metrics[f"{name}_ratio_{tag}"] = tok_s / metrics[f"plain_tok_s_{tag}"]
            metrics[f"{name}_passes_{tag}"] = attempt + 1
            metrics[f"{name}_self_consistent_{tag}"] = float(output == futures)
            metrics[f"{name}_mismatched_tokens_{tag}"] = sum(x != y for x, y in zip(output, plain_tokens)) + abs(
                len(output) - len(plain_tokens))
        shared.release()
        metrics["leaked_slots"] = metrics.get("leaked_slots", 0) + pool.leaked_slots()
        del pool, builder, shared
        if cuda:
            torch.cuda.empty_cache()
    return metrics


def _decode(engine, req) -> tuple[float, float]:
    """(tokens/s, tokens per step) of ``req``'s decode after its prefill, past its first two
    steps: each step timed on the host until the device finished it (what a user waits)."""
    cuda = engine.model.device.type == "cuda"
    times, emitted = [], []
    while not req.finished:
        before = len(req.output)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.step([req])
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        emitted.append(len(req.output) - before)
    if req.error:
        raise RuntimeError(f"request {req.req_id} failed: {req.error}")
    times, emitted = (times[2:], emitted[2:]) if len(times) > 3 else (times, emitted)
    return sum(emitted) / sum(times), sum(emitted) / len(emitted)


if __name__ == "__main__":
    from phases.common.engines import main_with_json_args

    main_with_json_args(measure, __doc__)
