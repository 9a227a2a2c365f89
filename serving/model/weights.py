"""Reading a DeepSeek-V3 checkpoint (``*.safetensors``, transformers' tensor names) into a flat dict.

Decisions:
- Every expected tensor is listed from the config with its shape before anything is read;
  a missing tensor or a shape mismatch is a ``WeightError`` naming the tensor and both shapes.
- Routed experts are accepted per expert (``mlp.experts.{e}.gate_proj.weight``, as
  DeepSeek's checkpoints and ``save_pretrained`` write them) or fused
  (``mlp.experts.gate_up_proj`` [E, 2I, hidden]); either way the engine holds them fused.
- DeepSeek's multi-token-prediction module (layer ``num_hidden_layers``: ``enorm``, ``hnorm``,
  ``eh_proj``, a decoder block, ``shared_head``; its own ``embed_tokens`` optional) is loaded
  and checked like any layer when ``num_nextn_predict_layers`` is set, and skipped otherwise;
  further MTP layers are skipped; any other tensor the model does not use is an error. A
  checkpoint that declares the module but holds none of it (transformers' ``save_pretrained``
  writes ``num_nextn_predict_layers: 1`` and no module) is served without it
  (``served_config``); one that holds part of it is refused, naming what is missing.
- Nothing is read before every file's header has been checked: the 8-byte header length
  (at most the format's 100 MB), the JSON, each tensor's dtype, shape and data offsets against
  the file's size (contiguous, in order, no gap or overlap, as the safetensors library requires),
  then names, shapes and floating-point dtypes against the config. A crafted header cannot make
  the loader allocate what the file does not hold, and a bad file fails before any tensor is
  materialised. Every message names the file.
- Tensors are read and converted one at a time (no second copy of the checkpoint), after the
  weights' bytes were checked against the device's free memory (``limits``).
- Block-FP8 checkpoints (``quantization_config``, see ``quantization``): the headers' FP8
  weights and float32 scales are checked by ``fp8_layout``; the scales are read and checked
  (finite, > 0) before any weight. ``keep_fp8`` (default: on CUDA) keeps each FP8 projection
  as a ``fp8.BlockFP8Weight``; otherwise it is dequantized at load into the model dtype.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import torch

from serving.configs.model import ModelConfig
from serving.configs.quantization import scale_name, weight_of_scale
from serving.model import limits
from serving.quant.fp8 import BlockFP8Weight
from serving.quant.fp8_layout import FP8Layout, check_scale_values

MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own limit
# Bytes per element of every safetensors dtype; only the floating ones below are served.
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
               "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")


class WeightError(ValueError):
    """A checkpoint whose tensors do not match its config."""


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape for every tensor the engine needs (experts in per-expert form),
    the MTP module's included when the config declares one (``MTP_OPTIONAL`` aside)."""
    h = cfg.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.block_layers):
        shapes.update(block_shapes(cfg, i))
    if cfg.has_mtp:
        p = f"model.layers.{cfg.mtp_layer}."
        shapes.update({p + "enorm.weight": (h,), p + "hnorm.weight": (h,), p + "eh_proj.weight": (h, 2 * h),
                       p + "shared_head.norm.weight": (h,), p + "shared_head.head.weight": (cfg.vocab_size, h)})
    return shapes


