"""Sampling on the device (``serving.sampling``): the counter-based draws against their Python
reference bit for bit, the processed distribution against transformers' own warpers in float64,
plain sampling's tokens against that distribution by chi-square, and the parameters' checks.

Statistical design (``tests.backend.chisquare``): false-alarm rate ALPHA = 1e-3 per test, fixed
seeds. Plain sampling: N = 50000 draws of one row of V = 12 logits, so df <= 11 (critical value
31.3). Any sampler whose distribution is at total variation delta = 0.02 from the reference has
noncentrality lambda = N sum (q - p)^2 / p >= 4 N delta^2 = 80 (Cauchy-Schwarz: the least
detectable such bias spreads in proportion to p), so the test sees it with probability >=
Phi((11 + 80 - 31.3) / sqrt(2 (11 + 160))) = Phi(3.2) > 0.999.
"""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from serving.configs.model import ConfigError
from serving.sampling import SamplingParams
from serving.sampling.params import generation_defaults
from serving.sampling.rng import uniform_reference, uniforms
from serving.sampling.sampler import processed_probs, sample_from, sample_rows
from tests.backend.chisquare import chi_square, reference_probs

V = 12
DRAWS = 50_000
# (temperature, top_k, top_p, min_p): each filter alone, all of them, and a flat and a sharp temperature
SAMPLED = [(1.0, 0, 1.0, 0.0), (0.7, 0, 0.9, 0.0), (1.3, 5, 1.0, 0.0), (1.0, 0, 1.0, 0.1), (0.8, 6, 0.95, 0.05),
           (2.5, 0, 0.5, 0.0), (0.2, 0, 1.0, 0.0)]


