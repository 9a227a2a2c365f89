"""DeepSeek-V3 model configuration read from a Hugging Face ``config.json``.

Decisions:
- Keys are checked against a list of known keys; an unknown key is an error naming it, so a
  config meant for another architecture (or a newer DeepSeek feature) fails loudly at load
  instead of producing wrong tokens.
- Both rope spellings are accepted: transformers v5's ``rope_parameters`` and the original
  ``rope_theta`` + ``rope_scaling`` of DeepSeek's own checkpoints.
- ``quantization_config``: DeepSeek's block FP8 is served (``quantization``); every other
  format is refused with the key named. Routing other than sigmoid scores with ``noaux_tc``
  top-k is refused too.
- Values are checked before use: sizes are positive integers (booleans refused), floats such as
  ``rms_norm_eps`` and ``routed_scaling_factor`` finite and positive, flags booleans, so a NaN
  or -1 is a ``ConfigError`` naming the key instead of silently wrong tokens.
- Files are read defensively: the folder must be a directory, ``config.json`` a regular file of
  at most ``MAX_JSON_BYTES`` holding one JSON object; every error names the path.
- ``num_nextn_predict_layers`` (DeepSeek's multi-token-prediction module, the ``mtp:``
  drafter) is read; the first module is served, as SGLang and vLLM do.
- The end-of-sequence ids follow transformers' ``generate``: ``generation_config.json``'s
  ``eos_token_id`` when that file exists (absent key: none), else ``config.json``'s.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from serving.configs.quantization import (
    BlockFP8Config,
    QuantizationError,
    parse_quantization,
)

ARCHITECTURES = ("DeepseekV3ForCausalLM",)
MODEL_TYPES = ("deepseek_v3",)

# Keys that carry no meaning for inference here (training, tokenization, bookkeeping).
IGNORED_KEYS = frozenset(
    {
        "architectures", "model_type", "transformers_version", "dtype", "torch_dtype", "use_cache",
        "bos_token_id", "eos_token_id", "pad_token_id", "attention_dropout", "initializer_range",
        "pretraining_tp", "output_router_logits", "router_aux_loss_coef", "aux_loss_alpha", "seq_aux",
        "auto_map", "ep_size", "moe_layer_freq", "head_dim", "qk_head_dim",
        "num_key_value_heads", "tie_word_embeddings", "_name_or_path", "return_dict", "output_hidden_states",
        "output_attentions", "id2label", "label2id", "problem_type", "chunk_size_feed_forward",
        "is_encoder_decoder", "tokenizer_class", "max_window_layers", "use_sliding_window", "sliding_window",
    }
)
MODEL_KEYS = frozenset(
    {
        "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
        "num_attention_heads", "n_shared_experts", "n_routed_experts", "routed_scaling_factor",
        "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim",
        "n_group", "topk_group", "num_experts_per_tok", "first_k_dense_replace", "norm_topk_prob",
        "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
        "rope_parameters", "rope_interleave", "attention_bias", "scoring_func", "topk_method",
        "quantization_config", "num_nextn_predict_layers",
    }
)
ROPE_TYPES = ("default", "yarn")
MAX_JSON_BYTES = 16 << 20  # a DeepSeek-V3 config.json is about 2 KB

POSITIVE_INTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "max_position_embeddings",
                 "n_group", "topk_group")
OPTIONAL_POSITIVE_INTS = ("q_lora_rank", "n_routed_experts")  # null: no q LoRA / a dense model
NON_NEGATIVE_INTS = ("moe_intermediate_size", "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace",
                     "num_nextn_predict_layers")
POSITIVE_FLOATS = ("rms_norm_eps", "routed_scaling_factor")
BOOLS = ("norm_topk_prob", "rope_interleave", "attention_bias", "tie_word_embeddings")


class ConfigError(ValueError):
    """A config.json the engine cannot serve; the message names the offending key."""


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters. rope_type: "default" or "yarn"; yarn fields as in DeepSeek-V3."""

    rope_type: str = "default"
    theta: float = 10000.0
    factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class ModelConfig:
    """The architecture hyper-parameters the engine uses (names as in config.json)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    moe_intermediate_size: int = 0
    n_routed_experts: int | None = None
    n_shared_experts: int = 0
    num_experts_per_tok: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    first_k_dense_replace: int = 0
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_interleave: bool = True
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    num_nextn_predict_layers: int = 0
    rope: RopeConfig = field(default_factory=RopeConfig)
    quantization: BlockFP8Config | None = None  # block-FP8 weights (DeepSeek's layout); None: unquantized

    @property
    def latent_dim(self) -> int:
        """Width of one cached row: kv_lora_rank + qk_rope_head_dim (576 for DeepSeek-V3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def has_mtp(self) -> bool:
        """Whether the checkpoint carries a multi-token-prediction module (DeepSeek's MTP, at
        layer index ``num_hidden_layers``); only the first of several is served."""
        return self.num_nextn_predict_layers > 0

    @property
    def mtp_layer(self) -> int:
        """The MTP module's layer index (its weights' ``model.layers.{N}.`` and its pool layer)."""
        return self.num_hidden_layers

    @property
    def block_layers(self) -> int:
        """Decoder blocks the engine holds: the target's, and the MTP module's when it has one."""
        return self.num_hidden_layers + (1 if self.has_mtp else 0)

    def is_moe_layer(self, layer: int) -> bool:
        return bool(self.n_routed_experts) and layer >= self.first_k_dense_replace

    @staticmethod
    def from_dict(raw: dict) -> "ModelConfig":
        """Validate a parsed config.json; raise ConfigError naming the first bad key."""
        archs = raw.get("architectures") or []
        if not isinstance(archs, list):
            raise ConfigError(f"Expected architectures to be a list of class names, got {archs!r}")
        if archs and not any(a in ARCHITECTURES for a in archs):
            raise ConfigError(f"Expected architectures to include one of {ARCHITECTURES}, got {archs}")
        model_type = raw.get("model_type")
        if model_type is not None and model_type not in MODEL_TYPES:
            raise ConfigError(f"Expected model_type in {MODEL_TYPES}, got {model_type!r}")
        unknown = sorted(k for k in raw if k not in MODEL_KEYS and k not in IGNORED_KEYS)
        if unknown:
            raise ConfigError(f"Expected only known DeepSeek-V3 config keys, got unknown key(s) {unknown}")
        try:
            quantization = parse_quantization(raw.get("quantization_config"))
        except QuantizationError as exc:
            raise ConfigError(str(exc)) from None
        if raw.get("scoring_func", "sigmoid") != "sigmoid":
            raise ConfigError(f"Expected scoring_func 'sigmoid', got {raw['scoring_func']!r}")
        if raw.get("topk_method", "noaux_tc") != "noaux_tc":
            raise ConfigError(f"Expected topk_method 'noaux_tc', got {raw['topk_method']!r}")
        if raw.get("moe_layer_freq", 1) != 1:
            raise ConfigError(f"Expected moe_layer_freq 1 (every layer from first_k_dense_replace on is MoE), got {raw['moe_layer_freq']}")
        if raw.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"Expected hidden_act 'silu', got {raw['hidden_act']!r}")
        heads = raw.get("num_attention_heads")
        if raw.get("num_key_value_heads") not in (None, heads):
            raise ConfigError(f"Expected num_key_value_heads == num_attention_heads ({heads}), got {raw['num_key_value_heads']}")
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
        missing = [k for k in required if raw.get(k) is None]
        if missing:
            raise ConfigError(f"Expected config keys {list(required)}, got none for {missing}")
        check_values(raw)
        kwargs = {k: raw[k] for k in MODEL_KEYS if k in raw and k not in ("rope_theta", "rope_scaling", "rope_parameters",
                                                                             "scoring_func", "topk_method", "quantization_config")}
        kwargs["tie_word_embeddings"] = bool(raw.get("tie_word_embeddings", False))
        kwargs["rope"] = parse_rope(raw)
        kwargs["quantization"] = quantization
        cfg = ModelConfig(**kwargs)
        if cfg.qk_rope_head_dim % 2:
            raise ConfigError(f"Expected an even qk_rope_head_dim (rope rotates pairs), got {cfg.qk_rope_head_dim}")
        if cfg.n_routed_experts:
            if cfg.n_routed_experts % cfg.n_group:
                raise ConfigError(f"Expected n_routed_experts divisible by n_group={cfg.n_group}, got {cfg.n_routed_experts}")
            if not 0 < cfg.num_experts_per_tok <= cfg.n_routed_experts:
                raise ConfigError(f"Expected 0 < num_experts_per_tok <= n_routed_experts, got {cfg.num_experts_per_tok}")
            if cfg.topk_group > cfg.n_group:
                raise ConfigError(f"Expected topk_group <= n_group={cfg.n_group}, got {cfg.topk_group}")
            if cfg.num_experts_per_tok > cfg.topk_group * (cfg.n_routed_experts // cfg.n_group):
                raise ConfigError(f"Expected num_experts_per_tok <= topk_group x experts per group "
                                  f"({cfg.topk_group * (cfg.n_routed_experts // cfg.n_group)}), got {cfg.num_experts_per_tok}")
            if cfg.moe_intermediate_size < 1 and cfg.first_k_dense_replace < cfg.block_layers:
                raise ConfigError(f"Expected a positive moe_intermediate_size for the MoE layers, got {cfg.moe_intermediate_size}")
        return cfg

    @staticmethod
    def from_folder(folder: str | Path) -> "ModelConfig":
        """Read and validate ``folder/config.json``; a ConfigError names the file."""
        path = check_folder(folder) / "config.json"
        if not os.path.lexists(path):
            raise ConfigError(f"Expected a Hugging Face model folder with config.json, got {folder} without one")
        raw = read_json(path)
        try:
            return ModelConfig.from_dict(raw)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None


def check_folder(folder: str | Path) -> Path:
    """``folder`` as a Path if it is a readable directory, else ConfigError naming it."""
    path = Path(folder)
    try:
        mode = os.stat(path).st_mode  # follows symlinks; a loop or a dangling link raises
    except OSError as exc:
        raise ConfigError(f"Expected a model folder at {folder}, got an unreadable path: {exc.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise ConfigError(f"Expected a model folder (config.json + *.safetensors) at {folder}, got a {_kind(mode)}")
    return path


def read_json(path: Path) -> dict:
    """The JSON object in ``path`` (a regular file of at most MAX_JSON_BYTES); ConfigError naming it otherwise."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"Expected {path} to be a regular file, got a {_kind(st.st_mode)}")
        if st.st_size > MAX_JSON_BYTES:
            raise ConfigError(f"Expected {path} of at most {MAX_JSON_BYTES >> 20} MiB, got {st.st_size} bytes")
        with open(path, "rb") as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"Expected a readable {path}, got: {exc.strerror}") from None
    try:
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"Expected UTF-8 JSON in {path}, got an undecodable byte at offset {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"Expected valid JSON in {path}, got: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ConfigError(f"Expected JSON in {path}, got nesting too deep to parse") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"Expected a JSON object in {path}, got a {type(raw).__name__}")
    return raw


def eos_token_ids(folder: str | Path, vocab_size: int) -> tuple[int, ...]:
    """End-of-sequence ids as transformers' ``generate`` reads them: ``generation_config.json``'s
    ``eos_token_id`` when that file exists, else ``config.json``'s; an int, a list or null."""
    folder = check_folder(folder)
    path = folder / "generation_config.json"
    if not os.path.lexists(path):
        path = folder / "config.json"
    value = read_json(path).get("eos_token_id")
    ids = [] if value is None else value if isinstance(value, list) else [value]
    for t in ids:
        if not _is_int(t) or not 0 <= t < vocab_size:
            raise ConfigError(f"{path}: Expected eos_token_id as token ids in [0, {vocab_size}), got {value!r}")
    return tuple(ids)


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "directory"), (stat.S_ISREG, "regular file"), (stat.S_ISFIFO, "FIFO"),
             (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))
    return next((name for test, name in kinds if test(mode)), "special file")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_values(raw: dict) -> None:
    """ConfigError naming the first key whose value makes no sense (types, signs, NaN / inf)."""
    for key in POSITIVE_INTS + OPTIONAL_POSITIVE_INTS + NON_NEGATIVE_INTS:
        if key not in raw or (raw[key] is None and key in OPTIONAL_POSITIVE_INTS):
            continue
        v, low = raw[key], 0 if key in NON_NEGATIVE_INTS else 1
        if not _is_int(v) or v < low:
            kind = "a non-negative" if low == 0 else "a positive"
            raise ConfigError(f"Expected {key} to be {kind} integer, got {v!r}")
    for key in POSITIVE_FLOATS:
        if key in raw and not (_is_number(raw[key]) and math.isfinite(raw[key]) and raw[key] > 0):
            raise ConfigError(f"Expected {key} to be a finite number > 0, got {raw[key]!r}")
    for key in BOOLS:
        if key in raw and not isinstance(raw[key], bool):
            raise ConfigError(f"Expected {key} to be true or false, got {raw[key]!r}")


