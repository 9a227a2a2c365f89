"""The generation loop: chunked prefill, then plain decode or tree-speculative verify steps.

Decisions:
- Every step after prefill is one forward over the batch through the model runner: each
  request contributes its last emitted token (the root, not cached yet) plus its draft tree.
  Without drafts that is a decode step (T_b = 1); otherwise a verify step with the tree mask.
- Root and drafts are written to freshly allocated slots. The step accepts drafts greedily on
  the device and writes the root's and the accepted drafts' slots to the request's slot-table
  row in path (= position) order; the host mirrors them and every other slot goes back to
  the pool at once.
- Speculation never fails a request that plain decoding would serve: when the pool (or the
  request's slot-table row) cannot hold a whole tree, the tree is cut to what fits (a prefix
  of a topologically ordered tree is a tree), down to plain decoding.
- A request that cannot get slots fails with the pool's message and releases everything it
  holds; the other requests of the batch go on.
- A drafter that can launch its next draft step behind the verify step (``launch_ahead``) does
  so before the host reads the step; the engine then skips its start-and-end waits for the
  device while that step runs, and a step's wall time runs from its start to its results' read.
- Sampling is per request (``Request.sampling``): a step with any sampled request is a sampled
  step (``StepBatch.sample``: speculative sampling on the device, greedy requests in it as
  greedy), one with none is the greedy step as before. A sampled request without a seed gets
  one when it is added, from the engine's ``seed`` (None: the operating system's randomness),
  so every draw after that is a function of the request alone.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from serving.attention.backends import AttentionBackend
from serving.device.timing import synchronize
from serving.engine.model_runner import ModelRunner, StepOutputs
from serving.kv.batch import StepBatch, StepEntry
from serving.kv.pool import KVPool, PoolExhausted, TableFull
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.sampling.params import GREEDY, SEED_LIMIT, SamplingParams
from serving.speculation.accept import bf16_resolution
from serving.speculation.drafters import DraftContext, Drafter, fused_topk
from serving.speculation.tree import DraftTree

_REQUEST_IDS = itertools.count(1)  # unique across engines, which may share one pool


@dataclass
class Request:
    """One generation request and its outcome.

    sampling: how it chooses tokens (greedy by default; a sampled request has a seed once added).
    output: emitted tokens; error: why it failed (None when it finished); margins: per emitted
    token, the top-1 minus top-2 logit of the row that chose it, and tie_flags: whether that
    gap is at most one bf16 ulp of the top logit (when the engine records them).
    """

    req_id: int
    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingParams = GREEDY
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
        """Prompt and output as one new list (O(context): not for a step's hot path)."""
        return self.prompt + self.output

    @property
    def last_token(self) -> int:
        """The latest token (the next step's root), without copying the context."""
        return self.output[-1] if self.output else self.prompt[-1]


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
    """Generation through one model runner (its model, pool and attention backend).

    Built by ``serving.stack.build_engine`` from a ``ServingConfig``; nothing is attached later.
    drafter: None for plain decoding; prefill_chunk: prompt tokens per prefill forward
    (32768: each chunk re-expands its whole prefix through ``kv_b_proj`` and, on cuDNN, builds an
    attention plan, so fewer chunks cost less; ``limits.estimate`` puts ``dsv3-tp8`` at 185k
    tokens at 32 GiB in all, 28 GiB with 8192-token chunks);
    eos_token_id: one id or several; a request stops after emitting any of them (kept in its output);
    record_margins: keep each emitted token's top-two logit gap (the greedy gate's tie check);
    profile: time the attention calls of eager steps (CUDA events) to report attention's share
    of a step; between_steps: called as ``hook(engine)`` after every step of ``run()``, when no
    step is in flight but a draft step launched ahead (``serving.speculation.chain_ahead``: what a
    hook queues on the stream, a copy into the draft's freed scratch slots too, runs after it)
    (``serving.defrag``'s compaction: a hook may move pool rows and rename slots);
    seed: where the seeds of sampled requests that bring none come from (None: the OS's randomness).
    """

    def __init__(
        self,
        runner: ModelRunner,
        drafter: Drafter | None = None,
        prefill_chunk: int = 32768,
        eos_token_id: int | Iterable[int] | None = None,
        record_margins: bool = False,
        profile: bool = False,
        between_steps: Sequence[Callable[["Engine"], None]] = (),
        seed: int | None = None,
    ) -> None:
        if prefill_chunk < 1:
            raise ValueError(f"Expected prefill_chunk >= 1, got {prefill_chunk}")
        self.runner, self.drafter = runner, drafter
        self.prefill_chunk = prefill_chunk
        self.eos_token_ids = frozenset([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id or ())
        self.record_margins = record_margins
        self.profile = profile
        self.stats = StepStats()
        self.between_steps = tuple(between_steps)
        self._seeds = random.Random(seed) if seed is not None else random.SystemRandom()
        # The MTP drafter's first level rides on the target's steps (serving.speculation.mtp).
        self.mtp_topk = fused_topk(drafter)
        if self.mtp_topk and runner.mtp is None:  # an engine built by hand, past serving.stack's check
            raise ValueError("Expected a model with an MTP module (num_nextn_predict_layers >= 1) for an mtp: drafter, got one without")
        self._mtp = "after" if self.mtp_topk else ""
        self._drafting_ahead = False  # a draft step launched behind the last verify step is in flight

    @property
    def model(self) -> DeepseekV3Model:
        return self.runner.model

    @property
    def pool(self) -> KVPool:
        return self.runner.pool

    @property
    def backend(self) -> AttentionBackend:
        return self.runner.backend

    # ---- requests ----------------------------------------------------------------------

    def add_request(self, prompt: list[int], max_new_tokens: int, sampling: SamplingParams | None = None) -> Request:
        """A new request; a sampled one without a seed gets one from the engine's seed source."""
        sampling = sampling or GREEDY
        if not isinstance(sampling, SamplingParams):
            raise ValueError(f"Expected sampling as SamplingParams, got {type(sampling).__name__}")
        if sampling.samples and sampling.seed is None:
            sampling = dataclasses.replace(sampling, seed=self._seeds.randrange(SEED_LIMIT))
        return Request(next(_REQUEST_IDS), [int(t) for t in prompt], int(max_new_tokens), sampling)

    def _fail(self, req: Request, message: str) -> None:
        req.error = message
        req.finished = True
        self.pool.release_request(req.req_id)

    def _finish(self, req: Request) -> None:
        req.finished = True
        self.pool.release_request(req.req_id)

    def _emit(self, req: Request, tokens: list[int], gaps: list[float] | None = None, ties: list[bool] | None = None) -> None:
        room = req.max_new_tokens - len(req.output)
        tokens = tokens[:room]
        stop = next((k for k, t in enumerate(tokens) if t in self.eos_token_ids), None)
        if stop is not None:
            tokens = tokens[: stop + 1]
        req.output.extend(tokens)
        if gaps is not None:
            req.margins.extend(gaps[: len(tokens)])
            flags = list(ties[: len(tokens)])
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
        table = self.pool.table
        if n + 1 > table.max_context:
            return self._fail(req, f"Expected a prompt shorter than the slot table's max_context ({table.max_context}), got {n} tokens")
        t0 = time.perf_counter()
        logits = None
        try:
            table.add(req.req_id)
        except TableFull as exc:
            return self._fail(req, str(exc))
        cached = table.length(req.req_id)
        if cached >= n:
            return self._fail(req, f"Expected fewer cached tokens than the prompt's {n}, got {cached}")
        for start in range(cached, n, self.prefill_chunk):
            end = min(n, start + self.prefill_chunk)
            try:
                slots = self.pool.alloc(end - start)
            except PoolExhausted as exc:
                return self._fail(req, str(exc))
            entry = StepEntry(table.row(req.req_id), start, slots, req.prompt[start:end], list(range(start, end)),
                              lookahead=req.prompt[end] if end < n else None, sampling=req.sampling)
            logits = self.runner.extend(StepBatch("extend", [entry], logits_rows=[end - start - 1] if end == n else [],
                                                  mtp=self._mtp, topk=self.mtp_topk))
            table.append(req.req_id, slots)
            if progress is not None:
                progress(end, n)
        synchronize(self.model.device)
        self.stats.prefill_s += time.perf_counter() - t0
        self.stats.prefill_tokens += n - cached
        gaps = ties = None
        if self.record_margins:
            top = logits[0].topk(2).values
            gaps, ties = [float(top[0] - top[1])], [bool(top[0] - top[1] <= bf16_resolution(top[0]))]
        if req.sampling.samples:
            first = int(self.runner.first_tokens(logits[:1], [req.sampling], [n - 1])[0])
        else:
            first = int(logits[0].argmax())
        self._emit(req, [first], gaps, ties)

    def fork_prefix(self, req: Request, source_slots: list[int]) -> None:
        """Start ``req`` with a copy of rows already cached for its first ``len(source_slots)``
        prompt tokens (a shared long context); ``prefill`` then computes only the rest.

        Raises PoolExhausted or TableFull (nothing allocated) when the copy does not fit.
        """
        if req.req_id in self.pool.table:
            raise ValueError(f"Expected a request with no cached rows, got request {req.req_id} with some")
        if len(source_slots) >= len(req.prompt):
            raise ValueError(f"Expected a shared prefix shorter than the prompt ({len(req.prompt)}), got {len(source_slots)}")
        if len(source_slots) > self.pool.table.max_context:
            raise TableFull(f"a shared prefix of {len(source_slots)} tokens exceeds the slot table's max_context {self.pool.table.max_context}")
        slots = self.pool.alloc(len(source_slots))
        try:
            self.pool.table.add(req.req_id)
        except TableFull:
            self.pool.free(slots)
            raise
        self.pool.copy_rows(source_slots, slots)
        self.pool.table.append(req.req_id, slots)

    # ---- decode / verify ---------------------------------------------------------------

    def _fitting_tree(self, req: Request, tree: DraftTree, reserve: int = 0) -> DraftTree:
        """``tree`` cut to the slots the pool and the request's row can take (root included),
        leaving ``reserve`` free slots (the roots of the batch's requests after this one)."""
        room = min(self.pool.allocator.num_free - reserve, self.pool.table.max_context - self.pool.table.length(req.req_id)) - 1
        if len(tree) <= room:
            return tree
        return tree.cut(max(0, room))

    def step(self, requests: list[Request]) -> None:
        """One decode or verify step over the unfinished ``requests``."""
        live = [r for r in requests if not r.finished]
        if not live:
            return
        device = self.model.device
        self.backend.timer.enabled = self.profile
        self.backend.timer.reset()
        if not self._drafting_ahead:  # a draft step launched ahead runs on: the host prepares meanwhile
            synchronize(device)
        t0 = time.perf_counter()
        self._drafting_ahead = False
        trees = self.drafter.propose(DraftContext(self.runner), live) if self.drafter is not None else [DraftTree() for _ in live]
        entries = []
        for k, (req, tree) in enumerate(zip(live, trees)):
            if self.pool.table.length(req.req_id) >= self.pool.table.max_context:
                self._fail(req, f"request reached the slot table's max_context ({self.pool.table.max_context} tokens)")
                continue
            tree = self._fitting_tree(req, tree, reserve=len(live) - k - 1)
            try:
                slots = self.pool.alloc(1 + len(tree))
            except PoolExhausted as exc:
                self._fail(req, str(exc))
                continue
            entries.append((req, tree, slots))
        if not entries:
            return
        kind = "verify" if any(len(t) for _, t, _ in entries) else "decode"
        table = self.pool.table
        step_entries = []
        for req, tree, slots in entries:
            base = table.length(req.req_id)
            step_entries.append(StepEntry(
                table.row(req.req_id), base, slots, [req.last_token] + tree.tokens,
                [base] + [base + d for d in tree.depths()],
                [-1] + [0 if p < 0 else p + 1 for p in tree.parents] if kind == "verify" else None,
                sampling=req.sampling,
            ))
        sample = any(req.sampling.samples for req, _, _ in entries)
        # Drafts still on the device (a launched draft step): the verify step takes them there.
        sources = [t.source for _, t, _ in entries if t.has_pending]
        if any(s is not sources[0] for s in sources):
            raise ValueError("Expected the pending drafts of one step to come from one draft step, got trees of several")
        source = sources[0] if sources else None
        result = self.runner.run(StepBatch(kind, step_entries, accept=True, mtp=self._mtp, topk=self.mtp_topk, sample=sample,
                                           device_tokens=source), then=self._launch_ahead)
        for b, (req, tree, slots) in enumerate(entries):
            path = result.path[b]
            keep = [slots[cell] for cell in path]
            table.append(req.req_id, keep, on_device=True)  # the step wrote the device row
            kept = set(keep)
            self.pool.free([s for s in slots if s not in kept])
            accepted = len(path) - 1
            req.verify_steps += 1
            req.accepted_drafts += accepted
            self.stats.accepted_drafts += accepted
            self.stats.request_steps += 1
            emitted = [step_entries[b].tokens[cell] for cell in path[1:]] + [result.bonus[b]]
            before = len(req.output)
            gaps = ties = None
            if self.record_margins:
                gaps = [result.gap[b][cell] for cell in path]
                ties = [result.near_tie[b][cell] for cell in path]
            self._emit(req, emitted, gaps, ties)
            self.stats.emitted += len(req.output) - before
        if not self._drafting_ahead:
            synchronize(device)
        self.stats.step_s += time.perf_counter() - t0
        self.stats.attention_s += self.backend.timer.total_s() if self.profile else 0.0
        self.stats.steps += 1

    def _launch_ahead(self, outputs: StepOutputs) -> None:
        """The verify step's ``then``: the drafter queues its next chain step behind it, where it
        can (``MTPDrafter.launch_ahead``); not while profiling (the attention timers sync)."""
        launch = getattr(self.drafter, "launch_ahead", None)
        if launch is not None and not self.profile:
            self._drafting_ahead = bool(launch(DraftContext(self.runner), outputs))

    def run(self, requests: list[Request], progress: Callable[[int, int], None] | None = None) -> list[Request]:
        """Prefill each request, then step the batch until every request finished or failed."""
        for req in requests:
            if not req.finished:
                self.prefill(req, progress)
        while any(not r.finished for r in requests):
            self.step(requests)
            for hook in self.between_steps:
                hook(self)
        return requests

    def generate(self, prompts: list[list[int]], max_new_tokens: int,
                 sampling: SamplingParams | Sequence[SamplingParams] | None = None) -> list[Request]:
        """Generation for a batch of token-id prompts: greedy, or ``sampling`` (one for every
        prompt, or one per prompt); see ``Request`` for the results."""
        per_prompt = list(sampling) if isinstance(sampling, Sequence) else [sampling] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"Expected one SamplingParams per prompt ({len(prompts)}), got {len(per_prompt)}")
        return self.run([self.add_request(p, max_new_tokens, s) for p, s in zip(prompts, per_prompt)])
