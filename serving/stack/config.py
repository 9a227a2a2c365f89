"""``ServingConfig``: everything that decides how a serving stack is put together, in one value.

SGLang's ``ServerArgs`` and vLLM's ``VllmConfig`` play this part there: one object goes in, a
ready runner comes out. Here ``serving.stack.build_engine(config, model)`` reads it and builds
the pool, the attention backend, the drafter, the model runner (with its CUDA graphs, which it
owns), the defragmenter and the engine, in that order; nothing is attached afterwards. A gate
or test that needs a variant (graphs off, another backend) builds another engine from
``config.but(...)`` over the same model and pool.

Decisions:
- Frozen and checked on construction (``ValueError`` naming the field and what it takes), so a
  bad value is refused before a model is drawn or a byte is allocated.
- The model is not part of the config: callers load it (``serving.model.loading.load_model``, a random
  preset, or weights of their own), then build one or several engines over it.
- Defaults are the command line's: kernel attention, no speculation, no graphs, defragmentation
  measured but off (the CLI turns it on), a pool sized by the caller.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from serving.defrag import DefragPolicy
from serving.graphs.buckets import DEFAULT_BATCH_SIZES

BACKENDS = ("kernel", "reference")
DEFRAG_MODES = ("off", "measure", "on")



@dataclass(frozen=True)
class ServingConfig:
    """How to serve a model.

    backend: "kernel" (the MLA verify kernel) or "reference" (the engine's float32 path).
    speculate: drafter spec (``serving.speculation.drafters.parse_speculate``) or a ``Drafter`` object,
    None: plain decoding.
    pool_slots / pool_dtype / max_requests / max_context: the KV pool (None dtype: the model's,
    bf16 where the kernel backend needs 16-bit rows; None context: the slots, capped by the
    model's positions).
    prefill_chunk, eos_token_ids, record_margins, profile: the engine's (``Engine``).
    cuda_graphs: capture decode / verify / draft steps at ``graph_batch_sizes`` (kernel backend,
    CUDA); capture_graphs=False builds the static buffers without capturing (CPU tests).
    pinned_tiles: (batch, width): the kernel backend plans every step with the tile
    configuration of a graph workspace of that size, without graphs (the replay gate's
    unpadded comparison path).
    defrag: "off", "measure" (fragmentation only) or "on" (compaction between steps), with
    ``defrag_policy`` (None: ``DefragPolicy()``).
    sampling: the engine will serve sampled requests: with ``cuda_graphs``, the target's sampled
    steps are captured too (without it a sampled step runs eagerly). Any engine samples the
    requests that ask for it (``Request.sampling``); greedy ones decode as before.
    seed: the seed source of sampled requests that bring no seed (None: the OS's randomness).
    """

    backend: str = "kernel"
    speculate: object = None  # str | Drafter | None
    pool_slots: int = 4096
    pool_dtype: torch.dtype | None = None
    max_requests: int = 256
    max_context: int | None = None
    prefill_chunk: int = 32768
    eos_token_ids: tuple[int, ...] = ()
    record_margins: bool = False
    profile: bool = False
    cuda_graphs: bool = False
    graph_batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    capture_graphs: bool = True
    pinned_tiles: tuple[int, int] | None = None
    defrag: str = "off"
    defrag_policy: DefragPolicy | None = field(default=None, compare=False)
    sampling: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"Expected backend in {list(BACKENDS)}, got {self.backend!r}")
        if self.pool_slots < 2:
            raise ValueError(f"Expected pool_slots >= 2 (slot 0 is reserved), got {self.pool_slots}")
        if self.max_requests < 1:
            raise ValueError(f"Expected max_requests >= 1, got {self.max_requests}")
        if self.max_context is not None and self.max_context < 1:
            raise ValueError(f"Expected max_context >= 1 or None, got {self.max_context}")
        if self.prefill_chunk < 1:
            raise ValueError(f"Expected prefill_chunk >= 1 (prompt tokens per prefill forward), got {self.prefill_chunk}")
        if self.defrag not in DEFRAG_MODES:
            raise ValueError(f"Expected defrag in {list(DEFRAG_MODES)}, got {self.defrag!r}")
        if not self.graph_batch_sizes or any(int(b) != b or b < 1 for b in self.graph_batch_sizes):
            raise ValueError(f"Expected graph_batch_sizes of positive integers, got {self.graph_batch_sizes!r}")
        if self.cuda_graphs and self.backend != "kernel":
            raise ValueError(f"Expected cuda_graphs with the kernel backend, got backend {self.backend!r}")
        if self.pinned_tiles is not None and (self.backend != "kernel" or self.cuda_graphs):
            raise ValueError("Expected pinned_tiles with the kernel backend and no CUDA graphs, got "
                             f"backend {self.backend!r}, cuda_graphs={self.cuda_graphs}")
        if self.pinned_tiles is not None and (len(self.pinned_tiles) != 2 or min(self.pinned_tiles) < 1):
            raise ValueError(f"Expected pinned_tiles as (batch >= 1, width >= 1), got {self.pinned_tiles!r}")

    def but(self, **changes) -> "ServingConfig":
        """This config with ``changes`` (checked again): a variant over the same model and pool."""
        return dataclasses.replace(self, **changes)
