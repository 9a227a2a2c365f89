"""Seeded MLA verify cases: shapes, layouts and masks the kernel must get right.

A ``Case`` is a small, hashable description (heads, per-request draft and context lengths,
dims, dtype, mask and slot layout, seed); ``build_inputs`` turns it into the exact keyword
arguments of ``kernel.mla_verify_attention``; ``max_request_rel_err`` is the per-request error
every gate judges an output by. Two profiles:

* ``full_cases(seed)``: the GPU verify gate (>= 320 cases, up to 200k context, B up to 32).
* ``interpret_cases(seed)``: tiny cases for the Triton interpreter on a CPU.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from kernel.reference import tree_mask_from_parents

PRODUCTION_SM_SCALE = 1.0 / math.sqrt(192.0)  # DeepSeek-V3 MLA: qk_nope 128 + qk_rope 64
QUERY_SCALE = 0.5  # keeps scores spread (softmax far from one-hot) at D = 576

FULL_HEADS = (1, 3, 16, 20, 64, 128)
FULL_DRAFTS = (1, 2, 3, 7, 8, 16, 33, 64)
FULL_SPECIAL_CONTEXTS = (1, 17, 127, 4097, 65537)
FULL_MAX_CONTEXT = 200_000
FULL_MAX_TOTAL_KV = 1_500_000  # sum_b L_b per case: bounds pool size and gate time
FULL_MAX_SCORE_ELEMENTS = 4_000_000_000  # H * sum_b T_b * L_b: bounds the float64 reference
FULL_SMALL_DIMS = ((64, 32), (80, 48), (192, 128), (128, 128))
FULL_BATCH_SIZES = (2, 3, 4, 5, 8, 12, 16, 24, 32)

INTERPRET_HEAD_DIMS = ((32, 16), (48, 32), (64, 32), (64, 16))
INTERPRET_HEADS = (1, 3, 4)
INTERPRET_DRAFTS = (1, 2, 3, 5)
INTERPRET_MAX_CONTEXT = 80

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
INDEX_DTYPES = {"int32": torch.int32, "int64": torch.int64}


@dataclass(frozen=True)
class Case:
    """One verify call's shape and layout.

    ``draft_lens[b]`` is ``T_b`` and ``context_lens[b]`` is ``L_b`` (prefix plus drafts,
    ``L_b >= T_b``). ``tree`` selects random draft trees (``False``: ``tree_mask=None``, causal);
    ``scattered`` selects slots drawn from ``torch.randperm`` of the pool (``False``: each
    request's slots are one contiguous range). ``sm_scale=None`` leaves the kernel's default.
    ``fast_path``: the call is told each request's leading run of consecutive slots (the
    contiguous fast path, ``fast_path_args``); with ``scattered`` the slots are then a
    contiguous run of random length followed by scattered slots.
    """

    num_heads: int
    draft_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    head_dim: int = 576
    v_head_dim: int = 512
    dtype: str = "bf16"
    tree: bool = True
    scattered: bool = True
    index_dtype: str = "int32"
    kv_3d: bool = False  # kv_cache as [num_slots, 1, D] instead of [num_slots, D]
    mask_uint8: bool = False  # tree_mask as uint8 instead of bool
    sm_scale: float | None = PRODUCTION_SM_SCALE
    seed: int = 0
    fast_path: bool = False  # the kernel told each request's leading contiguous run (kv_start, kv_contig)

    def __post_init__(self) -> None:
        if len(self.draft_lens) != len(self.context_lens) or not self.draft_lens:
            raise ValueError(f"Expected one context per request, got {self.draft_lens} / {self.context_lens}")
        for num_draft, context_len in zip(self.draft_lens, self.context_lens):
            if not 1 <= num_draft <= context_len:
                raise ValueError(f"Expected 1 <= T_b <= L_b, got T_b={num_draft}, L_b={context_len}")
        if self.dtype not in DTYPES or self.index_dtype not in INDEX_DTYPES:
            raise ValueError(f"Unknown dtype {self.dtype!r} or index dtype {self.index_dtype!r}")
        if not 0 < self.v_head_dim <= self.head_dim:
            raise ValueError(f"Expected 0 < v_head_dim <= head_dim, got {self.v_head_dim}/{self.head_dim}")

    @property
    def batch_size(self) -> int:
        """B, the number of requests."""
        return len(self.draft_lens)

    @property
    def total_kv(self) -> int:
        """sum_b L_b, the KV rows the call reads."""
        return sum(self.context_lens)

    def describe(self) -> str:
        """One line that names every field, e.g. ``B=2 H=16 T=[1,7] L=[17,4097] D=576/512 bf16 ...``."""
        scale = "default" if self.sm_scale is None else f"{self.sm_scale:.6g}"
        mask = ("tree-u8" if self.mask_uint8 else "tree") if self.tree else "causal"
        layout = ("leading-run" if self.fast_path else "scattered") if self.scattered else "contiguous"
        layout += "-fast" if self.fast_path else ""
        return (
            f"B={self.batch_size} H={self.num_heads} T={_join(self.draft_lens)} L={_join(self.context_lens)} "
            f"D={self.head_dim}/{self.v_head_dim} {self.dtype} {mask} {layout} {self.index_dtype} "
            f"kv{'3d' if self.kv_3d else '2d'} scale={scale} seed={self.seed}"
        )


def build_inputs(case: Case, device: torch.device | str, pool_factor: float = 1.25) -> dict:
    """Random inputs for ``case``: exactly the keyword arguments of ``mla_verify_attention``.

    Returns a dict with
        q: ``case.dtype`` ``[N, H, D]``, ~N(0, 0.5^2); ``N = sum_b T_b``.
        kv_cache: ``case.dtype`` ``[num_slots, D]`` (or ``[num_slots, 1, D]``), ~N(0, 1) in every
            slot, used or not; ``num_slots = ceil(pool_factor * sum_b L_b) + 16``.
        qo_indptr, kv_indptr: int32 ``[B + 1]``.
        kv_indices: int32/int64 ``[sum_b L_b]``; distinct slots, each request's in position order.
        tree_mask: bool/uint8 ``[sum_b T_b^2]`` from random parent arrays, or None (causal).
        sm_scale: float or None.  v_head_dim: int.
    Structure (slots, trees) comes from a CPU generator and data from a generator on ``device``,
    both seeded by ``case.seed``.
    """
    device = torch.device(device)
    structure_rng = random.Random(case.seed)
    index_generator = torch.Generator(device="cpu").manual_seed(case.seed)
    data_generator = torch.Generator(device=device).manual_seed(case.seed)
    dtype = DTYPES[case.dtype]

    num_slots = math.ceil(pool_factor * case.total_kv) + 16
    if case.scattered and case.fast_path:
        slots = _leading_run_slots(case, num_slots, index_generator, structure_rng)
    elif case.scattered:
        slots = _scattered_slots(case, num_slots, index_generator)
    else:
        slots = _contiguous_slots(case, num_slots, structure_rng)
    kv_cache = torch.randn(num_slots, case.head_dim, generator=data_generator, device=device, dtype=dtype)
    if case.kv_3d:
        kv_cache = kv_cache.view(num_slots, 1, case.head_dim)
    num_tokens = sum(case.draft_lens)
    q = torch.randn(
        num_tokens, case.num_heads, case.head_dim, generator=data_generator, device=device, dtype=dtype
    ).mul_(QUERY_SCALE)

    tree_mask = None
    if case.tree:
        blocks = [tree_mask_from_parents(random_parents(t, structure_rng)).reshape(-1) for t in case.draft_lens]
        tree_mask = torch.cat(blocks).to(torch.uint8 if case.mask_uint8 else torch.bool).to(device)
    return {
        "q": q,
        "kv_cache": kv_cache,
        "qo_indptr": _indptr(case.draft_lens, device),
        "kv_indptr": _indptr(case.context_lens, device),
        "kv_indices": slots.to(device=device, dtype=INDEX_DTYPES[case.index_dtype]),
        "tree_mask": tree_mask,
        "sm_scale": case.sm_scale,
        "v_head_dim": case.v_head_dim,
    }


def random_parents(num_draft: int, rng: random.Random) -> list[int]:
    """A random draft tree: ``parents[t]`` uniform over ``{-1, 0, .., t-1}`` (-1: child of the prefix)."""
    return [rng.randint(-1, t - 1) for t in range(num_draft)]


def full_cases(seed: int = 0) -> list[Case]:
    """The GPU verify profile: >= 320 cases (see the module constants for what they cover).

    * every (H, T) of ``FULL_HEADS x FULL_DRAFTS`` as a single request at four contexts:
      ``L == T``, two of the awkward sizes (1, 17, 127, 4097, 65537, 200000) and one
      log-uniform draw;
    * ragged batches (B up to 32) mixing all T and log-uniform contexts up to 200k;
    * small head dims, DV == D included.
    Layout flags (dtype, tree/causal, scattered/contiguous, index dtype, kv rank, mask dtype,
    sm_scale) rotate over the case index, so each takes every value across many shapes.
    """
    rng = random.Random(seed)
    specs: list[dict] = []
    awkward = (*FULL_SPECIAL_CONTEXTS, FULL_MAX_CONTEXT)
    for combo, (heads, num_draft) in enumerate((h, t) for h in FULL_HEADS for t in FULL_DRAFTS):
        choices = [ctx for ctx in awkward if ctx > num_draft]
        picks = [choices[combo % len(choices)], choices[(combo + 3) % len(choices)]]
        contexts = [num_draft, *picks, _log_uniform(rng, num_draft, FULL_MAX_CONTEXT)]
        for context_len in contexts:
            specs.append({"num_heads": heads, "draft_lens": (num_draft,), "context_lens": (context_len,)})
    specs.append({"num_heads": 16, "draft_lens": (1,), "context_lens": (1,)})
    for batch_size in (*FULL_BATCH_SIZES, *[rng.choice(FULL_BATCH_SIZES) for _ in range(87)]):
        specs.append(_ragged_spec(rng, batch_size, rng.choice(FULL_HEADS)))
    specs.append({"num_heads": 16, "draft_lens": (1,) * 32, "context_lens": (1,) * 32})
    specs.append({"num_heads": 20, "draft_lens": (64,) * 8, "context_lens": (64,) * 8})
    for head_dim, v_head_dim in FULL_SMALL_DIMS:
        for _ in range(8):
            spec = _ragged_spec(rng, rng.choice((1, 2, 3, 4)), rng.choice(FULL_HEADS), max_context=70_000)
            specs.append({**spec, "head_dim": head_dim, "v_head_dim": v_head_dim})
    return [_with_layout(spec, index, seed, rng) for index, spec in enumerate(specs)]


def interpret_cases(seed: int = 0) -> list[Case]:
    """The CPU interpreter profile: 32 tiny cases (D <= 64, H <= 4, T <= 5, L <= 80, B <= 3)."""
    rng = random.Random(seed + 7919)
    specs: list[dict] = []
    fixed_contexts = (1, 2, 3, 5, 17, 64, 65, INTERPRET_MAX_CONTEXT)
    for index in range(32):
        head_dim, v_head_dim = INTERPRET_HEAD_DIMS[index % len(INTERPRET_HEAD_DIMS)]
        heads = INTERPRET_HEADS[index % len(INTERPRET_HEADS)]
        batch_size = 1 if index < 12 else rng.choice((1, 2, 3))
        draft_lens, context_lens = [], []
        for b in range(batch_size):
            num_draft = INTERPRET_DRAFTS[(index + b) % len(INTERPRET_DRAFTS)]
            if index < 12:
                context_len = max(num_draft, fixed_contexts[index % len(fixed_contexts)])
            else:
                context_len = rng.randint(num_draft, INTERPRET_MAX_CONTEXT)
            draft_lens.append(num_draft)
            context_lens.append(context_len)
        specs.append(
            {
                "num_heads": heads,
                "draft_lens": tuple(draft_lens),
                "context_lens": tuple(context_lens),
                "head_dim": head_dim,
                "v_head_dim": v_head_dim,
            }
        )
    return [_with_layout(spec, index, seed, rng) for index, spec in enumerate(specs)]


def fast_path_cases(seed: int, interpret: bool) -> list[Case]:
    """Cases for the contiguous fast path, appended to each profile: every request one
    contiguous range, or a contiguous run of random length then scattered slots; tree and
    causal, both dtypes and index dtypes, ragged batches. Interpret: 8 tiny cases within that
    profile's bounds; full: 16 at D=576 up to 70k keys."""
    rng = random.Random(seed + 104729)
    cases = []
    for index in range(8 if interpret else 16):
        if interpret:
            head_dim, v_head_dim = INTERPRET_HEAD_DIMS[index % len(INTERPRET_HEAD_DIMS)]
            heads = INTERPRET_HEADS[index % len(INTERPRET_HEADS)]
            drafts = [rng.choice(INTERPRET_DRAFTS) for _ in range(rng.choice((1, 2, 3)))]
            contexts = [rng.randint(t, INTERPRET_MAX_CONTEXT) for t in drafts]
        else:
            head_dim, v_head_dim = 576, 512
            heads = FULL_HEADS[index % len(FULL_HEADS)]
            drafts = [rng.choice(FULL_DRAFTS) for _ in range(rng.choice((1, 1, 2, 4)))]
            contexts = [_log_uniform(rng, max(t, 64), 70_000) for t in drafts]
        cases.append(Case(
            num_heads=heads, draft_lens=tuple(drafts), context_lens=tuple(contexts), head_dim=head_dim,
            v_head_dim=v_head_dim, dtype=("bf16", "fp16")[index % 2 if interpret else int(index % 4 == 3)],
            tree=index % 3 != 2, scattered=index % 2 == 1, index_dtype="int64" if index % 4 == 2 else "int32",
            seed=seed * 1_000_003 + 900_000 + index, fast_path=True,
        ))
    return cases