def optional_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Tensors a checkpoint may carry or leave out: the MTP module's own embeddings (DeepSeek-V3
    ships a copy; without it the module shares the target's ``embed_tokens``)."""
    if not cfg.has_mtp:
        return {}
    return {f"model.layers.{cfg.mtp_layer}.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size)}


def block_shapes(cfg: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """The tensors of decoder block ``i`` (attention, norms, dense MLP or MoE)."""
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    shapes: dict[str, tuple[int, ...]] = {}
    p = f"model.layers.{i}."
    shapes[p + "input_layernorm.weight"] = (h,)
    shapes[p + "post_attention_layernorm.weight"] = (h,)
    a = p + "self_attn."
    if cfg.q_lora_rank is None:
        shapes[a + "q_proj.weight"] = (heads * cfg.qk_head_dim, h)
    else:
        shapes[a + "q_a_proj.weight"] = (cfg.q_lora_rank, h)
        shapes[a + "q_a_layernorm.weight"] = (cfg.q_lora_rank,)
        shapes[a + "q_b_proj.weight"] = (heads * cfg.qk_head_dim, cfg.q_lora_rank)
        if cfg.attention_bias:
            shapes[a + "q_a_proj.bias"] = (cfg.q_lora_rank,)
    shapes[a + "kv_a_proj_with_mqa.weight"] = (cfg.latent_dim, h)
    if cfg.attention_bias:
        shapes[a + "kv_a_proj_with_mqa.bias"] = (cfg.latent_dim,)
        shapes[a + "o_proj.bias"] = (h,)
    shapes[a + "kv_a_layernorm.weight"] = (cfg.kv_lora_rank,)
    shapes[a + "kv_b_proj.weight"] = (heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
    shapes[a + "o_proj.weight"] = (h, heads * cfg.v_head_dim)
    m = p + "mlp."
    if cfg.is_moe_layer(i):
        inter = cfg.moe_intermediate_size
        shapes[m + "gate.weight"] = (cfg.n_routed_experts, h)
        shapes[m + "gate.e_score_correction_bias"] = (cfg.n_routed_experts,)
        for e in range(cfg.n_routed_experts):
            shapes[m + f"experts.{e}.gate_proj.weight"] = (inter, h)
            shapes[m + f"experts.{e}.up_proj.weight"] = (inter, h)
            shapes[m + f"experts.{e}.down_proj.weight"] = (h, inter)
        if cfg.n_shared_experts:
            shared = inter * cfg.n_shared_experts
            shapes[m + "shared_experts.gate_proj.weight"] = (shared, h)
            shapes[m + "shared_experts.up_proj.weight"] = (shared, h)
            shapes[m + "shared_experts.down_proj.weight"] = (h, shared)
    else:
        shapes[m + "gate_proj.weight"] = (cfg.intermediate_size, h)
        shapes[m + "up_proj.weight"] = (cfg.intermediate_size, h)
        shapes[m + "down_proj.weight"] = (h, cfg.intermediate_size)
    return shapes


_FUSED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class TensorInfo:
    """One header entry: dtype (safetensors name), shape, data offsets relative to the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Validated header of a safetensors file, read without touching the tensor data.

    Raises WeightError naming ``path`` for a file that is not a regular file, a header length
    past MAX_HEADER_BYTES or the file's end, a header that is not a JSON object of well-formed
    entries, or data offsets that do not tile the file's data section exactly.
    """
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise WeightError(f"Expected {path} to be a regular safetensors file, got something else (a directory, FIFO or device)")
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise WeightError(f"Expected a safetensors file at {path}, got {len(prefix)} bytes (truncated: no 8-byte header length)")
            n = int.from_bytes(prefix, "little")
            if n > MAX_HEADER_BYTES:
                raise WeightError(f"Expected a safetensors header of at most {MAX_HEADER_BYTES} bytes in {path}, got a length of {n} (corrupt file)")
            if 8 + n > st.st_size:
                raise WeightError(f"Expected a {n}-byte header in {path}, got a file of {st.st_size} bytes (truncated)")
            raw = f.read(n)
    except OSError as exc:
        raise WeightError(f"Expected a readable safetensors file at {path}, got: {exc.strerror}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise WeightError(f"Expected a JSON header in {path}, got one that does not parse ({type(exc).__name__}) (corrupt file)") from None
    if not isinstance(header, dict):
        raise WeightError(f"Expected a JSON object as the header of {path}, got a {type(header).__name__}")
    data_bytes = st.st_size - 8 - n
    infos = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not (isinstance(entry, dict) and isinstance(entry.get("shape"), list) and isinstance(entry.get("data_offsets"), list)
                and all(_is_count(d) for d in entry["shape"]) and len(entry["data_offsets"]) == 2
                and all(_is_count(o) for o in entry["data_offsets"])):
            raise WeightError(f"Expected tensor {name!r} in the header of {path} with dtype, shape and data_offsets, got {entry!r:.200}")
        dtype = entry.get("dtype")
        if dtype not in DTYPE_BYTES:
            raise WeightError(f"Expected tensor {name!r} in {path} of a safetensors dtype {sorted(DTYPE_BYTES)}, got {dtype!r}")
        begin, end = entry["data_offsets"]
        nbytes = math.prod(entry["shape"]) * DTYPE_BYTES[dtype]
        if end > data_bytes:
            raise WeightError(f"Expected tensor {name!r} ({nbytes} bytes) to lie inside {path}, got data_offsets [{begin}, {end}] "
                              f"past its {data_bytes} bytes of data (truncated or corrupt file)")
        if end - begin != nbytes:
            raise WeightError(f"Expected tensor {name!r} in {path} of shape {tuple(entry['shape'])} {dtype} to span {nbytes} bytes, "
                              f"got data_offsets [{begin}, {end}] (corrupt header)")
        infos[name] = TensorInfo(name, dtype, tuple(entry["shape"]), begin, end)
    at = 0
    for info in sorted(infos.values(), key=lambda i: (i.begin, i.end)):
        if info.begin != at:
            raise WeightError(f"Expected the tensors of {path} to tile its data, got {info.name!r} at byte {info.begin} "
                              f"where the previous one ends at {at} (overlap or gap: corrupt header)")
        at = info.end
    if at != data_bytes:
        raise WeightError(f"Expected the tensors of {path} to end where its data ends ({data_bytes} bytes), got {at} (corrupt file)")
    return infos


def _split_fused(name: str, tensor: torch.Tensor, inter: int) -> dict[str, torch.Tensor]:
    """Fused expert tensors -> per-expert names (gate_up_proj [E, 2I, H], down_proj [E, H, I])."""
    prefix, kind = _FUSED.match(name).groups()
    out = {}
    for e in range(tensor.shape[0]):
        if kind == "gate_up_proj":
            out[f"{prefix}{e}.gate_proj.weight"] = tensor[e, :inter]
            out[f"{prefix}{e}.up_proj.weight"] = tensor[e, inter:]
        else:
            out[f"{prefix}{e}.down_proj.weight"] = tensor[e]
    return out


def _fused_shapes(name: str, cfg: ModelConfig) -> tuple[int, ...]:
    """Expected shape of a fused expert tensor: gate_up_proj [E, 2I, hidden], down_proj [E, hidden, I]."""
    e, inter, h = cfg.n_routed_experts or 0, cfg.moe_intermediate_size, cfg.hidden_size
    return (e, 2 * inter, h) if name.endswith("gate_up_proj") else (e, h, inter)


def served_config(folder: str | Path, cfg: ModelConfig) -> ModelConfig:
    """``cfg`` as ``folder``'s checkpoint can serve it: without the MTP module when the config
    declares one (``num_nextn_predict_layers``; transformers writes 1 by default) but the
    checkpoint holds none of its tensors. A module partly there is ``plan_load``'s error."""
    if not cfg.has_mtp:
        return cfg
    prefix = f"model.layers.{cfg.mtp_layer}."
    try:
        files = sorted(Path(folder).glob("*.safetensors"))
    except OSError:
        return cfg  # plan_load names the folder
    if any(name.startswith(prefix) for path in files for name in read_header(path)):
        return cfg
    return dataclasses.replace(cfg, num_nextn_predict_layers=0)


def plan_load(folder: str | Path, cfg: ModelConfig) -> list[tuple[Path, list[TensorInfo]]]:
    """Per file, the header entries to read; every check of the module docstring done, nothing read."""
    folder = Path(folder)
    try:
        files = sorted(folder.glob("*.safetensors"))
    except OSError as exc:
        raise WeightError(f"Expected a readable model folder {folder}, got: {exc.strerror}") from None
    if not files:
        raise WeightError(f"Expected *.safetensors files in {folder}, got none")
    expected = expected_shapes(cfg) | optional_shapes(cfg)
    layout = FP8Layout(cfg.quantization is not None, expected, WeightError)
    moe_layers = {i for i in range(cfg.block_layers) if cfg.is_moe_layer(i)}
    seen: dict[str, Path] = {}
    plan = []
    for path in files:
        wanted = []
        for name, info in read_header(path).items():
            layer = _LAYER.match(name)
            if layer and int(layer.group(1)) >= cfg.block_layers:
                continue  # further multi-token-prediction layers (or all of them, without num_nextn_predict_layers)
            if layout.entry(name, info.dtype, info.shape, path):
                wanted.append(info)  # a block scale, checked against its weight's shape
                continue
            fused = _FUSED.match(name)
            if fused and int(_LAYER.match(name).group(1)) in moe_layers:
                shape = _fused_shapes(name, cfg)
                covers = [f"{fused.group(1)}{e}.{p}.weight" for e in range(shape[0])
                          for p in (("gate_proj", "up_proj") if name.endswith("gate_up_proj") else ("down_proj",))]
            elif name in expected:
                shape, covers = expected[name], [name]
            elif name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue
            else:
                raise WeightError(f"Expected only tensors of a DeepSeek-V3 model, got unexpected tensor {name!r} in {path.name}")
            if info.shape != shape:
                raise WeightError(f"Expected {name} of shape {shape}, got {info.shape} in {path}")
            if info.dtype not in FLOAT_DTYPES + ("F8_E4M3",):
                raise WeightError(f"Expected tensor {name} in {path} to be floating point ({', '.join(FLOAT_DTYPES)}), got {info.dtype}")
            for n in covers:
                if n in seen:
                    raise WeightError(f"Expected tensor {n} once in the checkpoint, got it in {seen[n]} and {path}")
                seen[n] = path
            wanted.append(info)
        plan.append((path, wanted))
    layout.finish()
    missing = [n for n in expected_shapes(cfg) if n not in seen]
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise WeightError(f"Expected tensor {missing[0]!r} in the checkpoint, got none; missing {missing[:3]}{more}")
    return plan


def default_keep_fp8(device: torch.device) -> bool:
    """Where FP8 projections stay FP8 unless asked otherwise: on CUDA (the FP8 GEMMs run there)."""
    return torch.device(device).type == "cuda"


def as_weight(name: str, t: torch.Tensor, scales: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device,
              keep_fp8: bool) -> torch.Tensor | BlockFP8Weight:
    """One checkpoint tensor as the model holds it: an FP8 projection (its scale in ``scales``)
    as a BlockFP8Weight on ``device`` or dequantized into ``dtype``; routers float32; the rest ``dtype``."""
    if t.dtype == torch.float8_e4m3fn:
        w = BlockFP8Weight(t, scales[scale_name(name)])
        return w.to(device) if keep_fp8 else w.dequantize(dtype).to(device)
    keep_fp32 = name.endswith("mlp.gate.weight") or name.endswith("e_score_correction_bias")
    return t.to(device=device, dtype=torch.float32 if keep_fp32 else dtype)


def read_scales(plan: list[tuple[Path, list[TensorInfo]]], read=None) -> dict[str, torch.Tensor]:
    """Every block scale of ``plan`` (float32, on the CPU), each checked finite and > 0.
    read(handle, info) -> tensor: how to read one (default: whole; a rank reads its slice)."""
    from safetensors import SafetensorError, safe_open

    scales = {}
    for path, infos in plan:
        wanted = [i for i in infos if weight_of_scale(i.name) is not None]
        if not wanted:
            continue
        try:
            with safe_open(str(path), framework="pt") as f:
                for info in wanted:
                    t = f.get_tensor(info.name) if read is None else read(f, info)
                    if t is None:
                        continue
                    check_scale_values(info.name, t, path, WeightError)
                    scales[info.name] = t
        except (OSError, SafetensorError) as exc:
            raise WeightError(f"Expected to read the tensors of {path}, got: {exc}") from None
    return scales


def load_weights(folder: str | Path, cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
                 keep_fp8: bool | None = None) -> dict[str, torch.Tensor | BlockFP8Weight]:
    """All tensors of ``folder/*.safetensors`` checked against ``expected_shapes(cfg)``.

    Returns name -> tensor in ``dtype`` on ``device`` (routers stay float32, as in transformers);
    an FP8 projection as a BlockFP8Weight when ``keep_fp8`` (default ``default_keep_fp8``),
    else dequantized. Raises MemoryLimitError when the weights do not fit the device,
    WeightError for a bad checkpoint; either before any weight is read.
    """
    from safetensors import SafetensorError, safe_open

    keep_fp8 = default_keep_fp8(device) if keep_fp8 is None else keep_fp8
    limits.check(limits.estimate(cfg, device, dtype, keep_fp8=keep_fp8))
    plan = plan_load(folder, cfg)
    scales = read_scales(plan)
    out: dict[str, torch.Tensor | BlockFP8Weight] = {}

    def keep(name: str, t: torch.Tensor) -> None:
        out[name] = as_weight(name, t, scales, dtype, device, keep_fp8)

    for path, infos in plan:
        try:
            with safe_open(str(path), framework="pt") as f:
                for info in infos:
                    if info.name in scales:
                        continue
                    t = f.get_tensor(info.name)
                    if _FUSED.match(info.name):
                        for n, part in _split_fused(info.name, t, cfg.moe_intermediate_size).items():
                            keep(n, part)
                    else:
                        keep(info.name, t)
                    del t
        except (OSError, SafetensorError) as exc:
            raise WeightError(f"Expected to read the tensors of {path}, got: {exc}") from None
    return {name: out[name] for name in expected_shapes(cfg) | optional_shapes(cfg) if name in out}
