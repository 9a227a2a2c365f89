"""Drafters: propose a draft tree per request for one verify step.

- ``LayerSkipDrafter``: the target's first ``layers`` layers with its embeddings, final norm
  and head (a smaller model of the same family). It reads the target's own pool rows for
  those layers, so it needs no cache of its own: only scratch slots for the draft tokens,
  freed before the verify step.
- ``NgramDrafter``: prompt lookup; continuations of the latest earlier occurrences of the
  history's last n-gram.
- ``MTPDrafter``: DeepSeek's multi-token-prediction module, the draft model the checkpoints
  ship: its first level is computed by the target's own steps (``serving.speculation.mtp``), deeper
  levels by chain steps of the module alone.

A tree of ``width x depth`` is ``width`` chains of ``depth`` tokens below the root (merged
where they share a prefix), at most 63 drafts so root + drafts fit the kernel's T <= 64.

The seam (``Drafter``): a drafter reads the requests' token histories (``DraftRequest``) and,
through ``DraftContext``, runs device steps of its own on the model runner over pool rows it
allocates and frees itself; it returns one ``DraftTree`` (token ids and parents) per request.
It declares the device steps it issues (``draft_steps``) and how wide its trees get
(``max_drafts``), so ``serving.graphs`` can capture them without knowing its class.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from serving.kv.batch import StepBatch, StepEntry, StepShape
from serving.kv.pool import PoolExhausted
from serving.speculation.chain_ahead import ChainAhead, shift_by_acceptance
from serving.speculation.mtp import MAX_MTP_WIDTH
from serving.speculation.ngram_index import NgramIndex, NgramIndexes
from serving.speculation.tree import MAX_DRAFT_TOKENS, DraftTree, pending

if TYPE_CHECKING:
    from serving.engine.model_runner import ModelRunner, StepOutputs
    from serving.kv.pool import KVPool


class DraftRequest(Protocol):
    """What a drafter reads of a request: its id (its slot-table row), its token history (prompt
    and output, or both as one new list) and the latest token (the next step's root, not cached
    yet)."""

    @property
    def req_id(self) -> int: ...

    @property
    def prompt(self) -> list[int]: ...

    @property
    def output(self) -> list[int]: ...

    @property
    def tokens(self) -> list[int]: ...

    @property
    def last_token(self) -> int: ...


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may use for one proposal: the model runner (its steps run the target's
    layers or the drafter's own; graph replay where captured), the pool (scratch slots, its own
    KV rows: allocated and freed by the drafter) and the model's sizes."""

    runner: "ModelRunner"

    @property
    def pool(self) -> "KVPool":
        return self.runner.pool

    @property
    def num_layers(self) -> int:
        return self.runner.model.num_layers

    @property
    def vocab_size(self) -> int:
        return self.runner.model.cfg.vocab_size


@dataclass(frozen=True)
class DraftStep:
    """One kind of device step a drafter issues through ``DraftContext.runner``: its shape, the
    new slots per entry at most (``tail``) and how many times one step may read a live slot
    (``copies``: chains of one request each read its prefix). ``serving.graphs`` captures one
    graph per draft step and bucket."""

    name: str
    shape: StepShape
    tail: int
    copies: int = 1


class Drafter(Protocol):
    """Proposes a draft tree per request for one verify step.

    max_drafts: the most draft tokens of one tree (the verify step is 1 + max_drafts wide).
    fused_topk: the top tokens of the model's MTP module that every target step computes
        after each request's last token (``StepBatch.mtp == "after"``); 0: none.
    draft_steps(num_layers): the device steps ``propose`` issues on a model of that depth.
    propose(ctx, requests): one tree per request, in order; every slot it allocated is freed
    (or kept as its own rows) before it returns.
    Optional, ``launch_ahead(ctx, outputs) -> bool``: called by the engine with a verify step's
    outputs still on the device (``serving.engine.model_runner.StepOutputs``), before the host
    reads them; a drafter may queue the next proposal's device step there (``MTPDrafter``).
    """

    max_drafts: int
    fused_topk: int

    def draft_steps(self, num_layers: int) -> list[DraftStep]: ...

    def propose(self, ctx: DraftContext, requests: Sequence[DraftRequest]) -> list[DraftTree]: ...


