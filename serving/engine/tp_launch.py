"""``torchrun --nproc-per-node N -m serving generate ...`` (or ``profile``): every rank runs the
same generation over its shards; rank 0 prints.

Decisions:
- Every rank runs the whole engine (scheduling, drafting, acceptance) on replicated state and
  gets the same logits from the collectives, so every host decision is the same without being
  sent anywhere. ``LockstepRunner`` checks that with one small collective per step when
  ``TensorParallel.check_steps`` is on; the outputs of the run are always compared at the end.
- Failures (see ``serving.parallel.group``): an error raised on every rank at an agreement
  point (``RankFailed``) or a divergence (``LockstepError``) is printed once, by rank 0, and
  every rank exits non-zero; any other error may be this rank's alone, in the middle of the
  forward's collectives, so the rank prints it with its rank, aborts its process group and
  exits at once (torchrun then stops the other ranks).
- Exit codes as in one process: 2 for a bad input (a ValueError on every failed rank), 1 for
  any other failure. The flags and the device are checked on each rank before it joins the
  process group (a rank cannot join without its device): a usage error there is one process's
  line and exit code 2 on every rank, with no process group to wait for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch

from serving.attention.backends import AttentionBackend
from serving.device.select import resolve_device
from serving.engine.model_runner import ModelRunner, StepResult
from serving.kv.batch import StepBatch
from serving.kv.pool import KVPool
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.parallel.group import (
    LockstepError,
    RankFailed,
    TensorParallel,
    init_from_env,
)


def step_tokens(result: StepResult) -> list[int]:
    """What a step decided, flattened: each row's token, accepted paths and bonus tokens, top-k."""
    values = [t for row in result.pred for t in row]
    if result.n_accepted is not None:
        values += result.n_accepted + result.bonus + [c for path in result.path for c in path]
    if result.topk is not None:
        values += [t for entry in result.topk for row in entry for t in row]
    return values


class LockstepRunner(ModelRunner):
    """A ``ModelRunner`` for one rank of ``tp``: with ``tp.check_steps``, every step's decisions
    (and every prefill's greedy token) are compared across the ranks after the step."""

    def __init__(self, model: DeepseekV3Model, pool: KVPool, backend: AttentionBackend, tp: TensorParallel,
                 replay=None) -> None:
        self.tp = tp
        self.steps = 0
        super().__init__(model, pool, backend, replay)

    def run(self, step: StepBatch, then=None) -> StepResult:
        result = super().run(step, then)
        self.steps += 1
        if self.tp.check_steps:
            self.tp.assert_same(step_tokens(result), f"the tokens of step {self.steps} ({step.kind})")
        return result

    def extend(self, step: StepBatch) -> torch.Tensor | None:
        logits = super().extend(step)
        if self.tp.check_steps and logits is not None:
            self.tp.assert_same(logits.argmax(dim=-1).tolist(), "a prefill's greedy tokens")
        return logits


def say(line: str) -> None:
    """One line on stderr in one write, so the ranks' lines do not interleave."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def device_type(requested: str | None, local_rank: int | None = None) -> str:
    """The device type the ranks run on: ``--device``'s (its index is LOCAL_RANK's under torchrun),
    else CUDA when there is a GPU; ValueError (one process's message) for another, or for CUDA
    without a GPU for ``local_rank`` (default: ``$LOCAL_RANK``)."""
    kind = requested.split(":")[0] if requested else ("cuda" if torch.cuda.is_available() else "cpu")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"Expected --device cpu or cuda under torchrun, got {requested!r}")
    if kind == "cuda":
        resolve_device("cuda")  # no GPU at all: the line one process prints
        local_rank = int(os.environ.get("LOCAL_RANK", 0)) if local_rank is None else local_rank
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"Expected a GPU for each rank of --device cuda, got {torch.cuda.device_count()} visible for "
                             f"local rank {local_rank}; start at most that many ranks per node (--nproc-per-node)")
    return kind


def generated_tokens(result: dict) -> list[int]:
    """The tokens of a ``generate`` result, every request's output then -1."""
    return [t for r in result["requests"] for t in r["output"] + [-1]]


def run_on_ranks(args, generate: Callable[..., dict], tokens: Callable[[dict], list[int]] = generated_tokens,
                 check: Callable[..., None] | None = None) -> dict | None:
    """Join torchrun's process group and run ``generate(args, tp)`` on every rank.

    ``tokens``: what the ranks must agree on in the result (compared across them at the end).
    ``check``: the command's flag check (ValueError), run with the device check before joining.
    Returns the result on rank 0 and None on the others; on a failure, prints it (see the
    module docstring) and raises SystemExit with a non-zero code on every rank.
    """
    try:
        if check is not None:
            check(args)
        kind = device_type(args.device)
    except ValueError as exc:  # every rank finds the same: one process's line, on each rank
        say(f"error: {exc}")
        raise SystemExit(2) from exc
    try:
        tp = init_from_env(kind)
    except Exception as exc:  # noqa: BLE001 - the one-line message of this rank's failure to start
        say(f"error: tensor-parallel start-up failed: {type(exc).__name__}: {exc}")
        raise SystemExit(2 if isinstance(exc, ValueError) else 1) from exc
    code = 0
    try:
        result = generate(args, tp)
        tp.assert_same(tokens(result), "the generated tokens")
        result["tensor_parallel"] = tp.size
    except (RankFailed, LockstepError) as exc:  # raised on every rank at the same point
        if tp.rank == 0:
            say(f"error: {exc}")
        code = exc.exit_code if isinstance(exc, RankFailed) else 1
    except Exception as exc:  # noqa: BLE001 - possibly this rank's alone: do not wait for the others
        say(f"error: rank {tp.rank} of {tp.size}: {type(exc).__name__}: {exc}")
        tp.abort()
        raise SystemExit(2 if isinstance(exc, ValueError) else 1) from exc
    finally:
        tp.close()
    if code:
        raise SystemExit(code)
    return result if tp.rank == 0 else None