def fast_path_args(inputs: dict) -> dict:
    """``kv_start`` / ``kv_contig`` (host int64 [B]) of ``build_inputs``' slots: each request's
    first slot and the length of its leading run of consecutive slots."""
    from kernel.bench_api import contiguous_runs

    kv_start, kv_contig = contiguous_runs(inputs["kv_indptr"].cpu().numpy(), inputs["kv_indices"].cpu().numpy())
    return {"kv_start": kv_start, "kv_contig": kv_contig}


PROFILES = {"full": lambda seed=0: full_cases(seed) + fast_path_cases(seed, interpret=False),
            "interpret": lambda seed=0: interpret_cases(seed) + fast_path_cases(seed, interpret=True)}


def _ragged_spec(rng: random.Random, batch_size: int, heads: int, max_context: int = FULL_MAX_CONTEXT) -> dict:
    """Random (T_b, L_b) for one batch, within the total-KV and reference-work budgets."""
    draft_lens = [rng.choice(FULL_DRAFTS) for _ in range(batch_size)]
    context_lens: list[int] = []
    for b, num_draft in enumerate(draft_lens):
        remaining_floor = sum(draft_lens[b + 1 :])
        ceiling = min(max_context, FULL_MAX_TOTAL_KV - sum(context_lens) - remaining_floor)
        if rng.random() < 0.2:
            awkward = [ctx for ctx in (*FULL_SPECIAL_CONTEXTS, num_draft) if num_draft <= ctx <= ceiling]
            context_lens.append(rng.choice(awkward))
        else:
            context_lens.append(_log_uniform(rng, num_draft, ceiling))
    score_elements = heads * sum(t * ctx for t, ctx in zip(draft_lens, context_lens))
    if score_elements > FULL_MAX_SCORE_ELEMENTS:
        shrink = FULL_MAX_SCORE_ELEMENTS / score_elements
        context_lens = [max(t, int(ctx * shrink)) for t, ctx in zip(draft_lens, context_lens)]
    order = list(range(batch_size))
    rng.shuffle(order)
    return {
        "num_heads": heads,
        "draft_lens": tuple(draft_lens[i] for i in order),
        "context_lens": tuple(context_lens[i] for i in order),
    }


