"""Which steps a captured graph serves, and the sizes of its static buffers (pure; no device).

A *family* is a kind of step an engine issues, with what it computes fixed (``StepShape``):
the target's decode step, its verify step of at most ``width`` tokens per entry, and a
layer-skip drafter's two step kinds; with sampling, the target's two again as sampled steps
(``StepBatch.sample``: a step with any sampled request). A *key* is a family at one bucket batch size: one graph.
A step runs on the smallest captured bucket of its family that holds it, padded (see
``serving.kv.batch``); a step no bucket holds runs eagerly.

Decisions:
- Buckets are batch sizes (SGLang's ``cuda_graph_bs``: 1, 2, 4, ..., 256 by default); the
  width of a family is fixed by its drafter (``1 + width * depth`` tokens for a tree), so one
  graph per (family, batch size) covers every tree the drafter can propose.
- Static sizes are upper bounds that hold for any lengths: tails are per-entry bounds, and
  ``kv_indices`` holds every live slot once per copy a family reads (a drafter's chains each
  read their request's whole prefix), capped by ``batch * max_context``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from serving.kv.batch import StepBatch, StepEntry, StepLayout, StepShape
from serving.speculation.drafters import Drafter, fused_topk
from serving.speculation.tree import MAX_VERIFY_TOKENS

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class StepFamily:
    """A kind of step: its shape, the tail slots per entry at most, how many times a step may
    read each live slot (``copies``), and whether it is a drafter's step (``draft``: its plan
    decides only drafts, which the verify step checks)."""

    name: str
    shape: StepShape
    tail: int
    copies: int = 1
    draft: bool = False

    def serves(self, step: StepBatch) -> bool:
        return (step.kind, step.num_layers, step.topk, step.accept, step.mtp, step.sample) == (
            self.shape.kind, self.shape.num_layers, self.shape.topk, self.shape.accept, self.shape.mtp, self.shape.sample
        ) and step.max_tokens <= self.shape.width and max(len(e.tail) for e in step.entries) <= self.tail


@dataclass(frozen=True)
class GraphKey:
    """One captured graph: a family at a bucket batch size."""

    family: StepFamily
    batch: int

    def layout(self, pool_slots: int, max_context: int) -> StepLayout:
        w = self.family.shape.width
        tails = self.batch * self.family.tail
        kv = min(self.batch * max_context, self.family.copies * pool_slots) + tails
        return StepLayout(batch=self.batch, tokens=self.batch * w, tails=tails, mask=self.batch * w * w, width=w, kv=kv,
                          sampled=self.batch * w if self.family.shape.sample else 0)

    def describe(self) -> str:
        return f"{self.family.name}[b{self.batch}]"


def families_for(drafter: Drafter | None, num_layers: int, sample: bool = False) -> list[StepFamily]:
    """The step families an engine with ``drafter`` issues: the target's decode step, its verify
    step as wide as the drafter's trees (``Drafter.max_drafts``), and the drafter's own steps
    (``Drafter.draft_steps``); with ``sample``, the target's steps once more as sampled steps."""
    if drafter is None:
        out = [StepFamily("decode", StepShape("decode", None, 1, 0, True), tail=1)]
    else:
        fused = fused_topk(drafter)  # the MTP module's first level, computed by the target's steps
        mtp = "after" if fused else ""
        out = [StepFamily("decode", StepShape("decode", None, 1, fused, True, mtp), tail=1)]
        width = 1 + min(drafter.max_drafts, MAX_VERIFY_TOKENS - 1)
        out.append(StepFamily("verify", StepShape("verify", None, width, fused, True, mtp), tail=width))
    if sample:
        out += [StepFamily(f.name + "-sampled", replace(f.shape, sample=True), f.tail, f.copies) for f in list(out)]
    if drafter is not None:
        out += [StepFamily(d.name, d.shape, d.tail, d.copies, draft=True) for d in drafter.draft_steps(num_layers)]
    return out


def keys_for(families: list[StepFamily], batch_sizes=DEFAULT_BATCH_SIZES) -> list[GraphKey]:
    """Every (family, batch size), the largest first (capture order: later graphs reuse the
    memory pool the larger ones grew)."""
    keys = [GraphKey(f, b) for f in families for b in sorted(set(batch_sizes))]
    return sorted(keys, key=lambda k: -k.batch * k.family.shape.width)


def key_for(step: StepBatch, layouts: list[tuple[GraphKey, StepLayout]]) -> GraphKey | None:
    """The smallest key that serves ``step`` (None: run it eagerly). ``layouts``: each captured
    key with its layout, made once (this runs on every step's host path)."""
    need = StepLayout.exact(step)
    best = None
    for key, layout in layouts:
        if key.batch >= need.batch and (best is None or key.batch < best.batch) and key.family.serves(step) \
                and layout.covers(need):
            best = key
    return best


def placeholder_step(key: GraphKey) -> StepBatch:
    """The step a graph is captured with: ``key.batch`` entries of ``width`` tokens on the
    padding row and slot 0 (so capture writes nothing live), as wide as the bucket allows."""
    shape = key.family.shape
    w = shape.width
    parents = [-1] + [t - 1 for t in range(1, w)] if shape.kind == "verify" else None
    entries = [StepEntry(0, 0, [0] * max(w, key.family.tail), [0] * w, list(range(w)), parents) for _ in range(key.batch)]
    return StepBatch(shape.kind, entries, num_layers=shape.num_layers, topk=shape.topk, accept=shape.accept, mtp=shape.mtp,
                     sample=shape.sample)
