"""One forward step's batch: what the host decides (``StepBatch``) and the device views every
layer and the attention backend read (``ForwardBatch``).

Kinds: ``extend`` (prefill, causal, any length), ``decode`` (one token per entry, causal)
and ``verify`` (a draft tree per entry, ``T_b <= 64``, with a tree mask).

Decisions:
- An entry names its cached prefix as (slot-table row, length) and only the slots after it
  as a host list (``tail``): a step's ``kv_indices`` is built on the device from the table
  (``kv_indices.build_kv_indices``), so a 128k-token context costs no host list and no copy.
- Every host-side field is packed by ``StepLayout`` into one int64 host buffer (pinned on
  CUDA) and copied to the device once; the device fields are views of that copy. A layout
  is either exact (an eager step) or a bucket's fixed one (a CUDA graph's static buffers:
  the same views every replay, rows past the real batch padded).
- Padding (graph buckets) is inert: padded tokens have id 0 at position 0 and write their
  latent rows to slot 0, which the allocator never hands out; padded entries have no KV
  (``kv_len`` 0) and are not in the attention plan.
- A sampled step (``StepBatch.sample``) packs each row's request's sampling parameters (seed,
  temperature, top-k, top-p, min-p) with the rows, as device tensors a captured graph reads
  (``serving.sampling``); a greedy step's layout has none of them, and packs as before.
  Padded rows are greedy (temperature 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from serving.sampling.params import SamplingParams

KINDS = ("extend", "decode", "verify")
MTP_MODES = ("", "after", "chain")


@dataclass
class StepEntry:
    """One request (or one draft chain) of a step.

    row: slot-table row holding the cached prefix (0 with ``prefix_len`` 0: none).
    prefix_len: cached slots read from the row, in position order.
    tail: slots after the prefix, in position order; the last ``len(tokens)`` are the new
        tokens' own slots (their latent rows are written this step).
    tokens, positions: the new tokens (T_b of each).
    parents: verify only, int [T_b]: the parent of each new token among them (-1 for the
        root, which is token 0); the tree mask and acceptance come from it.
    hidden_src: an MTP chain step's row of ``MTPState.hidden`` holding the module's state for
        the chain's first token (its request's table row; 0: the padding row).
    lookahead: an MTP extend's token after the entry's last one (the next chunk's first);
        None: the target's own choice there (the prompt's end).
    sampling: the request's ``SamplingParams`` (``serving.sampling``; a sampled step packs them
        per row, a prefill's end samples its first token with them); None: greedy.
    """

    row: int
    prefix_len: int
    tail: list[int]
    tokens: list[int]
    positions: list[int]
    parents: list[int] | None = None
    hidden_src: int = 0
    lookahead: int | None = None
    sampling: "SamplingParams | None" = None

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def kv_len(self) -> int:
        return self.prefix_len + len(self.tail)


@dataclass
class StepBatch:
    """A step as the host decides it.

    kind: one of KINDS. num_layers: run only the first layers (a layer-skip drafter), None: all.
    topk: also return each row's top-``topk`` token ids (a drafter's first step), 0: none.
    accept: acceptance of the drafts on the device (greedy, or speculative sampling with
        ``sample``), and the accepted slots written to the slot table (a decode / verify step
        of the target model).
    logits_rows: extend only, rows to return logits for (None: every row).
    mtp: what the step runs of the model's MTP module (``serving.speculation.mtp``): "" none;
        "after" the target's step, then the module over its rows (its latent rows, and its
        top-``topk`` tokens after each entry's last accepted token); "chain" the module alone,
        every entry one chain of as many levels as it has tokens (a verify step of causal
        chains; ``ModelRunner._mtp_chain``).
    sample: the step's rows carry their requests' sampling parameters, and acceptance is
        speculative sampling (``serving.speculation.rejection``; a greedy entry's result is the
        greedy one); only for an accepting decode / verify step. False: greedy, as before.
    device_tokens: int64 [S] on the device, the outputs of a draft step not read yet; an entry's
        negative token ``-1 - r`` (``serving.speculation.tree.pending``) is ``device_tokens[r]``,
        copied into the step's input rows on the device and read back with its results
        (``ModelRunner.run`` writes it into the entry). None: every token is on the host.
    """

    kind: str
    entries: list[StepEntry]
    num_layers: int | None = None
    topk: int = 0
    accept: bool = False
    logits_rows: list[int] | None = None
    mtp: str = ""
    sample: bool = False
    device_tokens: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Expected kind in {KINDS}, got {self.kind!r}")
        if self.mtp not in MTP_MODES:
            raise ValueError(f"Expected mtp in {MTP_MODES}, got {self.mtp!r}")
        if not self.entries:
            raise ValueError("Expected at least one entry in a step, got none")
        if self.sample and (self.kind == "extend" or not self.accept):
            raise ValueError(f"Expected sample=True only on an accepting decode or verify step, got a {self.kind} step "
                             f"with accept={self.accept}")
        for b, e in enumerate(self.entries):
            t = e.num_tokens
            if t < 1 or len(e.positions) != t or len(e.tail) < t:
                raise ValueError(
                    f"Expected entry {b} with T >= 1 tokens, as many positions and a tail holding the new tokens' "
                    f"slots, got {t} tokens, {len(e.positions)} positions, {len(e.tail)} tail slots"
                )
            if self.kind == "decode" and t != 1:
                raise ValueError(f"Expected one token per entry in a decode step, got {t} for entry {b}")
            if self.kind == "verify" and (e.parents is None or len(e.parents) != t):
                raise ValueError(f"Expected parents for each of entry {b}'s {t} tokens in a verify step, got {e.parents}")
            if self.device_tokens is None and min(e.tokens) < 0:
                raise ValueError(f"Expected token ids >= 0 in entry {b}, or the device outputs its pending drafts are in "
                                 f"(device_tokens), got {e.tokens}")
        if self.device_tokens is not None:
            self._check_device_tokens()

    def _check_device_tokens(self) -> None:
        """On the host, before any gather: an index past ``device_tokens`` would fault on the device."""
        source = self.device_tokens
        if self.kind == "extend":
            raise ValueError("Expected pending drafts (device_tokens) only in a decode or verify step, got an extend step")
        if source.dim() != 1 or source.dtype != torch.int64:
            raise ValueError(f"Expected device_tokens as int64 [S] (a draft step's outputs), got {source.dtype} "
                             f"{list(source.shape)}")
        lowest = min(min(e.tokens) for e in self.entries)
        if lowest < 0 and -1 - lowest >= source.shape[0]:
            raise ValueError(f"Expected pending drafts naming rows of device_tokens (0..{source.shape[0] - 1}), got row "
                             f"{-1 - lowest}; a drafter's tree must name rows of the step it launched")

    def pending_cells(self) -> list[tuple[int, int, int, int]]:
        """(entry, token index, step row, ``device_tokens`` row) of every pending token, in row order."""
        cells, start = [], 0
        for b, e in enumerate(self.entries):
            cells += [(b, j, start + j, -1 - t) for j, t in enumerate(e.tokens) if t < 0]
            start += e.num_tokens
        return cells

    def take_pending(self, values: list[int], cells: list[tuple[int, int, int, int]]) -> None:
        """Write the pending tokens' values (read from the device, in ``cells``' order) into the entries."""
        for (b, j, _, _), v in zip(cells, values):
            self.entries[b].tokens[j] = int(v)

    @property
    def batch_size(self) -> int:
        return len(self.entries)

    @property
    def max_tokens(self) -> int:
        return max(e.num_tokens for e in self.entries)

    @property
    def num_tokens(self) -> int:
        return sum(e.num_tokens for e in self.entries)


@dataclass(frozen=True)
class StepShape:
    """What a step computes besides the forward (fixed for a captured graph)."""

    kind: str
    num_layers: int | None
    width: int
    topk: int
    accept: bool
    mtp: str = ""  # StepBatch.mtp; with "after", topk counts the MTP module's tokens per entry
    sample: bool = False  # StepBatch.sample

    @staticmethod
    def of(step: StepBatch, width: int | None = None) -> "StepShape":
        return StepShape(step.kind, step.num_layers, width or step.max_tokens, step.topk, step.accept, step.mtp, step.sample)


def tree_arrays(parents: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(depth int64 [T], ancestor-or-self bool [T, T]) of a tree given in topological order
    (``parents[t] < t``; -1 for a root)."""
    t = len(parents)
    depth = np.zeros(t, dtype=np.int64)
    anc = np.zeros((t, t), dtype=bool)
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"Expected parents[{i}] in [-1, {i - 1}] (tokens in topological order), got {p}")
        if p >= 0:
            anc[i] = anc[p]
            depth[i] = depth[p] + 1
        anc[i, i] = True
    return depth, anc