def fused_topk(drafter: Drafter | None) -> int:
    """``drafter.fused_topk``; 0 for none, and for a drafter written before the attribute (it
    rides on no target step)."""
    return int(getattr(drafter, "fused_topk", 0) or 0) if drafter is not None else 0


def check_drafter(drafter: Drafter | None, cfg) -> None:
    """ValueError when ``drafter`` cannot serve a model of config ``cfg`` (a ``ModelConfig``): its
    device steps on the model's depth (``draft_steps``), and the MTP module it rides on."""
    if drafter is None:
        return
    drafter.draft_steps(cfg.num_hidden_layers)
    if fused_topk(drafter) and not cfg.has_mtp:
        raise ValueError(f"Expected a model with an MTP module (num_nextn_predict_layers >= 1 and its model.layers."
                         f"{cfg.num_hidden_layers}.* tensors) for an mtp: drafter, got one without; use tree:WxD or ngram:WxD")


def _check_shape(width: int, depth: int) -> None:
    if width < 1 or depth < 1 or width * depth > MAX_DRAFT_TOKENS:
        raise ValueError(f"Expected a tree of width x depth with 1 <= width * depth <= {MAX_DRAFT_TOKENS}, got {width}x{depth}")


class NgramDrafter:
    """Prompt-lookup drafts: for n = max_n .. min_n, the latest ``width`` earlier occurrences of
    the last n tokens, each continued for up to ``depth`` tokens. Each request's n-grams are
    indexed as its history grows (``serving.speculation.ngram_index``): a step costs its new tokens."""

    def __init__(self, width: int = 4, depth: int = 4, max_n: int = 3, min_n: int = 1) -> None:
        _check_shape(width, depth)
        if not 1 <= min_n <= max_n:
            raise ValueError(f"Expected 1 <= min_n <= n for the n-gram drafter, got n={max_n}, min_n={min_n}")
        self.width, self.depth, self.max_n, self.min_n = width, depth, max_n, min_n
        self.max_drafts = min(width * depth, MAX_DRAFT_TOKENS)
        self.fused_topk = 0
        self.indexes = NgramIndexes(min_n, max_n)

    def draft_steps(self, num_layers: int) -> list[DraftStep]:
        return []  # host lookups only

    def paths(self, history: list[int]) -> list[list[int]]:
        """The continuations of one history (a fresh index: for a one-off lookup)."""
        index = NgramIndex(self.min_n, self.max_n)
        index.extend(history)
        return index.continuations(self.width, self.depth)

    def propose(self, ctx: DraftContext, requests: Sequence[DraftRequest]) -> list[DraftTree]:
        return [DraftTree.from_paths(self.indexes.synced(r.req_id, r.prompt, r.output).continuations(self.width, self.depth))
                for r in requests]