def _with_layout(spec: dict, index: int, seed: int, rng: random.Random) -> Case:
    """Rotate the layout flags over case indices; the tree/causal choice also varies randomly."""
    return Case(
        **spec,
        dtype=("bf16", "fp16")[index % 2],
        tree=rng.random() < 0.7,
        scattered=index % 4 != 3,
        index_dtype="int64" if index % 6 == 5 else "int32",
        kv_3d=index % 8 == 6,
        mask_uint8=index % 10 == 9,
        sm_scale=None if index % 5 == 4 else PRODUCTION_SM_SCALE,
        seed=seed * 1_000_003 + index,
    )


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    """An integer in [low, high], uniform in log space."""
    if high <= low:
        return low
    return min(high, max(low, int(math.exp(rng.uniform(math.log(low), math.log(high + 1))))))


def _scattered_slots(case: Case, num_slots: int, generator: torch.Generator) -> torch.Tensor:
    """int64 ``[sum_b L_b]``: distinct slots from a random permutation of the pool."""
    return torch.randperm(num_slots, generator=generator)[: case.total_kv]


def _leading_run_slots(case: Case, num_slots: int, generator: torch.Generator, rng: random.Random) -> torch.Tensor:
    """int64 ``[sum_b L_b]``: each request's first positions (a random count, 0 to L_b) one
    contiguous range, the rest distinct random slots outside every range."""
    runs = [rng.randint(0, length) for length in case.context_lens]
    spans, cursor = [], 0
    for run in runs:  # the runs side by side from a random offset, the rest of the pool shuffled
        spans.append(cursor)
        cursor += run + rng.randint(0, 3)
    offset = rng.randint(0, max(0, num_slots - cursor))
    taken = torch.zeros(num_slots, dtype=torch.bool)
    for start, run in zip(spans, runs):
        taken[offset + start : offset + start + run] = True
    rest = torch.nonzero(~taken).flatten()
    rest = rest[torch.randperm(rest.numel(), generator=generator)]
    pieces, used = [], 0
    for start, run, length in zip(spans, runs, case.context_lens):
        pieces.append(torch.arange(offset + start, offset + start + run))
        pieces.append(rest[used : used + length - run])
        used += length - run
    return torch.cat(pieces)


