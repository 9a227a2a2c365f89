"""Speculative sampling of draft trees (``serving.speculation.rejection``): exactly the host walk
of recursive rejection sampling with the same draws, exactly greedy acceptance on greedy rows,
and lossless: the first tokens of speculative sampling follow plain sampling's distribution.

Statistical design (``tests.backend.chisquare``; false-alarm rate ALPHA = 1e-3 per test, fixed
seeds): a toy model over V = 4 tokens whose next-token logits depend on the two tokens before
(``TOY``), processed by the engine's sampler, drafted by deterministic proposers (point masses:
the n-gram, layer-skip and MTP drafters all propose so) in chain and tree shapes, decoded by
``sampled_accept`` step after step (the root is the last token, positions advance by what was
accepted, as in the engine) from a two-token prompt. The first K = 3 emitted tokens of N = 60000
independent sequences are compared with their exact distribution under plain sampling
(transformers' warpers in float64): at most 64 cells, df <= 63, critical value <= 103.4; each
case keeps df >= 20 so none passes for want of cells. Power: any alternative at total variation
delta = 0.02 has noncentrality lambda >= 4 N delta^2 = 96 (Cauchy-Schwarz: the least detectable
bias spreads in proportion to p), so it is rejected with probability >= Phi((63 + 96 - 103.4) /
sqrt(2 (63 + 192))) = Phi(2.46) > 0.99. Planted bugs, each caught: a draft accepted without the
ratio test, drafts accepted 2 points too often (ratio + 0.02: on the 2x2 tree a total variation
of 0.031 in the first three tokens, lambda = 326 at these draws, measured with 400000), and the
bonus drawn without removing the rejected drafts' tokens (these two gross bugs with 10000
sequences). Speculative and plain draws of 2 million sequences (chain 1x3, tree 2x2) gave
p-values 0.68 and 0.52 against the same references.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import serving.speculation.rejection as rejection
from serving.kv.batch import PackedStep, StepBatch, StepEntry, StepLayout, tree_arrays
from serving.sampling import SamplingParams
from serving.sampling.rng import uniform_reference
from serving.sampling.sampler import processed_probs, sample_from
from serving.speculation.accept import greedy_accept
from serving.speculation.rejection import sampled_accept
from tests.backend.chisquare import chi_square, reference_probs

# ---- exactness: the device walk against a host walk with the same draws ------------------------------

SMALL_V = 6


def random_tree(rng: random.Random, size: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of a draft tree (parents -1: the root's child), siblings' tokens possibly repeated."""
    tokens, parents = [], []
    for t in range(size):
        parents.append(rng.randrange(-1, t))
        tokens.append(rng.randrange(SMALL_V))
    return tokens, parents


def packed_fields(trees, params, bases, width=None, batch=None):
    """The device fields of a sampled verify step of ``trees`` (each over prefix ``bases[b]``)."""
    entries = [StepEntry(0, base, list(range(1, len(t) + 2)), [0] + t, [base] + [base + d for d in _depths(p)],
                         [-1] + [0 if q < 0 else q + 1 for q in p], sampling=s)
               for (t, p), s, base in zip(trees, params, bases)]
    step = StepBatch("verify", entries, accept=True, sample=True)
    exact = StepLayout.exact(step)
    layout = StepLayout(batch or exact.batch, exact.tokens + 2, exact.tails + 2, exact.mask + 4, width or exact.width,
                        exact.kv, exact.tokens + 2)
    packed = PackedStep.allocate(layout, pin=False)
    packed.fill(step)
    return packed.views(packed.host.clone()), layout


