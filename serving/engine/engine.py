"""The generation loop: chunked prefill, then plain decode or tree-speculative verify steps.

Decisions:
- Every step after prefill is one forward over the batch: each request contributes its last
  emitted token (the root, not cached yet) plus its draft tree. Without drafts that is a
  decode step (T_b = 1); otherwise a verify step with the tree mask.
- Root and drafts are written to freshly allocated slots. After greedy acceptance the root's
  and the accepted drafts' slots are appended to the request's slot list in path (= position)
  order and every other slot goes back to the pool at once.
- A request that cannot get slots fails with the pool's message and releases everything it
  holds; the other requests of the batch go on.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from serving.engine.attention import AttentionBackend
from serving.engine.batch import build_batch
from serving.engine.drafters import Drafter
from serving.engine.kv_pool import KVPool, PoolExhausted
from serving.engine.model import DeepseekV3Model
from serving.engine.timing import synchronize
from serving.engine.tree import DraftTree, accept_greedy

BF16_MANTISSA_BITS = 7
_REQUEST_IDS = itertools.count(1)  # unique across engines, which may share one pool


def bf16_resolution(x: torch.Tensor) -> torch.Tensor:
    """One bf16 ulp at |x| (the spacing of bf16 numbers there): 2^(floor(log2|x|) - 7)."""
    return torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(1e-30))) - BF16_MANTISSA_BITS)


@dataclass
class Request:
    """One generation request and its outcome.

    output: emitted tokens; error: why it failed (None when it finished); margins: per emitted
    token, the top-1 minus top-2 logit of the row that chose it, and tie_flags: whether that
    gap is under one bf16 ulp of the top logit (when the engine records them).
    """

    req_id: int
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    error: str | None = None
    finished: bool = False
    verify_steps: int = 0
    accepted_drafts: int = 0
    margins: list[float] = field(default_factory=list)
    tie_flags: list[bool] = field(default_factory=list)
    near_ties: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


@dataclass
class StepStats:
    """Totals over the steps after prefill; attention_s counts every attention call of a step
    (the drafter's included) when the engine profiles."""

    steps: int = 0
    step_s: float = 0.0
    attention_s: float = 0.0
    emitted: int = 0
    accepted_drafts: int = 0
    request_steps: int = 0
    prefill_s: float = 0.0
    prefill_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.emitted / self.step_s if self.step_s else 0.0

    @property
    def accepted_per_step(self) -> float:
        """Mean accepted drafts per request per step."""
        return self.accepted_drafts / self.request_steps if self.request_steps else 0.0

    @property
    def attention_share(self) -> float:
        return self.attention_s / self.step_s if self.step_s else 0.0


class Engine:
    """Greedy generation over one model, pool and attention backend.

    drafter: None for plain greedy decoding; prefill_chunk: prompt tokens per prefill forward;
    eos_token_id: one id or several; a request stops after emitting any of them (kept in its output);
    record_margins: keep each emitted token's top-two logit gap (the greedy gate's tie check);
    profile: time the attention calls (CUDA events) to report attention's share of a step.
    """

    def __init__(
        self,
        model: DeepseekV3Model,
        pool: KVPool,
        backend: AttentionBackend,
        drafter: Drafter | None = None,
        prefill_chunk: int = 8192,
        eos_token_id: int | Iterable[int] | None = None,
        record_margins: bool = False,
        profile: bool = False,
    ) -> None:
        self.model, self.pool, self.backend, self.drafter = model, pool, backend, drafter
        self.prefill_chunk = prefill_chunk
        self.eos_token_ids = frozenset([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id or ())
        self.record_margins = record_margins
        self.profile = profile
        self.stats = StepStats()

    # ---- requests ----------------------------------------------------------------------

    def add_request(self, prompt: list[int], max_new_tokens: int) -> Request:
        return Request(next(_REQUEST_IDS), [int(t) for t in prompt], int(max_new_tokens))

    def _fail(self, req: Request, message: str) -> None:
        req.error = message
        req.finished = True
        self.pool.release_request(req.req_id)

    def _finish(self, req: Request) -> None:
        req.finished = True
        self.pool.release_request(req.req_id)

    def _emit(self, req: Request, tokens: list[int], rows: torch.Tensor | None = None) -> None:
        room = req.max_new_tokens - len(req.output)
        tokens = tokens[:room]
        stop = next((k for k, t in enumerate(tokens) if t in self.eos_token_ids), None)
        if stop is not None:
            tokens = tokens[: stop + 1]
        req.output.extend(tokens)
        if rows is not None:
            top = rows[: len(tokens)].topk(2, dim=-1).values
            gaps = (top[:, 0] - top[:, 1]).tolist()
            tol = bf16_resolution(top[:, 0]).tolist()
            req.margins.extend(gaps)
            flags = [g < t for g, t in zip(gaps, tol)]
            req.tie_flags.extend(flags)
            req.near_ties += sum(flags)
        if len(req.output) >= req.max_new_tokens or (req.output and req.output[-1] in self.eos_token_ids):
            self._finish(req)

    # ---- prefill -----------------------------------------------------------------------

    def prefill(self, req: Request, progress: Callable[[int, int], None] | None = None) -> None:
        """Cache the prompt in chunks and emit the first token; on failure set ``req.error``."""
        n = len(req.prompt)
        if n == 0:
            return self._fail(req, "Expected a prompt of at least one token, got an empty prompt")
        if req.max_new_tokens < 1:
            return self._fail(req, f"Expected max_new_tokens >= 1, got {req.max_new_tokens}")
        vocab = self.model.cfg.vocab_size
        bad = next((t for t in req.prompt if not 0 <= t < vocab), None)
        if bad is not None:
            return self._fail(req, f"Expected prompt token ids in [0, {vocab}), got {bad}")
        if n + 1 > self.pool.allocator.capacity:
            return self._fail(req, f"Expected a prompt shorter than the pool ({self.pool.allocator.capacity} slots), got {n} tokens")
        t0 = time.perf_counter()
        logits = None
        cached = len(self.pool.table.slots(req.req_id)) if req.req_id in self.pool.table else 0
        if cached >= n:
            return self._fail(req, f"Expected fewer cached tokens than the prompt's {n}, got {cached}")
        for start in range(cached, n, self.prefill_chunk):
            end = min(n, start + self.prefill_chunk)
            try:
                slots = self.pool.alloc(end - start)
            except PoolExhausted as exc:
                return self._fail(req, str(exc))
            prefix = self.pool.table.device_slots(req.req_id) if req.req_id in self.pool.table else []
            self.pool.table.append(req.req_id, slots)
            batch = build_batch("extend", [req.prompt[start:end]], [list(range(start, end))], [prefix], [slots], None, self.model.device)
            rows = torch.tensor([end - start - 1], device=self.model.device) if end == n else torch.empty(0, dtype=torch.long, device=self.model.device)
            logits = self.model.forward(batch, self.pool, self.backend, logits_rows=rows)
            if progress is not None:
                progress(end, n)
        synchronize(self.model.device)
        self.stats.prefill_s += time.perf_counter() - t0
        self.stats.prefill_tokens += n - cached
        self._emit(req, [int(logits[0].argmax())], logits if self.record_margins else None)

    def fork_prefix(self, req: Request, source_slots: list[int]) -> None:
        """Start ``req`` with a copy of rows already cached for its first ``len(source_slots)``
        prompt tokens (a shared long context); ``prefill`` then computes only the rest.

        Raises PoolExhausted (nothing allocated) when the copy does not fit.
        """
        if req.req_id in self.pool.table:
            raise ValueError(f"Expected a request with no cached rows, got request {req.req_id} with some")
        if len(source_slots) >= len(req.prompt):
            raise ValueError(f"Expected a shared prefix shorter than the prompt ({len(req.prompt)}), got {len(source_slots)}")
        slots = self.pool.alloc(len(source_slots))
        src = torch.tensor(source_slots).to(self.pool.kv.device)
        dst = torch.tensor(slots).to(self.pool.kv.device)
        self.pool.kv[:, dst] = self.pool.kv[:, src]
        self.pool.table.append(req.req_id, slots)

    # ---- decode / verify ---------------------------------------------------------------

    def step(self, requests: list[Request]) -> None:
        """One decode or verify step over the unfinished ``requests``."""
        live = [r for r in requests if not r.finished]
        if not live:
            return
        device = self.model.device
        self.backend.timer.enabled = self.profile
        self.backend.timer.reset()
        synchronize(device)
        t0 = time.perf_counter()
        trees = self.drafter.propose(self, live) if self.drafter is not None else [DraftTree() for _ in live]
        entries = []
        for req, tree in zip(live, trees):
            try:
                slots = self.pool.alloc(1 + len(tree))
            except PoolExhausted as exc:
                self._fail(req, str(exc))
                continue
            entries.append((req, tree, slots))
        if not entries:
            return
        mode = "verify" if any(len(t) for _, t, _ in entries) else "decode"
        tokens, positions, prefix, new, masks = [], [], [], [], []
        for req, tree, slots in entries:
            base = self.pool.table.length(req.req_id)
            tokens.append([req.tokens[-1]] + tree.tokens)
            positions.append([base] + [base + d for d in tree.depths()])
            prefix.append(self.pool.table.device_slots(req.req_id))
            new.append(slots)
            masks.append(tree.verify_mask())
        batch = build_batch(mode, tokens, positions, prefix, new, masks if mode == "verify" else None, device)
        logits = self.model.forward(batch, self.pool, self.backend)
        argmax = logits.argmax(dim=-1).tolist()
        row = 0
        for req, tree, slots in entries:
            n = 1 + len(tree)
            accepted, emitted = accept_greedy(tree, argmax[row : row + n])
            keep = [slots[0]] + [slots[t + 1] for t in accepted]
            self.pool.table.append(req.req_id, keep)
            kept = set(keep)
            self.pool.free([s for s in slots if s not in kept])
            req.verify_steps += 1
            req.accepted_drafts += len(accepted)
            self.stats.accepted_drafts += len(accepted)
            self.stats.request_steps += 1
            before = len(req.output)
            path_rows = None
            if self.record_margins:
                path_rows = logits[[row] + [row + t + 1 for t in accepted]]
            self._emit(req, emitted, path_rows)
            self.stats.emitted += len(req.output) - before
            row += n
        synchronize(device)
        self.stats.step_s += time.perf_counter() - t0
        self.stats.attention_s += self.backend.timer.total_s() if self.profile else 0.0
        self.stats.steps += 1

    def run(self, requests: list[Request], progress: Callable[[int, int], None] | None = None) -> list[Request]:
        """Prefill each request, then step the batch until every request finished or failed."""
        for req in requests:
            if not req.finished:
                self.prefill(req, progress)
        while any(not r.finished for r in requests):
            self.step(requests)
        return requests

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[Request]:
        """Greedy generation for a batch of token-id prompts; see ``Request`` for the results."""
        return self.run([self.add_request(p, max_new_tokens) for p in prompts])