def _contiguous_slots(case: Case, num_slots: int, rng: random.Random) -> torch.Tensor:
    """int64 ``[sum_b L_b]``: each request one contiguous range, ranges in random pool order with gaps."""
    spare = num_slots - case.total_kv
    gaps = sorted(rng.randint(0, spare) for _ in range(case.batch_size))
    order = list(range(case.batch_size))
    rng.shuffle(order)
    starts = [0] * case.batch_size
    cursor, previous_gap = 0, 0
    for position, request in enumerate(order):
        cursor += gaps[position] - previous_gap
        previous_gap = gaps[position]
        starts[request] = cursor
        cursor += case.context_lens[request]
    return torch.cat([torch.arange(start, start + ctx) for start, ctx in zip(starts, case.context_lens)])


def _indptr(lengths: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """int32 ``[len(lengths) + 1]``: exclusive prefix sums."""
    return torch.tensor([0, *_cumsum(lengths)], dtype=torch.int32, device=device)


def _cumsum(lengths: tuple[int, ...]) -> list[int]:
    total, sums = 0, []
    for length in lengths:
        total += length
        sums.append(total)
    return sums


def max_request_rel_err(out: torch.Tensor, reference: torch.Tensor, qo_indptr: torch.Tensor) -> float:
    """Largest ``||out_b - ref_b|| / ||ref_b||`` over requests, computed in float64.

    Args:
        out: any float dtype ``[N, H, DV]``.
        reference: float64 ``[N, H, DV]``.
        qo_indptr: int ``[B + 1]``.
    """
    bounds = qo_indptr.tolist()
    worst = 0.0
    for start, end in zip(bounds[:-1], bounds[1:]):
        ref_b = reference[start:end].double()
        err = torch.linalg.vector_norm(out[start:end].double() - ref_b)
        worst = max(worst, float(err / torch.linalg.vector_norm(ref_b).clamp_min(1e-300)))
    return worst


def _join(values: tuple[int, ...]) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"


__all__ = ["Case", "build_inputs", "fast_path_args", "fast_path_cases", "full_cases", "interpret_cases", "random_parents",
           "max_request_rel_err", "PROFILES"]