def _depths(parents: list[int]) -> list[int]:
    out = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def host_walk(tokens, parents, probs, seed, base):
    """The rule in Python, node by node: (accepted draft indices, the residual the bonus is drawn
    from, its position). probs: [1 + T_d, V] float32 rows (row 0 the root's)."""
    node, path = 0, []  # node: row of the current accepted node
    while True:
        children = [c for c, p in enumerate(parents) if (p + 1 if p >= 0 else 0) == node]
        tried, mass, chosen = set(), torch.tensor(0.0), None
        for rank, c in enumerate(children):
            x = tokens[c]
            if x in tried:
                continue
            p = probs[node, x]
            r = torch.clamp(p / torch.clamp(1 - mass, min=1e-30), max=1.0)
            u = uniform_reference(seed, base + len(path), 1 + rank)
            if u < float(r):
                chosen = c
                break
            tried.add(x)
            mass = mass + p
        if chosen is None:
            left = probs[node].clone()
            left[[tokens[c] for c in children]] = 0.0
            return path, left if float(left.sum()) > 0 else probs[node], base + len(path)
        path.append(chosen)
        node = chosen + 1


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 4), pad=st.integers(0, 2))
def test_device_walk_equals_the_host_walk_with_the_same_draws(seed, batch, pad):
    rng = random.Random(seed)
    trees = [random_tree(rng, rng.randrange(0, 9)) for _ in range(batch)]
    params = [SamplingParams(temperature=1.0, seed=rng.randrange(2**63)) for _ in trees]
    bases = [rng.randrange(0, 500) for _ in trees]
    fields, layout = packed_fields(trees, params, bases, width=max(len(t) for t, _ in trees) + 1 + pad, batch=batch + (pad > 1))
    # probabilities in 1/64ths (exact sums in float32), some tokens of none
    weights = torch.tensor([[rng.choice([0, 0, 1, 2, 5, 9]) for _ in range(SMALL_V)] for _ in range(layout.tokens)], dtype=torch.float32)
    weights[:, 0] += 1
    probs = torch.round(weights / weights.sum(-1, keepdim=True) * 64) / 64
    probs[:, 0] += 1 - probs.sum(-1)
    out = sampled_accept(probs, fields, layout.width)
    row = 0
    for b, ((tokens, parents), p, base) in enumerate(zip(trees, params, bases)):
        path, left, position = host_walk(tokens, parents, probs[row : row + len(tokens) + 1], p.seed, base)
        assert int(out["n_accepted"][b]) == len(path)
        assert out["order"][b, : len(path) + 1].tolist() == [0] + [c + 1 for c in path]
        want = sample_from(left[None], torch.tensor([uniform_reference(p.seed, position, 0)], dtype=torch.float32))
        assert int(out["bonus"][b]) == int(want[0])
        emitted = [tokens[c] for c in path] + [int(want[0])]
        on_path = [0] + [c + 1 for c in path]
        assert [int(out["next_ids"][row + cell]) for cell in on_path] == emitted
        row += len(tokens) + 1


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 4))
def test_greedy_rows_accept_exactly_as_greedy_acceptance(seed, batch):
    rng = random.Random(seed)
    trees = [random_tree(rng, rng.randrange(0, 9)) for _ in range(batch)]
    params = [SamplingParams() if rng.random() < 0.8 else None for _ in trees]
    fields, layout = packed_fields(trees, params, [rng.randrange(100) for _ in trees])
    logits = torch.tensor([[float(rng.randrange(4)) for _ in range(SMALL_V)] for _ in range(layout.tokens)])  # many ties
    probs = processed_probs(logits, fields["temperature"], fields["top_k"], fields["top_p"], fields["min_p"])
    got = sampled_accept(probs, fields, layout.width)
    want = greedy_accept(logits.argmax(-1), fields, layout.width)
    for key in ("n_accepted", "order", "bonus"):
        assert torch.equal(got[key], want[key]), key


# ---- lossless: speculative sampling's first tokens against plain sampling's -----------------------

V, K, N = 4, 3, 60_000
PROMPT = (1, 3)
TOY = torch.randn(V, V, V, generator=torch.Generator().manual_seed(7)) * 0.8  # logits after (token before, token)


def proposer(kind: str) -> torch.Tensor:
    """int64 [V, V, V]: the token a deterministic drafter proposes at rank r after (a, b): the
    target's likeliest first ("good", as a trained drafter), its least likely first ("bad",
    including tokens the filters removed), or a fixed arbitrary order ("arbitrary", as n-gram)."""
    if kind == "good":
        return TOY.argsort(-1, descending=True)
    if kind == "bad":
        return TOY.argsort(-1)
    return torch.randperm(V, generator=torch.Generator().manual_seed(3)).expand(V, V, V).clone()


def tree_of(paths: list[list[int]]) -> tuple[list[int], list[int]]:
    """(parents, ranks) of the trie of rank paths, root first (parent -1); node i's parent < i."""
    parents, ranks, index = [-1], [0], {}
    for path in paths:
        at = 0
        for r in path:
            if (at, r) not in index:
                index[(at, r)] = len(parents)
                parents.append(at)
                ranks.append(r)
            at = index[(at, r)]
    return parents, ranks


SHAPES = {"chain 1x3": [[0, 0, 0]], "tree 2x2": [[0, 0], [1, 0]], "tree 3x2": [[0, 0], [1, 0], [2, 1]],
          "tree 4x1 + chain": [[0, 0, 0], [1], [2], [3]]}