def parse_rope(raw: dict) -> RopeConfig:
    """Rope parameters from ``rope_parameters`` (transformers v5) or ``rope_theta`` + ``rope_scaling``."""
    for key in ("rope_parameters", "rope_scaling"):
        if not isinstance(raw.get(key) or {}, dict):
            raise ConfigError(f"Expected {key} to be an object, got {raw[key]!r}")
    params = dict(raw.get("rope_parameters") or {})
    key = "rope_parameters"
    if not params:
        params = dict(raw.get("rope_scaling") or {})
        key = "rope_scaling"
        params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ConfigError(f"Expected {key}.rope_type in {ROPE_TYPES}, got {rope_type!r}")
    theta = _finite(params.get("rope_theta", raw.get("rope_theta", 10000.0)), f"{key}.rope_theta", low=1.0)
    if rope_type == "default":
        return RopeConfig("default", theta)
    factor = params.get("factor")
    if factor is None:
        raise ConfigError(f"Expected {key}.factor for yarn rope, got none")
    omax = params.get("original_max_position_embeddings")
    if omax is None:
        raise ConfigError(f"Expected {key}.original_max_position_embeddings for yarn rope, got none")
    if not _is_int(omax) or omax < 1:
        raise ConfigError(f"Expected {key}.original_max_position_embeddings to be a positive integer, got {omax!r}")
    attention_factor = params.get("attention_factor")
    if attention_factor is not None:
        attention_factor = _finite(attention_factor, f"{key}.attention_factor", low=0.0)
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ConfigError(f"Expected {key}.truncate to be true or false, got {truncate!r}")
    return RopeConfig(
        "yarn", theta, _finite(factor, f"{key}.factor", low=0.0), omax,
        # 0 or null means the default for these four, as in transformers' yarn parameters
        _finite(params.get("beta_fast") or 32.0, f"{key}.beta_fast", low=0.0),
        _finite(params.get("beta_slow") or 1.0, f"{key}.beta_slow", low=0.0),
        _finite(params.get("mscale") or 0.0, f"{key}.mscale"), _finite(params.get("mscale_all_dim") or 0.0, f"{key}.mscale_all_dim"),
        attention_factor, truncate,
    )


def _finite(v, where: str, low: float | None = None) -> float:
    """``v`` as a finite float (> ``low`` when given), else ConfigError naming ``where``."""
    if not _is_number(v) or not math.isfinite(v) or (low is not None and v <= low):
        bound = "" if low is None else f" > {low:g}"
        raise ConfigError(f"Expected {where} to be a finite number{bound}, got {v!r}")
    return float(v)