@dataclass(frozen=True)
class StepLayout:
    """Sizes of a step's packed fields: exact for an eager step, a bucket's for a graph.

    batch: entries B. tokens: rows N. tails: tail slots. mask: tree-mask elements
    (sum T_b^2; 0 for extend). width: T of the acceptance grid [B, width] (1 for extend).
    kv: kv_indices capacity. sampled: rows with sampling parameters (N for a sampled step, else 0).
    """

    batch: int
    tokens: int
    tails: int
    mask: int
    width: int
    kv: int
    sampled: int = 0

    @staticmethod
    def exact(step: StepBatch) -> "StepLayout":
        tails, kv = sum(len(e.tail) for e in step.entries), sum(e.kv_len for e in step.entries)
        if step.kind == "extend":  # prefill accepts nothing: no grid, no tree mask (B T^2 bytes a chunk otherwise)
            return StepLayout(step.batch_size, step.num_tokens, tails, 0, 1, kv)
        return StepLayout(step.batch_size, step.num_tokens, tails, sum(e.num_tokens ** 2 for e in step.entries),
                          step.max_tokens, kv, step.num_tokens if step.sample else 0)

    def holds(self, step: StepBatch) -> bool:
        return self.covers(StepLayout.exact(step))

    def covers(self, need: "StepLayout") -> bool:
        """Whether every size of ``need`` fits this layout."""
        return (need.batch <= self.batch and need.tokens <= self.tokens and need.tails <= self.tails
                and need.mask <= self.mask and need.width <= self.width and need.kv <= self.kv
                and need.sampled <= self.sampled)

    def regions(self) -> tuple[dict[str, int], dict[str, int], dict[str, int], dict[str, int]]:
        """(int64 fields, int32 fields, float32 fields, bool fields) -> element counts, in packing order."""
        b, n, g, s = self.batch, self.tokens, self.batch * self.width, self.sampled
        i64 = {"input_ids": n, "positions": n, "out_slots": n, "rows": b, "prefix_lens": b,
               "grid_rows": g, "grid_parents": g, "grid_depth": g, "hidden_src": b, "seed": s, "top_k": s}
        i32 = {"qo_indptr": b + 1, "kv_indptr": b + 1, "tail_indptr": b + 1, "tails": self.tails}
        f32 = {"temperature": s, "top_p": s, "min_p": s}
        flags = {"tree_mask": self.mask, "grid_valid": g, "grid_anc": g * self.width}
        return i64, i32, f32, flags