def speculative_first_tokens(shape: str, kind: str, params: SamplingParams, n: int = N) -> torch.Tensor:
    """int64 [n, K]: the first K tokens of n sequences decoded by speculative sampling."""
    parents, ranks = tree_of(SHAPES[shape])
    t = len(parents)
    depth, anc = tree_arrays(parents)
    parent_cell = torch.tensor([max(p, 0) for p in parents])
    prop = proposer(kind)
    hist = torch.zeros(n, 2 + K * t + 1, dtype=torch.int64)  # K steps at most; the last column takes discarded writes
    hist[:, 0], hist[:, 1] = PROMPT
    length = torch.full((n,), 2)
    out, count = torch.zeros(n, K + t, dtype=torch.int64), torch.zeros(n, dtype=torch.int64)
    seeds = torch.arange(n) * 7919 + 13
    fields = {"grid_rows": torch.arange(n * t), "grid_parents": parent_cell.repeat(n), "grid_depth": torch.from_numpy(depth).repeat(n),
              "grid_valid": torch.ones(n * t, dtype=torch.bool), "grid_anc": torch.from_numpy(anc).reshape(-1).repeat(n),
              "seed": seeds.repeat_interleave(t)}
    cols = {"temperature": torch.full((n * t,), params.temperature), "top_k": torch.full((n * t,), params.top_k),
            "top_p": torch.full((n * t,), params.top_p), "min_p": torch.full((n * t,), params.min_p)}
    while int(count.min()) < K:
        tok = torch.zeros(n, t, dtype=torch.int64)
        before = torch.zeros(n, t, dtype=torch.int64)
        tok[:, 0] = hist.gather(1, (length - 1)[:, None]).squeeze(1)
        before[:, 0] = hist.gather(1, (length - 2)[:, None]).squeeze(1)
        for c in range(1, t):
            p = parents[c]
            tok[:, c] = prop[before[:, p], tok[:, p], ranks[c]]
            before[:, c] = tok[:, p]
        probs = processed_probs(TOY[before, tok].reshape(n * t, V), **cols)
        fields["input_ids"] = tok.reshape(-1)
        fields["positions"] = ((length - 1)[:, None] + torch.from_numpy(depth)[None, :]).reshape(-1)
        res = sampled_accept(probs, fields, t)
        path = tok.gather(1, res["order"])  # path order: root, accepted drafts, then the rest
        steps = torch.arange(t)
        emitted = torch.where(steps[None, :] < res["n_accepted"][:, None], path.roll(-1, dims=1), 0)
        emitted = torch.where(steps[None, :] == res["n_accepted"][:, None], res["bonus"][:, None], emitted)
        keep = steps[None, :] <= res["n_accepted"][:, None]
        hist.scatter_(1, torch.where(keep, length[:, None] + steps, hist.shape[1] - 1), emitted)
        out.scatter_(1, torch.where(keep, count[:, None] + steps, out.shape[1] - 1).clamp(max=out.shape[1] - 1), emitted)
        length += res["n_accepted"] + 1
        count += res["n_accepted"] + 1
    return out[:, :K]


def plain_joint(params: SamplingParams) -> torch.Tensor:
    """float64 [V, V, V]: the exact distribution of plain sampling's first three tokens."""
    p = reference_probs(TOY.reshape(V * V, V), params.temperature, params.top_k, params.top_p, params.min_p).reshape(V, V, V)
    a, b = PROMPT
    return p[a, b][:, None, None] * p[b][:, :, None] * p


def first_tokens_test(tokens: torch.Tensor, params: SamplingParams):
    cells = tokens[:, 0] * V * V + tokens[:, 1] * V + tokens[:, 2]
    test = chi_square(torch.bincount(cells, minlength=V**K), plain_joint(params))
    assert test.df >= 20, test  # enough cells for the design's power
    return test


CASES = [("chain 1x3", "good", SamplingParams(temperature=0.8, top_p=0.9)),
         ("tree 2x2", "good", SamplingParams(temperature=1.0)),
         ("tree 3x2", "bad", SamplingParams(temperature=0.7, top_k=3, min_p=0.05)),
         ("tree 4x1 + chain", "arbitrary", SamplingParams(temperature=1.2, top_p=0.8))]


def test_the_reference_cells_keep_the_power_statement():
    """The design's df bound holds for every case (at most V**K cells)."""
    for _, _, params in CASES:
        joint = plain_joint(params)
        assert abs(float(joint.sum()) - 1) < 1e-9 and (joint > 0).sum() <= V**K


@pytest.mark.parametrize("shape, kind, params", CASES, ids=[f"{s}-{k}" for s, k, _ in CASES])
def test_speculative_sampling_follows_plain_sampling(shape, kind, params):
    test = first_tokens_test(speculative_first_tokens(shape, kind, params), params)
    assert not test.rejects, test


def test_greedy_speculation_emits_the_greedy_tokens():
    tokens = speculative_first_tokens("tree 2x2", "arbitrary", SamplingParams(), n=64)
    a, b = PROMPT
    want = []
    for _ in range(K):
        a, b = b, int(TOY[a, b].argmax())
        want.append(b)
    assert tokens.tolist() == [want] * 64


@pytest.mark.parametrize("planted, draws", [("accepted without the ratio test", 10_000), ("accepted 2 points too often", N),
                                            ("bonus drawn from p, rejected drafts kept", 10_000)])
def test_a_planted_acceptance_bug_is_caught(monkeypatch, planted, draws):
    ratio, left = rejection.acceptance_probability, rejection.residual
    if planted == "accepted without the ratio test":
        monkeypatch.setattr(rejection, "acceptance_probability", lambda p, mass, repeat: torch.ones_like(p))
    elif planted == "accepted 2 points too often":
        monkeypatch.setattr(rejection, "acceptance_probability", lambda p, mass, repeat: (ratio(p, mass, repeat) + 0.02).clamp(max=1))
    else:
        monkeypatch.setattr(rejection, "residual", lambda p_last, tried: left(p_last, torch.zeros_like(tried)))
    params = SamplingParams(temperature=1.0)
    assert first_tokens_test(speculative_first_tokens("tree 2x2", "good", params, n=draws), params).rejects