class LayerSkipDrafter:
    """Drafts with the target's first ``layers`` layers: top-``width`` first tokens, each extended
    greedily to ``depth`` tokens. If the pool cannot hold the scratch rows, drafts nothing."""

    def __init__(self, width: int = 4, depth: int = 4, layers: int = 1) -> None:
        _check_shape(width, depth)
        if layers < 1:
            raise ValueError(f"Expected layers >= 1 for the layer-skip drafter, got {layers}")
        self.width, self.depth, self.layers = width, depth, layers
        self.max_drafts = min(width * depth, MAX_DRAFT_TOKENS)
        self.fused_topk = 0

    def draft_steps(self, num_layers: int) -> list[DraftStep]:
        if self.layers > num_layers:
            raise ValueError(f"Expected layers=K with K <= the model's {num_layers} layers for tree speculation, "
                             f"got layers={self.layers}")
        layers = self.layers
        return [DraftStep("draft-first", StepShape("decode", layers, 1, self.width, False), tail=1),
                DraftStep("draft", StepShape("decode", layers, 1, 0, False), tail=self.depth, copies=self.width)]

    def propose(self, ctx: DraftContext, requests: Sequence[DraftRequest]) -> list[DraftTree]:
        pool, table, runner = ctx.pool, ctx.pool.table, ctx.runner
        layers = min(self.layers, ctx.num_layers)
        width = min(self.width, ctx.vocab_size)
        per_request = 1 + width * (self.depth - 1)
        try:
            scratch = pool.alloc(per_request * len(requests))
        except PoolExhausted:
            return [DraftTree() for _ in requests]
        try:
            roots = scratch[: len(requests)]
            branch_slots = [[scratch[len(requests) + (b * width + w) * (self.depth - 1) + j] for j in range(self.depth - 1)]
                            for b in range(len(requests)) for w in range(width)]
            rows = [table.row(r.req_id) for r in requests]
            lengths = [table.length(r.req_id) for r in requests]
            first_step = StepBatch("decode", [StepEntry(row, n, [root], [r.last_token], [n])
                                              for row, n, root, r in zip(rows, lengths, roots, requests)],
                                   num_layers=layers, topk=width)
            first = runner.run(first_step).topk
            chains = [[first[b][0][w]] for b in range(len(requests)) for w in range(width)]
            for step in range(1, self.depth):
                owners = [i // width for i in range(len(chains))]
                batch = StepBatch("decode", [
                    StepEntry(rows[o], lengths[o], [roots[o]] + branch_slots[i][:step], [chains[i][-1]], [lengths[o] + step])
                    for i, o in enumerate(owners)
                ], num_layers=layers)
                nxt = runner.run(batch).pred
                for c, t in zip(chains, nxt):
                    c.append(t[0])
        finally:
            pool.free(scratch)
        return [DraftTree.from_paths(chains[b * width : (b + 1) * width]) for b in range(len(requests))]


class MTPDrafter:
    """Drafts with the model's MTP module: the top-``width`` tokens after the request's last
    one (from the target's previous step), each chained greedily to ``depth`` tokens by the
    module re-fed its own output state (SGLang's NextN; ``width`` 1 is its chain). If the pool
    cannot hold the chains' scratch rows, drafts only the first level. ``ahead``: the chain step
    of the next proposal is launched behind the verify step where it can be
    (``launch_ahead``, ``serving.speculation.chain_ahead``); False: after the read only."""

    def __init__(self, width: int = 1, depth: int = 3, ahead: bool = True) -> None:
        _check_shape(width, depth)
        if width > MAX_MTP_WIDTH:
            raise ValueError(f"Expected an MTP tree of width <= {MAX_MTP_WIDTH}, got mtp:{width}x{depth}")
        self.width, self.depth = width, depth
        self.max_drafts = width * depth
        self.fused_topk = width
        self.ahead = ahead  # launch the chain step behind the verify step (serving.speculation.chain_ahead)
        self._launched: ChainAhead | None = None
        self.launches_ahead = 0  # chain steps launched behind a verify step
        self.proposals_ahead = 0  # proposals that took them

    def launch_ahead(self, ctx: DraftContext, outputs: "StepOutputs") -> bool:
        """Queue the next proposal's chain step behind the verify step of ``outputs`` (not read
        yet), its lengths and first tokens taken from that step on the device
        (``serving.speculation.chain_ahead``); True when launched. Not where the chain step's
        capture plans on the host, nor when the pool cannot hold its scratch rows."""
        self._launched = None
        step, chain = outputs.step, self.depth - 1
        if not self.ahead or chain == 0 or step.mtp != "after":
            return False
        width = min(self.width, outputs.shape.topk)
        owners = [b for b in range(len(step.entries)) for _ in range(width)]
        pool, runner = ctx.pool, ctx.runner
        try:
            scratch = pool.alloc(len(owners) * chain)
        except PoolExhausted:
            return False
        try:
            entries = step.entries
            draft = StepBatch("verify", [
                StepEntry(entries[o].row, entries[o].prefix_len, scratch[i * chain : (i + 1) * chain], [0] * chain,
                          list(range(entries[o].prefix_len, entries[o].prefix_len + chain)), list(range(-1, chain - 1)),
                          hidden_src=entries[o].row)
                for i, o in enumerate(owners)
            ], mtp="chain")
            choices = [i % width for i in range(len(owners))]
            # None where the chain's bucket plans on the host: a host plan would be of the old lengths.
            source = runner.launch(draft, adjust=shift_by_acceptance(outputs, owners, choices, chain), or_none=True)
        finally:
            pool.free(scratch)
        if source is None:
            return False
        self._launched = ChainAhead(source, runner, runner.generation, {e.row: b * width for b, e in enumerate(step.entries)},
                                    chain)
        self.launches_ahead += 1
        return True

    def draft_steps(self, num_layers: int) -> list[DraftStep]:
        if self.depth == 1:
            return []  # the first level comes with the target's steps
        chain = self.depth - 1
        return [DraftStep("mtp-chain", StepShape("verify", None, chain, 0, False, "chain"), tail=chain, copies=self.width)]

    def propose(self, ctx: DraftContext, requests: Sequence[DraftRequest]) -> list[DraftTree]:
        pool, table, runner = ctx.pool, ctx.pool.table, ctx.runner
        rows = [table.row(r.req_id) for r in requests]
        firsts = [runner.mtp.candidates.get(row, [])[: self.width] for row in rows]
        launched, self._launched = self._launched, None
        if launched is not None and launched.serves(runner, rows):
            self.proposals_ahead += 1
            trees = [DraftTree.from_paths(launched.paths(row, first)) for row, first in zip(rows, firsts)]
            for tree in trees:
                tree.source = launched.source
            return trees
        owners = [b for b, first in enumerate(firsts) for _ in first]
        chain = self.depth - 1
        if chain == 0 or not owners:
            return [DraftTree.from_paths([[t] for t in first]) for first in firsts]
        try:
            scratch = pool.alloc(len(owners) * chain)
        except PoolExhausted:
            return [DraftTree.from_paths([[t] for t in first]) for first in firsts]
        try:
            lengths = [table.length(r.req_id) for r in requests]
            firsts_flat = [t for first in firsts for t in first]
            step = StepBatch("verify", [
                StepEntry(rows[o], lengths[o], scratch[i * chain : (i + 1) * chain], [t] + [0] * (chain - 1),
                          list(range(lengths[o], lengths[o] + chain)), list(range(-1, chain - 1)), hidden_src=rows[o])
                for i, (o, t) in enumerate(zip(owners, firsts_flat))
            ], mtp="chain")
            # Not read: the verify step takes the drafts from the device (tree.pending); the scratch
            # slots' rows are written before the verify step's own, which is queued behind.
            source = runner.launch(step)
        finally:
            pool.free(scratch)
        paths: list[list[list[int]]] = [[] for _ in requests]
        for i, (o, t) in enumerate(zip(owners, firsts_flat)):
            # row j of a chain drafted the token after its own
            paths[o].append([t] + [pending(i * chain + j) for j in range(chain)])
        trees = [DraftTree.from_paths(p) for p in paths]
        for tree in trees:
            tree.source = source
        return trees


_SPEC = re.compile(r"^(tree|ngram|mtp):(\d+)x(\d+)(?::(\w+)=(\d+))?$")


def parse_speculate(spec: str | None) -> Drafter | None:
    """``tree:WxD[:layers=K]`` (layer-skip drafter), ``ngram:WxD[:n=N]`` or ``mtp:WxD`` (the
    model's MTP module); None or "none": no drafter."""
    if spec in (None, "", "none"):
        return None
    m = _SPEC.match(spec)
    if not m:
        raise ValueError(f"Expected --speculate tree:WxD[:layers=K], ngram:WxD[:n=N] or mtp:WxD, got {spec!r}")
    kind, width, depth, key, value = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4), m.group(5)
    if kind == "mtp":
        if key is not None:
            raise ValueError(f"Expected no option for mtp speculation (mtp:WxD), got {key}")
        return MTPDrafter(width, depth)
    if kind == "tree":
        if key not in (None, "layers"):
            raise ValueError(f"Expected option layers=K for tree speculation, got {key}")
        return LayerSkipDrafter(width, depth, int(value) if value else 1)
    if key not in (None, "n"):
        raise ValueError(f"Expected option n=N for ngram speculation, got {key}")
    return NgramDrafter(width, depth, int(value) if value else 3)
