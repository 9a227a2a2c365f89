"""A request's sampling parameters, and the defaults a checkpoint's ``generation_config.json`` gives.

Conventions (transformers' ``GenerationConfig``, OpenAI-style APIs):

- ``temperature`` 0 is greedy: the argmax, bit for bit as the engine decodes without sampling;
  > 0 divides the logits before the filters below.
- ``top_k`` keeps the k most likely tokens (ties with the k-th kept); 0: off.
- ``top_p`` keeps the smallest set of most likely tokens whose mass reaches ``top_p``
  (transformers' rule: drop the ones whose ascending cumulative mass is <= 1 - top_p; the most
  likely one always stays); 1: off.
- ``min_p`` drops tokens less likely than ``min_p`` times the most likely one; 0: off.
- ``seed``: the request's draws (``serving.sampling.rng``); None: the engine draws one when it
  admits the request.

Decisions:
- The filters apply in transformers' order: temperature, top-k, top-p, min-p, each to what the
  one before it kept.
- ``generation_config.json``: ``do_sample`` false or absent means greedy (``temperature`` 0),
  as ``transformers.generate`` reads it; with ``do_sample`` true, its ``temperature`` (1.0 when
  absent). ``top_p``, ``top_k`` and ``min_p`` are defaults when the file sets them; keys it does
  not set stay off (not transformers' ``top_k=50`` fallback: the file's own values only, as
  vLLM reads it).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from serving.configs.model import ConfigError, check_folder, read_json

FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed")
SEED_LIMIT = 2**63


def check_values(values: dict, names: dict[str, str] | None = None) -> None:
    """ValueError naming the first value out of range: ``values`` maps fields of ``FIELDS`` (any
    subset) to values; ``names`` maps a field to the name the error should use (a flag, a key)."""
    names = names or {}

    def bad(field: str, want: str) -> ValueError:
        return ValueError(f"Expected {names.get(field, field)} {want}, got {values[field]!r}")

    for field in ("temperature", "top_p", "min_p"):
        if field in values:
            v = values[field]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(field, "as a finite number")
    if "temperature" in values and values["temperature"] < 0:
        raise bad("temperature", ">= 0 (0: greedy)")
    if "top_p" in values and not 0 < values["top_p"] <= 1:
        raise bad("top_p", "in (0, 1] (1: off)")
    if "min_p" in values and not 0 <= values["min_p"] <= 1:
        raise bad("min_p", "in [0, 1] (0: off)")
    if "top_k" in values:
        v = values["top_k"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise bad("top_k", "as an integer >= 0 (0: off)")
    if values.get("seed") is not None:
        v = values["seed"]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < SEED_LIMIT:
            raise bad("seed", "as an integer in [0, 2**63)")


@dataclass(frozen=True)
class SamplingParams:
    """How a request chooses its tokens (see the module docstring); checked on construction."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        check_values({f: getattr(self, f) for f in FIELDS})

    @property
    def samples(self) -> bool:
        """Whether the request samples (temperature > 0); else it is greedy."""
        return self.temperature > 0

    def describe(self) -> str:
        if not self.samples:
            return "greedy"
        parts = [f"temperature {self.temperature:g}"]
        parts += [f"top-p {self.top_p:g}"] if self.top_p < 1 else []
        parts += [f"top-k {self.top_k}"] if self.top_k else []
        parts += [f"min-p {self.min_p:g}"] if self.min_p else []
        return "sampled (" + ", ".join(parts) + (f", seed {self.seed}" if self.seed is not None else "") + ")"


GREEDY = SamplingParams()


def generation_defaults(folder: str | Path) -> dict:
    """The sampling defaults of a model folder's ``generation_config.json`` (see the module
    docstring): a dict of some of ``temperature``, ``top_p``, ``top_k``, ``min_p``; empty without
    the file. ConfigError naming the file and key for a value out of range."""
    path = check_folder(folder) / "generation_config.json"
    if not os.path.lexists(path):
        return {}
    raw = read_json(path)
    do_sample = raw.get("do_sample", False)
    if not isinstance(do_sample, bool):
        raise ConfigError(f"{path}: Expected do_sample to be true or false, got {do_sample!r}")
    out = {key: raw[key] for key in ("top_p", "top_k", "min_p") if raw.get(key) is not None}
    temperature = raw.get("temperature")
    out["temperature"] = (1.0 if temperature is None else temperature) if do_sample else 0.0
    try:
        check_values(out, {k: f"{k} in {path}" for k in out})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return {k: v if k == "top_k" else float(v) for k, v in out.items()}
