"""Phase ``backend``: the serving engine.

Modules: ``config`` (config.json), ``weights`` (safetensors), ``rope``, ``model`` (DeepSeek-V3
forward), ``kv_pool`` (page_size=1 pool, allocator, slot table), ``batch`` (ForwardBatch),
``attention`` (kernel and reference backends), ``tree`` / ``drafters`` (tree speculation),
``engine`` (the generation loop), ``random_models`` (seeded presets), ``limits`` (memory
estimates checked before allocating), ``cli``; tensor parallelism: ``sharding`` (which part of
each tensor a rank holds), ``parallel`` (the process group and its collectives),
``sharded_weights`` (a rank's slices of a checkpoint), ``tp_launch`` (torchrun).
"""

from serving.engine.attention import AttentionBackend, KernelBackend, ReferenceBackend
from serving.engine.config import ConfigError, ModelConfig
from serving.engine.drafters import LayerSkipDrafter, NgramDrafter, parse_speculate
from serving.engine.engine import Engine, Request
from serving.engine.kv_pool import KVPool, PoolExhausted
from serving.engine.limits import MemoryLimitError
from serving.engine.model import DeepseekV3Model
from serving.engine.weights import WeightError

__all__ = [
    "AttentionBackend", "KernelBackend", "ReferenceBackend", "ConfigError", "ModelConfig",
    "LayerSkipDrafter", "NgramDrafter", "parse_speculate", "Engine", "Request", "KVPool", "PoolExhausted",
    "DeepseekV3Model", "WeightError", "MemoryLimitError",
]
