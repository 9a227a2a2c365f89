"""Tensor parallelism over the ranks of one ``torch.distributed`` process group.

``TensorParallel`` is what the model and the launcher hold: this rank's place (rank, size,
device), the two collectives of the forward (``all_reduce`` of a layer's partial sums,
``gather_vocab`` of the vocab-sharded logits) and the host-side checks that keep the ranks
together (``agree`` at a failure point, ``assert_same`` on chosen tokens).
``TensorParallel()`` is one process: every collective is the identity, so the single-process
engine runs exactly the ops it ran before.

Decisions:
- The forward's collectives are plain ``torch.distributed`` calls on the current stream
  (``async_op=False``): ProcessGroupNCCL runs them on its own stream, ordered after and before
  the current stream's work by events, and records no watchdog work while the stream is
  capturing (PyTorch >= 2.1), so a CUDA graph of ``ModelRunner.forward_step`` holds them.
  A communicator cannot be created inside a capture: ``init_from_env`` binds the process group
  to the device and runs a warm-up all-reduce and all-gather before anything is captured.
  Ranks must capture the same graphs in the same order and replay them in lockstep (they do:
  every host decision is a function of replicated state).
- NVLink multicast (NVLS) stays off: ``NCCL_NVLS_ENABLE=0`` and
  ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` are set (where unset) before the process group exists.
- Logits are gathered in the model's dtype and widened afterwards (bf16 -> fp32 is exact),
  half the bytes of a float32 gather.
- ``agree`` exchanges each rank's error message at a point every rank reaches (after loading
  its shards): a rank that failed alone then ends every rank with its message instead of
  leaving the others blocked in the forward's first collective. An error in the middle of the
  forward has no such point: that rank aborts its process group and exits, and the others end
  through torchrun (which stops every worker when one fails) or their collective's failure or
  timeout.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from serving.device.timing import IntervalTimer
from serving.parallel.sharding import Shard, even_range, take_shard, vocab_range

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT_ENV = "SERVING_TP_TIMEOUT_S"  # seconds a collective (and the start-up rendezvous) may wait
CHECK_ENV = "SERVING_TP_CHECK_STEPS"  # "1": compare every step's tokens across the ranks
DEFAULT_TIMEOUT_S = 600.0

# torch >= 2.12 names it all_gather_single; older versions all_gather_into_tensor (same call).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class RankFailed(RuntimeError):
    """Raised on every rank at an ``agree`` point when any rank failed before it.

    failures: (rank, message) of each failed rank; usage: every failure was a ValueError (a bad
    input, exit code 2, as in one process), else an error of the run (exit code 1).
    """

    def __init__(self, what: str, failures: list[tuple[int, str]], usage: bool) -> None:
        self.failures, self.usage = failures, usage
        detail = "; ".join(f"rank {r}: {m}" for r, m in failures)
        super().__init__(f"{what} failed on {len(failures)} rank(s): {detail}")

    @property
    def exit_code(self) -> int:
        return 2 if self.usage else 1


class LockstepError(RuntimeError):
    """The ranks chose different tokens: raised on every rank by ``assert_same``."""


@dataclass
class TensorParallel:
    """This rank's place in a tensor-parallel group and the group's collectives.

    rank, size: this rank and the number of ranks; group: the process group (None for one
    process); device: this rank's device; check_steps: compare every step's chosen tokens
    across the ranks (a debug and test mode: one small collective and host sync per step).
    ``timer`` times the forward's collectives when enabled (eager steps only, like the
    attention backend's timer: events cannot be timed inside a capture).
    """

    rank: int = 0
    size: int = 1
    group: dist.ProcessGroup | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    check_steps: bool = False
    timer: IntervalTimer | None = None

    def __post_init__(self) -> None:
        self.device = torch.device(self.device)
        if self.timer is None:
            self.timer = IntervalTimer(self.device)
        if self.size > 1 and self.group is None:
            raise ValueError(f"Expected a process group for {self.size} ranks, got none")

    # ---- this rank's part -----------------------------------------------------------------

    def heads(self, num_heads: int) -> range:
        """The attention heads this rank computes."""
        return range(*even_range(num_heads, self.size, self.rank, "num_attention_heads"))

    def experts(self, num_experts: int | None) -> range:
        """The routed experts this rank holds (expert parallelism); empty without experts."""
        return range(*even_range(num_experts, self.size, self.rank, "n_routed_experts")) if num_experts else range(0)

    def vocab_rows(self, head: torch.Tensor, vocab: int) -> torch.Tensor:
        """This rank's rows of a full ``head`` [vocab, hidden] (tied embeddings), zero-padded to
        ``ceil(vocab / size)`` rows; the whole head for one process."""
        if self.size == 1:
            return head
        start, stop, per = vocab_range(vocab, self.size, self.rank)
        return take_shard(head, Shard(0, start, stop, pad_to=per))

    # ---- the forward's collectives (capturable) -------------------------------------------

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` (a layer's partial output, [N, hidden]) over the ranks, in place; returns it."""
        if self.size == 1:
            return x
        self.timer.start()
        dist.all_reduce(x, group=self.group)
        self.timer.stop()
        return x

    def gather_vocab(self, logits: torch.Tensor, vocab: int) -> torch.Tensor:
        """Full logits [M, vocab] from every rank's vocab part [M, ceil(vocab / size)]."""
        if self.size == 1:
            return logits
        if logits.shape[0] == 0:  # every rank has the same rows: no collective for none
            return logits.new_empty(0, vocab)
        m, per = logits.shape
        out = logits.new_empty(self.size * m, per)
        self.timer.start()
        _all_gather(out, logits.contiguous(), group=self.group)
        self.timer.stop()
        return out.view(self.size, m, per).transpose(0, 1).reshape(m, self.size * per)[:, :vocab]

    # ---- host-side checks (eager, every rank at the same point) ---------------------------

    def agree(self, error: BaseException | None, what: str) -> None:
        """Every rank calls this at the same point with its own error (None: it succeeded).
        Raises RankFailed on every rank when any rank failed; one process re-raises its error."""
        if self.size == 1:
            if error is not None:
                raise error
            return
        mine = None if error is None else (isinstance(error, ValueError), f"{type(error).__name__}: {error}")
        everyone: list = [None] * self.size
        dist.all_gather_object(everyone, mine, group=self.group)
        failed = [(r, m) for r, m in enumerate(everyone) if m is not None]
        if failed:
            raise RankFailed(what, [(r, m[1]) for r, m in failed], usage=all(m[0] for _, m in failed)) from error

    def assert_same(self, values: list[int], what: str) -> None:
        """LockstepError on every rank unless every rank passes the same ``values``."""
        if self.size == 1:
            return
        digest = int.from_bytes(hashlib.blake2b(repr(values).encode(), digest_size=7).digest(), "little")
        both = torch.tensor([digest, -digest], dtype=torch.int64, device=self.device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.group)
        if int(both[0]) != -int(both[1]):
            digests: list = [None] * self.size
            dist.all_gather_object(digests, digest, group=self.group)
            differ = [r for r in range(self.size) if digests[r] != digests[0]]
            raise LockstepError(f"the ranks diverged: ranks {differ} differ from rank 0 on {what}")

    def same_int(self, value: int) -> int:
        """Rank 0's ``value`` (an int64) on every rank: a choice one rank makes for all (a random
        seed); one process: ``value``."""
        if self.size == 1:
            return value
        x = torch.tensor([value if self.rank == 0 else 0], dtype=torch.int64, device=self.device)
        dist.all_reduce(x, group=self.group)  # a sum to which only rank 0 contributes
        return int(x[0])

    # ---- life cycle -----------------------------------------------------------------------

    def warm_up(self) -> None:
        """One all-reduce and one all-gather: creates the communicator before any graph capture
        and checks that the group sums."""
        if self.size == 1:
            return
        x = torch.ones(1, device=self.device)
        dist.all_reduce(x, group=self.group)
        out = torch.empty(self.size, device=self.device)
        _all_gather(out, x, group=self.group)
        if int(out.sum()) != self.size * self.size:
            raise RuntimeError(f"Expected the warm-up collectives to sum to {self.size * self.size}, got {out.tolist()}")

    def close(self) -> None:
        """Destroy the process group (every rank, on the way out of a run that ended together)."""
        if self.group is not None and dist.is_initialized():
            dist.destroy_process_group()
            self.group = None

    def abort(self) -> None:
        """Abort the process group without waiting for the other ranks (a rank failing alone)."""
        if self.group is None or not dist.is_initialized():
            return
        self.group = None
        try:  # private in torch 2.x; without it the process exits with its communicator open
            from torch.distributed.distributed_c10d import _abort_process_group

            _abort_process_group()
        except Exception:  # noqa: BLE001 - already failing: the exit that follows matters, not this
            pass


def launched_by_torchrun(env: dict | None = None) -> bool:
    """Whether this process is one rank of a ``torchrun`` launch (its environment variables)."""
    env = os.environ if env is None else env
    return all(k in env for k in TORCHRUN_ENV)


def init_from_env(device_type: str, timeout_s: float | None = None, check_steps: bool | None = None) -> TensorParallel:
    """Join the process group torchrun describes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``/``PORT``): NCCL on GPU ``LOCAL_RANK`` for ``device_type`` "cuda", gloo on the
    CPU otherwise. Collectives wait at most ``timeout_s`` (default ``$SERVING_TP_TIMEOUT_S`` or
    600 s); ``check_steps`` defaults to ``$SERVING_TP_CHECK_STEPS == "1"``."""
    env = os.environ
    rank, size, local_rank = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
    timeout = timedelta(seconds=float(timeout_s if timeout_s is not None else env.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
    for key, value in NCCL_ENV.items():
        env.setdefault(key, value)
    if device_type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"Expected a GPU for local rank {local_rank}, got {torch.cuda.device_count()} visible")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    tp = TensorParallel(rank, size, dist.group.WORLD, device, env.get(CHECK_ENV) == "1" if check_steps is None else check_steps)
    tp.warm_up()
    return tp
