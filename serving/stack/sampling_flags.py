"""``serving generate``'s sampling flags: ``--temperature``, ``--top-p``, ``--top-k``, ``--min-p``
and ``--sampling-seed``, their defaults from the model folder's ``generation_config.json``
(``serving.sampling.params``), and each request's ``SamplingParams``.

Decisions:
- A flag left out takes the folder's default, else the engine's (greedy; top-p, top-k and
  min-p off). ``--temperature 0`` is greedy whatever the folder says.
- Seeds: request i draws with ``--sampling-seed`` + i (modulo 2**63), so a batch of one prompt
  repeated samples different continuations and a rerun with the same seed repeats them. Without
  the flag the base seed is drawn once per run (under ``torchrun``, by rank 0 for every rank:
  the ranks must draw alike) and printed, so a run can be repeated.
"""

from __future__ import annotations

import argparse
import dataclasses
import secrets

from serving.parallel.group import TensorParallel
from serving.sampling.params import (
    SEED_LIMIT,
    SamplingParams,
    check_values,
    generation_defaults,
)

FLAGS = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p", "seed": "--sampling-seed"}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The sampling flags of ``generate``."""
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature; 0 is greedy (default: the model folder's generation_config.json, else 0)")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass in (0, 1]; 1: off (default: the folder's, else 1)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens; 0: off (default: the folder's, else 0)")
    parser.add_argument("--min-p", type=float, default=None,
                        help="drop tokens less likely than min-p times the most likely; 0: off (default: the folder's, else 0)")
    parser.add_argument("--sampling-seed", type=int, default=None,
                        help="seed of request 0's draws (request i: seed + i); default: drawn at random and reported")


def given(args: argparse.Namespace) -> dict:
    """The sampling flags given on the command line, by field."""
    values = {field: getattr(args, "sampling_seed" if field == "seed" else field) for field in FLAGS}
    return {field: v for field, v in values.items() if v is not None}


def check_flags(args: argparse.Namespace) -> None:
    """ValueError naming the first sampling flag out of range (negative temperature, top-p outside
    (0, 1], top-k < 0, min-p outside [0, 1], NaN or infinity, a seed outside [0, 2**63))."""
    check_values(given(args), FLAGS)


def base_params(args: argparse.Namespace, folder: str | None) -> SamplingParams:
    """The run's parameters: the flags over the folder's ``generation_config.json`` defaults (no seed yet)."""
    values = generation_defaults(folder) if folder else {}
    values.update({k: v for k, v in given(args).items() if k != "seed"})
    return SamplingParams(**values)


def request_params(base: SamplingParams, count: int, seed: int | None, tp: TensorParallel | None = None) -> tuple[list[SamplingParams], int | None]:
    """``count`` requests' parameters and the base seed they use (None when greedy): ``seed``, else
    one drawn here (under ``tp``, rank 0's)."""
    if not base.samples:
        return [base] * count, None
    if seed is None:
        seed = secrets.randbelow(SEED_LIMIT)
        if tp is not None:
            seed = tp.same_int(seed)
    return [dataclasses.replace(base, seed=(seed + i) % SEED_LIMIT) for i in range(count)], seed