def _words(n: int, per_word: int) -> int:
    """int64 words holding ``n`` items of ``per_word`` per word, rounded up to an even count so
    every region of the packed buffer starts 16-byte aligned."""
    w = -(-n // per_word)
    return w + (w & 1)


@dataclass
class PackedStep:
    """A step's fields packed per ``layout``: ``host`` int64 (pinned on CUDA) and the named
    numpy views into it (``fill`` writes them); ``views(device_buffer)`` names the device copy.

    The host cost of a step is mostly Python calls, so the views are made once and ``fill``
    writes each field with one or two numpy calls.
    """

    layout: StepLayout
    host: torch.Tensor
    offsets: dict[str, tuple[int, int, str]] = field(default_factory=dict)  # name -> (byte offset, count, dtype)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    _device_views: tuple | None = None

    @staticmethod
    def allocate(layout: StepLayout, pin: bool) -> "PackedStep":
        i64, i32, f32, flags = layout.regions()
        offsets, words = {}, 0
        for fields, per_word, dtype in ((i64, 1, "int64"), (i32, 2, "int32"), (f32, 2, "float32"), (flags, 8, "bool")):
            for name, count in fields.items():
                offsets[name] = (words * 8, count, dtype)
                words += _words(count, per_word)
        host = torch.zeros(max(words, 2), dtype=torch.int64, pin_memory=pin)
        raw = host.numpy().view(np.uint8)
        arrays = {name: raw[start : start + count * np.dtype(dtype).itemsize].view(dtype)
                  for name, (start, count, dtype) in offsets.items()}
        return PackedStep(layout, host, offsets, arrays)

    def numpy(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def views(self, device_buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named views of ``device_buffer`` (the host buffer's copy), made once per buffer."""
        if self._device_views is not None and self._device_views[0] is device_buffer:
            return self._device_views[1]
        raw = device_buffer.view(torch.uint8)
        out = {name: raw[start : start + count * np.dtype(dtype).itemsize].view(getattr(torch, dtype))
               for name, (start, count, dtype) in self.offsets.items()}
        self._device_views = (device_buffer, out)
        return out

    def fill(self, step: StepBatch) -> None:
        """Write ``step`` into the host buffer; fields past the step are padding (zeros, and
        parents of padded acceptance cells pointing at themselves)."""
        lay = self.layout
        if not lay.holds(step):
            raise ValueError(f"Expected a step within the layout {lay}, got {StepLayout.exact(step)}")
        a = self.arrays
        self.host.numpy().fill(0)  # one memset: every field's padding is zero but the parents'
        entries = step.entries
        b = len(entries)
        t_lens = [e.num_tokens for e in entries]
        n = sum(t_lens)
        a["input_ids"][:n] = [x for e in entries for x in e.tokens]
        if step.device_tokens is not None:  # pending drafts: written on the device (ModelRunner.prepare)
            np.maximum(a["input_ids"][:n], 0, out=a["input_ids"][:n])
        a["positions"][:n] = [x for e in entries for x in e.positions]
        a["out_slots"][:n] = [x for e in entries for x in e.tail[len(e.tail) - e.num_tokens :]]
        a["rows"][:b] = [e.row for e in entries]
        a["prefix_lens"][:b] = [e.prefix_len for e in entries]
        if step.mtp == "chain":
            a["hidden_src"][:b] = [e.hidden_src for e in entries]
        qo, kv, ti = a["qo_indptr"], a["kv_indptr"], a["tail_indptr"]
        np.cumsum(t_lens, out=qo[1 : b + 1])
        np.cumsum([e.kv_len for e in entries], out=kv[1 : b + 1])
        np.cumsum([len(e.tail) for e in entries], out=ti[1 : b + 1])
        qo[b + 1 :], kv[b + 1 :], ti[b + 1 :] = qo[b], kv[b], ti[b]  # padded entries are empty
        tails = [x for e in entries for x in e.tail]
        a["tails"][: len(tails)] = tails
        if lay.sampled:
            self._fill_sampling(step, t_lens)
        self._fill_tree(step, t_lens)

    def _fill_sampling(self, step: StepBatch, t_lens: list[int]) -> None:
        """Each row's request's sampling parameters (greedy for an entry without any; padding
        rows stay greedy: temperature 0). An unseeded sampled entry is refused: the engine gives
        every sampled request a seed when it admits it."""
        a, n = self.arrays, sum(t_lens)
        params = [e.sampling for e in step.entries]
        if any(p is not None and p.samples and p.seed is None for p in params):
            raise ValueError("Expected a seed for every sampled entry (the engine draws one per request), got none")
        greedy = (0.0, 1.0, 0, 0.0, 0)
        values = [greedy if p is None else (p.temperature, p.top_p, p.top_k, p.min_p, p.seed or 0) for p in params]
        for k, name in enumerate(("temperature", "top_p", "top_k", "min_p", "seed")):
            a[name][:n] = np.repeat([v[k] for v in values], t_lens)

    def _fill_tree(self, step: StepBatch, t_lens: list[int]) -> None:
        w = self.layout.width
        grid_rows = self.arrays["grid_rows"].reshape(-1, w)
        parents = self.arrays["grid_parents"].reshape(-1, w)
        depth = self.arrays["grid_depth"].reshape(-1, w)
        valid = self.arrays["grid_valid"].reshape(-1, w)
        anc = self.arrays["grid_anc"].reshape(-1, w, w)
        parents[:] = np.arange(w)  # padded cells: their own parent, depth 0, invalid, reading row 0
        if step.kind == "extend":  # nothing is accepted from a prefill: every cell stays padding
            return
        if w == 1 and step.kind != "verify":  # one token per entry, no tree mask: a single cell each
            b = len(t_lens)
            grid_rows[:b, 0] = np.arange(b)
            valid[:b, 0] = True
            anc[:b, 0, 0] = True
            return
        mask = self.arrays["tree_mask"]
        offset, row = 0, 0
        for b, e in enumerate(step.entries):
            t = t_lens[b]
            grid_rows[b, :t] = np.arange(row, row + t)
            valid[b, :t] = True
            if e.parents is None:  # extend / decode entries: a chain
                parents[b, :t] = np.maximum(np.arange(t) - 1, 0)
                depth[b, :t] = np.arange(t)
                tri = np.tri(t, dtype=bool)
            else:
                d, tri = tree_arrays(e.parents)
                parents[b, :t] = np.maximum(e.parents, 0)
                depth[b, :t] = d
            anc[b, :t, :t] = tri
            if step.kind == "verify":
                mask[offset : offset + t * t] = tri.reshape(-1)
                offset += t * t
            row += t


@dataclass
class ForwardBatch:
    """The device side of a step (N rows, possibly padded past the real ``num_real`` tokens).

    kind: one of KINDS. input_ids, positions, out_slots: int64 [N].
    qo_indptr, kv_indptr: int32 [B+1] (device); qo_indptr_host, kv_indptr_host: int32 [B+1]
        CPU copies (planning without a device sync); qo_lens, kv_lens: host lists (real entries).
    kv_indices: int32 [>= total_kv], each entry's slots in position order, its new tokens last.
    tree_mask: bool [>= sum_b T_b^2] (verify) or None (causal).
    rows, prefix_lens: int64 [B]; tail_indptr int32 [B+1], tails int32: what ``kv_indices`` is built from.
    grid_*: the acceptance grid [B, width] (rows, parents, depth, valid) and grid_anc [B, width, width];
        an extend step's is [B, 1], all padding.
    max_position: the largest position (host int).
    """

    kind: str
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_slots: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    tree_mask: torch.Tensor | None
    qo_lens: list[int]
    kv_lens: list[int]
    qo_indptr_host: torch.Tensor
    kv_indptr_host: torch.Tensor
    fields: dict[str, torch.Tensor]
    max_position: int = 0

    @property
    def batch_size(self) -> int:
        return len(self.qo_lens)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def mode(self) -> str:
        """The attention mode: ``extend``, ``decode`` or ``verify``."""
        return self.kind


def host_indptrs(step: StepBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 [B+1] CPU tensors of the real entries' qo and kv indptrs."""
    qo = np.zeros(step.batch_size + 1, dtype=np.int32)
    kv = np.zeros(step.batch_size + 1, dtype=np.int32)
    np.cumsum([e.num_tokens for e in step.entries], out=qo[1:])
    np.cumsum([e.kv_len for e in step.entries], out=kv[1:])
    return torch.from_numpy(qo), torch.from_numpy(kv)


def forward_batch(step: StepBatch, views: dict[str, torch.Tensor], kv_indices: torch.Tensor) -> ForwardBatch:
    """The ``ForwardBatch`` over device ``views`` (from ``PackedStep.views``) and a ``kv_indices``
    buffer that ``build_kv_indices`` fills."""
    qo_host, kv_host = host_indptrs(step)
    return ForwardBatch(
        kind=step.kind,
        input_ids=views["input_ids"],
        positions=views["positions"],
        out_slots=views["out_slots"],
        qo_indptr=views["qo_indptr"],
        kv_indptr=views["kv_indptr"],
        kv_indices=kv_indices,
        tree_mask=views["tree_mask"] if step.kind == "verify" else None,
        qo_lens=[e.num_tokens for e in step.entries],
        kv_lens=[e.kv_len for e in step.entries],
        qo_indptr_host=qo_host,
        kv_indptr_host=kv_host,
        fields=views,
        max_position=max(max(e.positions) for e in step.entries),
    )
