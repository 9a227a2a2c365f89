"""A model from a Hugging Face folder or a seeded random preset, its memory checked first.

What the command line, the builder's callers, gates and tests share: ``model_config`` reads and
checks a config without loading anything, ``check_memory`` refuses (``MemoryLimitError``) an
engine that would not fit before a byte is allocated, ``load_model`` loads the weights (this
rank's part under tensor parallelism) into a ``DeepseekV3Model``.
"""

from __future__ import annotations

import torch

from serving.configs.model import ModelConfig
from serving.model import limits
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.model.presets import preset_config, random_model
from serving.model.sharded_weights import load_sharded_weights
from serving.model.weights import load_weights, served_config
from serving.parallel.group import TensorParallel
from serving.parallel.sharding import rank_config


def model_config(folder: str | None = None, preset: str | None = None) -> ModelConfig:
    """The config of the random ``preset`` or of the model ``folder`` (read and checked; nothing
    loaded). Exactly one of the two is given."""
    if (folder is None) == (preset is None):
        raise ValueError(f"Expected a model folder or a random preset, got folder={folder!r}, preset={preset!r}")
    return preset_config(preset) if preset else served_config(folder, ModelConfig.from_folder(folder))


def check_memory(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, tp: TensorParallel | None = None,
                 **sizes) -> None:
    """``limits.check`` of what an engine over ``cfg`` would allocate (``limits.estimate``'s
    keyword ``sizes``: pool, prompts, chunk, drafts); under ``tp``, of this rank's part."""
    estimated = cfg if tp is None else rank_config(cfg, tp.size)
    limits.check(limits.estimate(estimated, device, dtype, **sizes))


def load_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, *, folder: str | None = None,
               preset: str | None = None, seed: int = 0, tp: TensorParallel | None = None) -> DeepseekV3Model:
    """The random ``preset`` drawn from ``seed``, or the ``folder``'s weights loaded (this rank's
    part under ``tp``), as a ``DeepseekV3Model`` of ``cfg`` on ``device``."""
    if preset:
        return random_model(preset, device, dtype, seed, tp=tp)
    weights = load_weights(folder, cfg, dtype, device) if tp is None else load_sharded_weights(folder, cfg, dtype, device, tp)
    return DeepseekV3Model(cfg, weights, device, dtype, tp)
