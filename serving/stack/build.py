"""One builder from a ``ServingConfig`` to a ready engine.

Order, each piece made once from the config and the pieces before it (SGLang's
``ModelRunner.__init__`` makes its pool, backend and ``CudaGraphRunner(self)`` the same way):

1. the KV pool (``build_pool``; or the caller's, to share rows between engines);
2. the attention backend over that pool, with the model's local heads (its tensor-parallel
   rank's), latent width and softmax scale;
3. the drafter (``parse_speculate``), checked against the model;
4. the model runner: a ``LockstepRunner`` under tensor parallelism, built with its replay
   factory (``serving.graphs.CudaGraphs``) when graphs are on, so it captures and owns them;
5. the defragmenter over the pool (``serving.defrag``), when on or measuring;
6. the engine over the runner, with the defragmenter as its between-steps hook.

Decisions:
- Every engine of the campaign is built here: the command line, every gate and every test
  helper. A variant is another ``build_engine`` with ``config.but(...)``, never an edit of a
  built engine's internals.
- A pool may be shared: the greedy gate decodes one set of cached rows with three engines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from serving.attention.backends import AttentionBackend, KernelBackend, ReferenceBackend
from serving.defrag import Defragmenter
from serving.engine.engine import Engine
from serving.engine.model_runner import ModelRunner
from serving.engine.tp_launch import LockstepRunner
from serving.graphs import CaptureReport, CudaGraphs
from serving.kv.pool import KVPool
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.speculation.drafters import Drafter, check_drafter, parse_speculate
from serving.stack.config import ServingConfig


@dataclass
class ServingStack:
    """What ``build_engine`` made: the engine (its runner, model, pool, backend and drafter
    reachable from it) and the defragmenter (None when ``defrag="off"``)."""

    config: ServingConfig
    engine: Engine
    defrag: Defragmenter | None

    @property
    def runner(self) -> ModelRunner:
        return self.engine.runner

    @property
    def model(self) -> DeepseekV3Model:
        return self.engine.model

    @property
    def pool(self) -> KVPool:
        return self.engine.pool

    @property
    def capture_report(self) -> CaptureReport | None:
        """What capturing the graphs cost (None without graphs)."""
        graphs = self.engine.runner.graphs
        return None if graphs is None else graphs.report


def pool_dtype(config: ServingConfig, model: DeepseekV3Model) -> torch.dtype:
    """The pool's dtype: the config's, else the model's, bf16 where the kernel needs 16-bit rows."""
    if config.pool_dtype is not None:
        return config.pool_dtype
    if config.backend == "kernel" and model.dtype == torch.float32:
        return torch.bfloat16
    return model.dtype


def build_pool(config: ServingConfig, model: DeepseekV3Model) -> KVPool:
    """The KV pool ``config`` asks for, for ``model``'s layers."""
    return model.new_pool(config.pool_slots, pool_dtype(config, model), max_requests=config.max_requests,
                          max_context=config.max_context)


def build_backend(config: ServingConfig, model: DeepseekV3Model, pool: KVPool) -> AttentionBackend:
    """The attention backend over ``pool`` with this rank's heads."""
    args = (pool, model.num_local_heads, model.cfg.kv_lora_rank, model.sm_scale)
    if config.backend == "reference":
        return ReferenceBackend(*args)
    return KernelBackend(*args, pinned_tiles=config.pinned_tiles)


def build_drafter(config: ServingConfig, model: DeepseekV3Model) -> Drafter | None:
    """The drafter of ``config.speculate`` (a spec string, or a drafter object of the caller's:
    a gate's fixed trees), checked against the model (ValueError otherwise)."""
    spec = config.speculate
    drafter = parse_speculate(spec) if spec is None or isinstance(spec, str) else spec
    check_drafter(drafter, model.cfg)  # raises for a drafter the model cannot serve
    return drafter


def build_engine(config: ServingConfig, model: DeepseekV3Model, pool: KVPool | None = None,
                 hooks: Sequence[Callable[[Engine], None]] = ()) -> ServingStack:
    """A ready engine for ``model`` as ``config`` says; ``pool``: share an existing pool's rows
    (None: a new one, ``build_pool``); ``hooks``: more between-steps hooks after the
    defragmenter (a test's pool checker). Raises ValueError for a config the model or device
    cannot serve, before the graphs are captured."""
    if config.cuda_graphs and config.capture_graphs and model.device.type != "cuda":
        raise ValueError(f"Expected a CUDA device for cuda_graphs, got {model.device}")
    if pool is None:
        pool = build_pool(config, model)
    elif pool.kv.shape[0] != model.pool_layers:  # before the backend is built over it (the runner checks again)
        raise ValueError(f"Expected a pool of the model's {model.pool_layers} layers, got one of {pool.kv.shape[0]}")
    backend = build_backend(config, model, pool)
    drafter = build_drafter(config, model)
    replay = CudaGraphs(drafter, tuple(config.graph_batch_sizes), config.capture_graphs, config.sampling) if config.cuda_graphs else None
    if model.tp.size > 1:
        runner: ModelRunner = LockstepRunner(model, pool, backend, model.tp, replay)
    else:
        runner = ModelRunner(model, pool, backend, replay)
    defrag = None if config.defrag == "off" else Defragmenter(pool, config.defrag_policy, enabled=config.defrag == "on")
    engine = Engine(runner, drafter, prefill_chunk=config.prefill_chunk, eos_token_id=config.eos_token_ids,
                    record_margins=config.record_margins, profile=config.profile,
                    between_steps=(() if defrag is None else (defrag,)) + tuple(hooks), seed=config.seed)
    return ServingStack(config, engine, defrag)
