"""The model runner: the seam between the engine and the model (SGLang's ``ModelRunner``).

The engine and the drafters describe a step on the host (``StepBatch``) and get host results
back (``StepResult``); the runner does the rest in two halves:

- ``prepare``: host-side preparation. Pack the step into one host buffer and copy it to the
  device (or into a captured bucket's static buffers), plan the attention (one
  ``MLAVerifyWrapper.plan`` per step), make sure the rope tables cover the positions.
- ``forward_step``: device work only. Build ``kv_indices`` from the slot table, run the model,
  take each row's greedy token (and margin, and the drafter's top-k), accept the drafts
  (greedily, or by speculative sampling in a sampled step) and write the accepted slots to the
  slot table. This is what a CUDA graph captures (``serving.graphs``); eager steps run the same
  function.

Decisions:
- Prefill (``extend``) is always eager: its shapes follow the prompt. A sampled request's first
  token is drawn there (``first_tokens``) with the draw a decode step would use at that position.
- A sampled step (``StepShape.sample``) computes the processed distributions of every row and
  accepts by speculative sampling (``serving.speculation.rejection``); greedy rows of it get
  one-hot distributions, which accept exactly as ``greedy_accept``. A greedy step runs the
  greedy path alone, as it did before sampling existed.
- One result read per step: the integer outputs are packed on the device and copied back in
  one transfer (plus one for the margins), the step's only host sync.
- A drafter's own step may be started without a read (``launch``): its outputs stay on the
  device, the verify step takes its pending drafts from them (``StepBatch.device_tokens``: one
  gather into its input rows, queued behind the draft step) and reads them back with its own
  results. The host prepares the verify step while the device drafts, and a speculative step
  waits for the device once. ``launch`` refuses an accepting step: its results change the
  slot table, which the host must know before the next step.
- An accepting step's ``run`` may take a ``then``: called once the step is queued and its
  results' copy to pinned memory is queued behind it, before the host waits on that copy. The
  MTP drafter queues its next chain step there (``serving.speculation.chain_ahead``), its
  lengths and first tokens shifted on the device by the step's acceptance (``launch``'s
  ``adjust``, only for a capture that plans its attention on the device), so the device drafts
  while the host reads and prepares.
- Graph replay belongs to the runner that captured it: the runner is built with a
  ``replay`` factory (``serving.graphs.CudaGraphs``), calls it once at the end of its own
  construction, and keeps what it returns as ``graphs``; nothing is attached later. That
  replayer serves every decode / verify / draft step its buckets hold; anything else (a batch
  wider than the largest bucket, a backend that cannot be captured, a CPU device) runs eagerly
  through the same ``forward_step``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from serving.attention.backends import AttentionBackend
from serving.kv.batch import (
    ForwardBatch,
    PackedStep,
    StepBatch,
    StepLayout,
    StepShape,
    forward_batch,
)
from serving.kv.indices import build_kv_indices
from serving.kv.pool import KVPool
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.sampling.sampler import columns, processed_probs, sample_rows
from serving.speculation.accept import greedy_accept, row_outputs, write_accepted_slots
from serving.speculation.mtp import MTPState
from serving.speculation.rejection import sampled_accept
from serving.speculation.tree import MAX_VERIFY_TOKENS


@dataclass
class StepResult:
    """Host results of a decode / verify / draft step, per entry.

    pred: the target's greedy token after each new token. gap, near_tie: each row's top-two
    logit gap and whether it is at most one bf16 ulp. topk: each row's top-k ids (drafter).
    n_accepted, path, bonus (``accept``): accepted drafts, the accepted cells in path order
    (root first, then the accepted drafts: indices into the entry's tokens) and the token
    after the last one. mtp_topk (``mtp == "after"``): the MTP module's top tokens after the
    bonus token, per entry.
    """

    pred: list[list[int]]
    gap: list[list[float]]
    near_tie: list[list[bool]]
    topk: list[list[list[int]]] | None = None
    n_accepted: list[int] | None = None
    path: list[list[int]] | None = None
    bonus: list[int] | None = None
    mtp_topk: list[list[int]] | None = None


def pack_outputs(outputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(int64 [pred | n_accepted | bonus | order | topk | mtp_topk | near_tie], float32 gap) on the device."""
    ints = [outputs["pred"]]
    for name in ("n_accepted", "bonus", "order", "topk", "mtp_topk"):
        if name in outputs:
            ints.append(outputs[name].reshape(-1))
    if "near_tie" in outputs:
        ints.append(outputs["near_tie"].to(torch.int64))
    gap = outputs.get("gap", torch.zeros_like(outputs["pred"], dtype=torch.float32))
    return torch.cat(ints), gap.float()


def output_offsets(shape: StepShape, rows: int, batch: int) -> dict[str, int]:
    """Where each integer output of ``pack_outputs`` starts in the packed tensor of a step of
    ``shape`` padded to ``rows`` tokens and ``batch`` entries (``unpack_outputs``' order); an
    output the shape does not compute is absent."""
    at, offsets = rows, {"pred": 0}
    if shape.accept:
        offsets["n_accepted"], offsets["bonus"], offsets["order"] = at, at + batch, at + 2 * batch
        at += 2 * batch + batch * shape.width
    row_topk = shape.topk if shape.mtp != "after" else 0
    if row_topk:
        offsets["topk"] = at
        at += rows * row_topk
    if shape.mtp == "after":
        offsets["mtp_topk"] = at
    return offsets


@dataclass(frozen=True)
class StepOutputs:
    """An accepting step's packed integer outputs on the device, before the host reads them
    (``ModelRunner.run``'s ``then``): ``ints`` (``pack_outputs``), the step's shape and padded
    sizes; ``offset(name)`` says where an output starts (``output_offsets``)."""

    step: StepBatch
    ints: torch.Tensor
    shape: StepShape
    rows: int
    batch: int

    def offset(self, name: str) -> int:
        offsets = output_offsets(self.shape, self.rows, self.batch)
        if name not in offsets:
            raise ValueError(f"Expected an output the step computes ({sorted(offsets)}), got {name!r}")
        return offsets[name]


def unpack_outputs(ints: torch.Tensor, gap: torch.Tensor, step: StepBatch, shape: StepShape, rows: int, batch: int) -> StepResult:
    """Host ``StepResult`` from ``pack_outputs``' tensors (on the CPU) of a step padded to
    ``rows`` tokens and ``batch`` entries."""
    values = ints.tolist()
    gaps = gap.tolist()
    at = 0

    def take(n: int) -> list[int]:
        nonlocal at
        at += n
        return values[at - n : at]

    pred_all = take(rows)
    n_acc = bonus = order = topk = mtp_topk = None
    if shape.accept:
        n_acc, bonus, order = take(batch), take(batch), take(batch * shape.width)
    row_topk = shape.topk if shape.mtp != "after" else 0
    if row_topk:
        topk = take(rows * row_topk)
    if shape.mtp == "after":
        mtp_topk = take(batch * shape.topk)
    ties = take(rows) if len(values) > at else [0] * rows
    result = StepResult([], [], [])
    if row_topk:
        result.topk = []
    if mtp_topk is not None:
        result.mtp_topk = [mtp_topk[b * shape.topk : (b + 1) * shape.topk] for b in range(len(step.entries))]
    if shape.accept:
        result.n_accepted, result.path, result.bonus = [], [], []
    start = 0
    for b, e in enumerate(step.entries):
        t = e.num_tokens
        result.pred.append(pred_all[start : start + t])
        result.gap.append(gaps[start : start + t])
        result.near_tie.append([bool(x) for x in ties[start : start + t]])
        if row_topk:
            result.topk.append([topk[(start + i) * row_topk : (start + i + 1) * row_topk] for i in range(t)])
        if shape.accept:
            result.n_accepted.append(n_acc[b])
            result.path.append(order[b * shape.width : b * shape.width + n_acc[b] + 1])
            result.bonus.append(bonus[b])
        start += t
    return result


class StepReplay(Protocol):
    """Replays captured steps (``serving.graphs.CudaGraphRunner``)."""

    replays: int

    def try_start(self, step: StepBatch) -> tuple[torch.Tensor, torch.Tensor, StepShape, int, int] | None:
        """The step replayed, not read: (``pack_outputs``' tensors, shape, padded rows, padded
        entries); None when no capture holds it."""

    def try_launch(self, step: StepBatch, adjust: Callable[[ForwardBatch], None] | None = None) -> torch.Tensor | None:
        """The step replayed without reading it (``adjust`` applied to its device fields first):
        its rows' tokens (int64 [>= N], on the device); None when no capture holds it."""

    def plans_on_device(self, step: StepBatch) -> bool:
        """Whether the capture that holds ``step`` reads nothing of its lengths from the host."""


class ModelRunner:
    """Runs steps of ``model`` over ``pool`` with ``backend``.

    replay: called once with this runner, after it is ready, to capture its steps; what it
    returns serves the steps it holds (``graphs``). None: every step eager.
    """

    def __init__(self, model: DeepseekV3Model, pool: KVPool, backend: AttentionBackend,
                 replay: Callable[["ModelRunner"], StepReplay] | None = None) -> None:
        if backend.pool is not pool:
            raise ValueError("Expected the attention backend of this runner's pool, got a backend over another pool")
        if pool.kv.shape[0] != model.pool_layers:
            raise ValueError(f"Expected a pool of the model's {model.pool_layers} layers of latent rows, got {pool.kv.shape[0]}")
        self.model, self.pool, self.backend = model, pool, backend
        self.device = model.device
        self.graphs: StepReplay | None = None
        self._pending_read: tuple[StepBatch, list, torch.Tensor] | None = None  # prepare() -> run()
        self.generation = 0  # counts run() and extend() steps: a drafter's launch ahead is for the state after one
        # The MTP module's state between steps (serving.speculation.mtp); None without the module.
        self.mtp = MTPState(pool.table.rows.shape[0], model.cfg.hidden_size, model.dtype, model.device) if model.has_mtp else None
        # Tables for every position a request can reach, once: a captured step cannot grow them.
        model.rope.ensure(pool.table.max_context + MAX_VERIFY_TOKENS)
        if replay is not None:
            self.graphs = replay(self)

    def eager(self) -> "ModelRunner":
        """A runner over the same model, pool and backend that replays nothing (a gate's
        comparison path); it shares this one's state (the MTP module's too), not its graphs."""
        other = ModelRunner(self.model, self.pool, self.backend)
        other.mtp = self.mtp
        return other

    # ---- host side -----------------------------------------------------------------------

    def prepare(self, step: StepBatch, packed: PackedStep | None = None, device_buffer: torch.Tensor | None = None,
                kv_indices: torch.Tensor | None = None) -> ForwardBatch:
        """Pack ``step`` and copy it to the device: into ``packed`` / ``device_buffer`` /
        ``kv_indices`` (a bucket's static buffers) or new exact-size ones. Returns the batch
        whose device fields the forward reads. One host-to-device copy; no sync."""
        if packed is None:
            layout = StepLayout.exact(step)
            packed = PackedStep.allocate(layout, pin=self.device.type == "cuda")
            packed.fill(step)
            device_buffer = packed.host.to(self.device, non_blocking=True)
            kv_indices = torch.empty(max(1, layout.kv), dtype=torch.int32, device=self.device)
        else:
            packed.fill(step)
            device_buffer.copy_(packed.host, non_blocking=True)
        self.model.rope.ensure(max(max(e.positions) for e in step.entries) + 1)  # host only; a no-op in range
        batch = forward_batch(step, packed.views(device_buffer), kv_indices)
        if step.device_tokens is not None:
            self._take_device_tokens(step, batch)
        if self.device.type != "cuda":
            self._build_kv_indices(batch, host=([e.row for e in step.entries], [e.prefix_len for e in step.entries],
                                                [len(e.tail) for e in step.entries]))
        return batch

    def _take_device_tokens(self, step: StepBatch, batch: ForwardBatch) -> None:
        """Gather the step's pending drafts from ``step.device_tokens`` into its input rows and start
        their copy to the host; ``run`` writes them into the entries once the step's results are
        read (the same sync). No host sync here."""
        cells = step.pending_cells()
        if not cells:
            return
        pin = self.device.type == "cuda"
        index = torch.tensor([c[2] for c in cells] + [c[3] for c in cells], dtype=torch.long)
        index = (index.pin_memory() if pin else index).to(self.device, non_blocking=True)
        values = step.device_tokens.index_select(0, index[len(cells):])
        batch.input_ids.index_copy_(0, index[: len(cells)], values)
        host = torch.empty(len(cells), dtype=torch.long, pin_memory=pin)
        host.copy_(values, non_blocking=True)
        self._pending_read = (step, cells, host)

    def _read_pending(self, step: StepBatch) -> None:
        """After ``step``'s results were read (its stream is done): its pending drafts' values."""
        pending, self._pending_read = self._pending_read, None
        if pending is None or pending[0] is not step:
            if step.pending_cells():
                raise RuntimeError("Expected the pending drafts of this step to have been copied by prepare(), got none")
            return
        _, cells, host = pending
        step.take_pending(host.tolist(), cells)

    def build_kv_indices_from_fields(self, batch: ForwardBatch) -> None:
        """On a CPU device, ``kv_indices`` again from the batch's fields as they are now (``prepare``
        built them from the host's values; ``launch``'s ``adjust`` may have changed the lengths)."""
        f = batch.fields
        self._build_kv_indices(batch, host=(f["rows"].tolist(), f["prefix_lens"].tolist(), f["tail_indptr"].diff().tolist()))

    def _build_kv_indices(self, batch: ForwardBatch, host=None) -> None:
        f = batch.fields
        build_kv_indices(self.pool.table.rows, f["rows"], f["prefix_lens"], batch.kv_indptr, f["tail_indptr"], f["tails"],
                         batch.kv_indices, host=host)

    # ---- device side ---------------------------------------------------------------------

    def forward_step(self, batch: ForwardBatch, shape: StepShape) -> tuple[torch.Tensor, torch.Tensor]:
        """The device half of a decode / verify / draft step (capturable on CUDA): returns
        ``pack_outputs``' tensors."""
        f = batch.fields
        if self.device.type == "cuda":
            self._build_kv_indices(batch)
        self.backend.init_forward_metadata_in_step(batch)  # a graph that plans its own attention
        if shape.mtp == "chain":
            return pack_outputs(self._mtp_chain(batch, shape.width))
        if shape.mtp == "after":
            if not shape.accept:
                raise ValueError("Expected an accepting target step to run the MTP module after, got accept=False")
            logits, hidden = self.model.forward(batch, self.pool, self.backend, num_layers=shape.num_layers, return_hidden=True)
        else:
            logits = self.model.forward(batch, self.pool, self.backend, num_layers=shape.num_layers)
        outputs = row_outputs(logits, shape.topk if shape.mtp != "after" else 0)
        if shape.accept and shape.sample:
            probs = processed_probs(logits, f["temperature"], f["top_k"], f["top_p"], f["min_p"])
            outputs.update(sampled_accept(probs, f, shape.width))
        elif shape.accept:
            outputs.update(greedy_accept(outputs["pred"], f, shape.width))
        if shape.accept:
            write_accepted_slots(self.pool.table.rows, f, outputs["order"], outputs["n_accepted"], shape.width)
        if shape.mtp == "after":
            # The module over every row, fed the target's choice after it; its output at each
            # entry's last accepted cell (the bonus token's parent) seeds the next tree.
            state = self._mtp_state()
            last = outputs["order"].gather(1, outputs["n_accepted"][:, None])
            sel = f["grid_rows"].view(-1, shape.width).gather(1, last).squeeze(1)
            after = outputs.pop("next_ids", outputs["pred"])  # the token after each row: sampled steps' own
            mtp_logits, out = self.model.mtp_forward(batch, self.pool, self.backend, hidden, after, logits_rows=sel)
            state.hidden.index_copy_(0, f["rows"], out.index_select(0, sel))
            outputs["mtp_topk"] = mtp_logits.topk(shape.topk, dim=-1).indices
        return pack_outputs(outputs)

    def _mtp_chain(self, batch: ForwardBatch, depth: int) -> dict[str, torch.Tensor]:
        """The MTP module's chains, every level in one step: entry b's ``depth`` rows are one
        chain (a causal tree) whose row 0 holds its first draft and reads the state of its
        request's row (``hidden_src``). Pass k computes every row and hands row j's token and
        output state to row j + 1; after ``depth`` passes each row holds what the module drafts
        after it. A row past the chain's known part writes a latent row that a later pass
        rewrites before anything reads it (the causal mask hides it until then)."""
        state = self._mtp_state()
        f = batch.fields
        n = batch.num_tokens
        ids = batch.input_ids.clone()
        hidden = state.hidden.index_select(0, f["hidden_src"].repeat_interleave(depth)[:n])
        pred = ids
        for _ in range(depth):
            logits, out = self.model.mtp_forward(batch, self.pool, self.backend, hidden, ids)
            pred = logits.argmax(dim=-1)
            if depth > 1:
                ids.view(-1, depth)[:, 1:] = pred.view(-1, depth)[:, :-1]
                hidden.view(-1, depth, hidden.shape[-1])[:, 1:] = out.view(-1, depth, out.shape[-1])[:, :-1]
        return {"pred": pred}

    def _mtp_state(self) -> MTPState:
        if self.mtp is None:
            raise ValueError("Expected a model with an MTP module (num_nextn_predict_layers) for an MTP step, got one without")
        return self.mtp

    def _keep_candidates(self, step: StepBatch, result: StepResult) -> None:
        if step.mtp == "after":
            for e, c in zip(step.entries, result.mtp_topk):
                self.mtp.candidates[e.row] = c

    def first_tokens(self, logits: torch.Tensor, sampling: list, positions: list[int]) -> torch.Tensor:
        """int64 [M] on the device: the token after each of ``logits``' rows (float32 [M, V], a
        prefill's last rows), drawn as a decode step at ``positions`` would draw it with each
        row's ``SamplingParams`` (None or greedy: the argmax)."""
        return sample_rows(logits, **columns(sampling, self.device), position=torch.tensor(positions).to(self.device))

    # ---- steps ---------------------------------------------------------------------------

    def run(self, step: StepBatch, then: Callable[[StepOutputs], None] | None = None) -> StepResult:
        """A decode, verify or draft step; graph replay where a captured bucket holds it.

        then: for an accepting step, called with its outputs on the device after it is queued and
        before the host waits for it (a drafter queues its next draft step behind it there); the
        results are copied out before ``then`` queues anything, so its work does not delay them."""
        if step.kind == "extend":
            raise ValueError("Expected a decode or verify step, got an extend step (use extend())")
        self.generation += 1
        started = self.graphs.try_start(step) if self.graphs is not None else None
        if started is None:
            shape = StepShape.of(step)
            batch = self.prepare(step)
            self.backend.init_forward_metadata(batch)
            ints, gap = self.forward_step(batch, shape)
            started = (ints, gap, shape, batch.num_tokens, batch.batch_size)
        ints, gap, shape, rows, padded_batch = started
        if then is not None and step.accept:
            host_ints, host_gap, copied = self._copy_out(ints, gap)
            then(StepOutputs(step, ints, shape, rows, padded_batch))
            if copied is not None:
                copied.synchronize()
        else:
            host_ints, host_gap = ints.cpu(), gap.cpu()
        result = unpack_outputs(host_ints, host_gap, step, shape, rows, padded_batch)
        if step.device_tokens is not None:
            self._read_pending(step)
        self._keep_candidates(step, result)
        return result

    def _copy_out(self, ints: torch.Tensor, gap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, "torch.cuda.Event | None"]:
        """The step's outputs on their way to the host: pinned copies queued now and the event that
        marks them done (CUDA), or the values themselves (CPU: the step has run)."""
        if self.device.type != "cuda":
            return ints.clone(), gap.clone(), None
        host_ints = torch.empty(ints.shape, dtype=ints.dtype, pin_memory=True)
        host_gap = torch.empty(gap.shape, dtype=gap.dtype, pin_memory=True)
        host_ints.copy_(ints, non_blocking=True)
        host_gap.copy_(gap, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(self.device))
        return host_ints, host_gap, copied

    def plans_on_device(self, step: StepBatch) -> bool:
        """Whether ``step`` would replay from a capture that reads none of its lengths from the host
        (its attention planned inside the graph): the fields it reads may then be changed on the
        device after ``prepare`` (``launch``'s ``adjust``)."""
        return self.graphs is not None and self.graphs.plans_on_device(step)

    def launch(self, step: StepBatch, adjust: Callable[[ForwardBatch], None] | None = None, *,
               or_none: bool = False) -> torch.Tensor | None:
        """A drafter's step started and not read: int64 [>= N] on the device, the token after each of
        its rows (``StepResult.pred``: entries' rows in order, padding after). The tensor holds them
        until the next step of the same bucket runs; read it, or hand it to the verify step as
        ``StepBatch.device_tokens``, before then.

        adjust: device work on the step's fields after they are copied and before the step runs
        (values the host does not know yet, computed from an earlier step's outputs); only for a
        step that ``plans_on_device`` (ValueError otherwise: a host plan would be of the host's
        values; with ``or_none``, None instead, and nothing launched)."""
        if step.kind == "extend" or step.accept:
            raise ValueError(f"Expected a decode or verify step that accepts nothing for launch(), got a {step.kind} step "
                             f"with accept={step.accept} (run() it: its results change the slot table)")
        if adjust is not None:
            pred = self.graphs.try_launch(step, adjust, planned_on_device=True) if self.graphs is not None else None
            if pred is None and not or_none:
                raise ValueError("Expected a step replayed from a capture that plans on the device for launch(adjust=...), "
                                 "got one planned on the host or run eagerly (its plan would be of the host's lengths)")
            return pred
        pred = self.graphs.try_launch(step) if self.graphs is not None else None
        if pred is None:
            shape = StepShape.of(step)
            batch = self.prepare(step)
            self.backend.init_forward_metadata(batch)
            pred = self.forward_step(batch, shape)[0][: batch.num_tokens]
        if step.device_tokens is not None:  # its own pending inputs: nothing will read them
            self._pending_read = None
        return pred

    def extend(self, step: StepBatch) -> torch.Tensor | None:
        """A prefill step (eager); returns float32 logits of ``step.logits_rows`` (None: none asked)."""
        if step.kind != "extend":
            raise ValueError(f"Expected an extend step, got {step.kind!r}")
        self.generation += 1
        batch = self.prepare(step)
        if self.device.type == "cuda":
            self._build_kv_indices(batch)
        self.backend.init_forward_metadata(batch)
        rows = step.logits_rows
        index = None if rows is None else torch.tensor(rows, dtype=torch.long).to(self.device, non_blocking=True)
        if step.mtp != "after":
            return self.model.forward(batch, self.pool, self.backend, logits_rows=index)
        logits, hidden = self.model.forward(batch, self.pool, self.backend, logits_rows=index, return_hidden=True)
        self._mtp_extend(step, batch, logits, hidden, rows)
        return logits

    def _mtp_extend(self, step: StepBatch, batch: ForwardBatch, logits: torch.Tensor | None, hidden: torch.Tensor,
                    logits_rows: list[int] | None) -> None:
        """The MTP module over a prefill chunk: each row fed the prompt's next token (an entry's
        ``lookahead`` past its end, at the prompt's end the token the engine emits there: the
        target's argmax, or the request's sampled first token, ``first_tokens``); at a prompt's end
        its state and top tokens are kept for the first proposal."""
        state = self._mtp_state()
        where = {r: k for k, r in enumerate(range(batch.num_tokens) if logits_rows is None else logits_rows)}
        next_ids, ends, start = [], [], 0
        for e in step.entries:
            next_ids += e.tokens[1:] + [e.lookahead if e.lookahead is not None else 0]
            end = start + e.num_tokens - 1
            if e.lookahead is None:
                if end not in where:
                    raise ValueError(f"Expected the logits of row {end} (a prompt's end) for the MTP module, got rows {logits_rows}")
                ends.append((e.row, end, e))
            start = end + 1
        ids = torch.tensor(next_ids, dtype=torch.long).to(self.device, non_blocking=True)
        if ends:
            end_rows = torch.tensor([r for _, r, _ in ends], dtype=torch.long, device=self.device)
            picks = torch.tensor([where[r] for _, r, _ in ends], dtype=torch.long, device=self.device)
            end_logits = logits.index_select(0, picks)
            if any(e.sampling is not None and e.sampling.samples for _, _, e in ends):  # the token the engine will emit
                chosen = self.first_tokens(end_logits, [e.sampling for _, _, e in ends], [e.positions[-1] for _, _, e in ends])
            else:
                chosen = end_logits.argmax(dim=-1)
            ids.index_copy_(0, end_rows, chosen)
        mtp_logits, out = self.model.mtp_forward(batch, self.pool, self.backend, hidden, ids,
                                                 logits_rows=end_rows if ends else torch.zeros(0, dtype=torch.long, device=self.device))
        if ends:
            table_rows = torch.tensor([row for row, _, _ in ends], dtype=torch.long, device=self.device)
            state.hidden.index_copy_(0, table_rows, out.index_select(0, end_rows))
            top = mtp_logits.topk(min(step.topk or 1, mtp_logits.shape[-1]), dim=-1).indices.tolist()
            for (row, _, _), c in zip(ends, top):
                state.candidates[row] = c