def logits_of(rows: int, seed: int = 0, spread: float = 2.0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * spread


def columns(params, n: int) -> dict[str, torch.Tensor]:
    """The per-row parameter tensors of ``params`` (one tuple for every row, or one per row)."""
    rows = params if isinstance(params, list) else [params] * n
    return {"temperature": torch.tensor([p[0] for p in rows], dtype=torch.float32),
            "top_k": torch.tensor([p[1] for p in rows], dtype=torch.int64),
            "top_p": torch.tensor([p[2] for p in rows], dtype=torch.float32),
            "min_p": torch.tensor([p[3] for p in rows], dtype=torch.float32)}


def test_uniforms_equal_the_python_reference_bit_for_bit_and_are_uniform():
    rng = random.Random(0)
    seeds = [rng.randrange(2**63) for _ in range(300)] + [0, 2**63 - 1]
    positions = [rng.randrange(2**40) for _ in range(300)] + [0, 1]
    draws = [rng.randrange(65) for _ in range(302)]
    got = uniforms(torch.tensor(seeds), torch.tensor(positions), torch.tensor(draws))
    want = torch.tensor([uniform_reference(s, p, d) for s, p, d in zip(seeds, positions, draws)], dtype=torch.float64)
    assert torch.equal(got.double(), want)
    # One seed over consecutive positions, and consecutive draws at one position: 64 equal bins.
    for u in (uniforms(torch.tensor(11), torch.arange(DRAWS), 0), uniforms(torch.tensor(11), torch.tensor(5), torch.arange(DRAWS))):
        assert 0 <= float(u.min()) and float(u.max()) < 1
        counts = torch.bincount((u * 64).long(), minlength=64)
        assert not chi_square(counts, torch.full((64,), 1 / 64, dtype=torch.float64)).rejects
    # Neighbouring seeds are not correlated (the engine seeds request i with seed + i).
    a, b = uniforms(torch.arange(DRAWS), torch.tensor(3), 0), uniforms(torch.arange(DRAWS) + 1, torch.tensor(3), 0)
    assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 4 / math.sqrt(DRAWS)


@pytest.mark.parametrize("params", SAMPLED)
def test_the_processed_distribution_is_transformers(params):
    logits = logits_of(64, seed=1)
    got = processed_probs(logits, **columns(params, 64))
    assert torch.allclose(got.double(), reference_probs(logits, *params), atol=2e-6, rtol=0)


def test_each_row_is_processed_with_its_own_parameters():
    logits = logits_of(len(SAMPLED) + 1, seed=2)
    params = SAMPLED + [(0.0, 0, 1.0, 0.0)]
    got = processed_probs(logits, **columns(params, len(params)))
    want = torch.cat([reference_probs(logits[i : i + 1], *p) for i, p in enumerate(params)])
    assert torch.allclose(got.double(), want, atol=2e-6, rtol=0)


def test_greedy_rows_are_the_first_maximum_whatever_the_draw():
    logits = torch.tensor([[1.0, 3.0, 3.0, -2.0], [0.5, 0.5, 0.1, 0.0]])
    cols = columns((0.0, 0, 1.0, 0.0), 2)
    probs = processed_probs(logits, **cols)
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    for seed in range(50):
        tokens = sample_rows(logits, **cols, seed=torch.full((2,), seed), position=torch.tensor([4, 9]))
        assert tokens.tolist() == [1, 0]


@pytest.mark.parametrize("params", SAMPLED)
def test_plain_sampling_follows_the_processed_softmax(params):
    logits = logits_of(1, seed=3).expand(DRAWS, V)
    tokens = sample_rows(logits, **columns(params, DRAWS), seed=torch.arange(DRAWS), position=torch.full((DRAWS,), 7))
    test = chi_square(torch.bincount(tokens, minlength=V), reference_probs(logits[:1], *params)[0])
    assert not test.rejects, test


@pytest.mark.parametrize("planted", ["top_p ignored", "temperature squared", "2% of draws uniform"])
def test_a_biased_sampler_is_caught(planted):
    """Planted bugs: a filter dropped, the temperature applied twice, and a 2% contamination
    (total variation 0.02 times the distance to uniform: here about 0.012)."""
    params = (0.8, 0, 0.9, 0.0)
    logits = logits_of(1, seed=3).expand(DRAWS, V)
    cols = columns(params, DRAWS)
    if planted == "top_p ignored":
        cols["top_p"] = torch.ones(DRAWS)
    elif planted == "temperature squared":
        cols["temperature"] = cols["temperature"] ** 2
    tokens = sample_rows(logits, **cols, seed=torch.arange(DRAWS), position=torch.full((DRAWS,), 7))
    if planted == "2% of draws uniform":
        u = uniforms(torch.arange(DRAWS), torch.tensor(99), 0)
        tokens = torch.where(u < 0.02, (u * 50 * V).long().clamp(max=V - 1), tokens)
    assert chi_square(torch.bincount(tokens, minlength=V), reference_probs(logits[:1], *params)[0]).rejects


def test_a_draw_never_lands_on_a_token_of_zero_mass():
    """u times the total can round up to the total: the draw stays on the last token with mass."""
    probs = torch.tensor([[0.0, 0.75, 0.0, 0.0], [0.3, 0.0, 0.7, 0.0], [0.0, 0.0, 0.0, 2e-38]])
    top = torch.full((3,), 1 - 2**-24)
    assert sample_from(probs, top).tolist() == [1, 2, 3]
    assert sample_from(probs, torch.zeros(3)).tolist() == [1, 0, 3]


@pytest.mark.parametrize("values, message", [
    (dict(temperature=-0.5), "Expected temperature >= 0 (0: greedy), got -0.5"),
    (dict(temperature=float("nan")), "Expected temperature as a finite number, got nan"),
    (dict(temperature=float("inf")), "Expected temperature as a finite number, got inf"),
    (dict(top_p=0.0), "Expected top_p in (0, 1] (1: off), got 0.0"),
    (dict(top_p=1.01), "Expected top_p in (0, 1] (1: off), got 1.01"),
    (dict(top_k=-1), "Expected top_k as an integer >= 0 (0: off), got -1"),
    (dict(top_k=2.0), "Expected top_k as an integer >= 0 (0: off), got 2.0"),
    (dict(min_p=1.5), "Expected min_p in [0, 1] (0: off), got 1.5"),
    (dict(seed=-1), "Expected seed as an integer in [0, 2**63), got -1"),
    (dict(seed=2**63), "Expected seed as an integer in [0, 2**63), got 9223372036854775808"),
])
def test_bad_parameters_are_refused_with_their_name(values, message):
    with pytest.raises(ValueError) as info:
        SamplingParams(**values)
    assert str(info.value) == message


@pytest.mark.parametrize("config", [
    {}, {"do_sample": True}, {"do_sample": True, "temperature": 0.6, "top_p": 0.95},
    {"do_sample": False, "temperature": 0.6, "top_k": 20}, {"temperature": 0.7, "min_p": 0.1},
    {"do_sample": True, "temperature": 0.9, "top_k": 40, "top_p": 0.8, "min_p": 0.05, "eos_token_id": 3},
])
def test_generation_config_defaults_as_transformers_reads_them(tmp_path, config):
    """do_sample decides greedy (temperature 0) as transformers' generate does; the file's own
    temperature, top-p, top-k and min-p are the defaults, and keys it does not set stay off."""
    from transformers import GenerationConfig

    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    ours = SamplingParams(**generation_defaults(tmp_path))
    theirs = GenerationConfig.from_pretrained(tmp_path)
    assert ours.samples == bool(theirs.do_sample)
    if theirs.do_sample:
        assert ours.temperature == pytest.approx(theirs.temperature or 1.0)  # unset: generate's 1.0
    for key, off in (("top_p", 1.0), ("top_k", 0), ("min_p", 0.0)):
        assert getattr(ours, key) == pytest.approx(config.get(key, off))


def test_no_generation_config_is_greedy_and_a_bad_one_names_file_and_key(tmp_path):
    assert generation_defaults(tmp_path) == {}
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "top_p": 1.5}))
    with pytest.raises(ConfigError) as info:
        generation_defaults(tmp_path)
    assert str(info.value) == f"Expected top_p in {tmp_path / 'generation_config.json'} in (0, 1] (1: off), got 1.5"
