"""Causal prefill attention with a prefix, with no mask tensor: the engine's ``forward_extend``.

A chunk of ``n`` queries at positions [prefix, prefix + n) attends keys [0, prefix + n): query i
sees key j iff j <= prefix + i (the "lower-right" causal mask of an n x (prefix + n) block).

Layouts are the engine's: q [H, n, qk], k [H, L, qk], v [H, L, dv] with L = prefix + n, any
strides whose last one is 1 (the engine passes transposed views of [L, H, d] rows). The result
is [H, n, dv] in q's dtype.

Methods (``METHODS``):
- ``cudnn``: two cuDNN calls through ``aten._scaled_dot_product_cudnn_attention``: the queries
  over the prefix's keys with no mask, and over their own keys with ``is_causal`` (a square block,
  where cuDNN's top-left diagonal is the lower-right one); each returns its log-sum-exp, and the
  two partial outputs are merged in float32. v keeps its own head dim (128 beside qk 192).
- ``flash``: ``aten._scaled_dot_product_flash_attention(q, k, v, is_causal=True)``: the flash
  kernel's causal mask is aligned to the lower right when n != L, which is what
  ``causal_lower_right(n, L)`` dispatches to; the kernel wants equal head dims, so v is padded
  with zeros to qk and the output sliced back.
- ``efficient``: ``aten._efficient_attention_forward`` with ``custom_mask_type`` 2 (the
  memory-efficient kernel's own causal-from-bottom-right mask, what ``causal_lower_right``
  dispatches to there); v unpadded.
- ``cpu``: the split of ``cudnn`` through ``aten._scaled_dot_product_flash_attention_for_cpu``
  (which returns the log-sum-exp and wants equal head dims: v padded).
- ``masked``: what the engine ran before (a boolean [queries, keys] mask per 4096-query slice,
  v padded, SDPA's default choice of kernel); kept as the benchmark's baseline, the tests' "as
  before" and the last resort.

Decisions:
- The flash and memory-efficient kernels are called directly rather than through
  ``F.scaled_dot_product_attention(..., attn_mask=causal_lower_right(n, L))``: torch's
  ``CausalBias._dispatch`` (read in 2.13; the GPU host runs 2.11) sends a lower-right bias with
  n != L to flash only when ``can_use_flash_attention`` (flash enabled, equal head dims), else to
  the memory-efficient kernel when it can, and otherwise materializes the [n, L] mask and calls
  SDPA with it: a mask tensor again, silently. The direct calls are the same kernels with no
  such fallback: they run without a mask or raise (and the probe skips them). cuDNN gets no
  lower-right bias there at all (it would take the materialized mask), hence the split above,
  whose two calls need no mask (the causal part is square).
- Choice per device (``select_method``, once per device, dtype and head dims): on CUDA the first
  of ``cudnn``, ``flash``, ``efficient`` that runs and agrees with a float32 reference on small
  problems in the engine's layouts (``probe``), each one skipped with its reason warned, else
  ``masked``; on CPU ``cpu`` (probed the same way), else ``masked``. The order is the issue's
  H200 measurements' (per 8192-query chunk, 16 heads, qk 192, v 128: prefix 0: cuDNN 0.77 ms,
  flash 1.64, old path 4.03; prefix 180k: 47.6 / 56.8 / 69.4);
  ``phases.backend.bench.prefill_attention`` re-measures every method.
- A chosen method that raises later (a shape the probe did not cover; not out-of-memory) is
  dropped for that key with a warning and the call re-run with the next method.
- cuDNN builds an execution plan per new shape (s_q, s_kv): a prefill's chunks are at fixed
  prefixes (multiples of the engine's chunk), so a prompt of P tokens builds about P / chunk
  plans once per process; ``TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1`` (torch >= 2.9, opt-in) lets
  cuDNN reuse one. The bench reports each method's first call apart from its median.
- Query slices of ``QUERY_SLICE`` (65536): no [n, L] tensor exists, so memory is O(n d) per
  slice (the float32 partials and their merge); the engine's default 32768-token chunk is one
  call per request and layer (one new cuDNN plan per chunk: the causal part's square repeats).
- Float32 merge (float64 for float64 inputs): out = o1 exp(lse1 - lse) + o2 exp(lse2 - lse),
  lse = logaddexp(lse1, lse2); the partials are rounded to q's dtype by their kernels, so a bf16
  result rounds twice where one fused call rounds once (the tests bound the error against the
  same-precision reference's).
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

METHODS = ("cudnn", "flash", "efficient", "cpu", "masked")
CUDA_ORDER = ("cudnn", "flash", "efficient")
QUERY_SLICE = 65536  # queries per call: O(n d) memory, no score or mask tensor
MASKED_SLICE = 4096  # the old path's queries per SDPA call (its bool mask is [slice, L])
PROBE_TOLERANCE = 4.0  # a method's error over the same-dtype masked path's, both against float32
PROBE_SHAPES = ((96, 0), (80, 173), (1, 57))  # (queries, prefix): no prefix, odd sizes, one query
LOWER_RIGHT = 2  # the memory-efficient kernel's custom_mask_type CausalFromBottomRight

_chosen: dict = {}
_skipped: dict = {}  # key -> {method: why}


def _pad_last(x: torch.Tensor, width: int) -> torch.Tensor:
    return x if x.shape[-1] == width else F.pad(x, (0, width - x.shape[-1]))


def _merge(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Two partial softmax-weighted outputs [H, n, dv] over disjoint keys, with their log-sum-exps
    [H, n], merged in float32 (float64 for float64) into ``dtype``."""
    acc = torch.promote_types(dtype, torch.float32)
    lse1, lse2 = lse1.to(acc), lse2.to(acc)
    lse = torch.logaddexp(lse1, lse2)
    w1, w2 = torch.exp(lse1 - lse).unsqueeze(-1), torch.exp(lse2 - lse).unsqueeze(-1)
    return (o1.to(acc) * w1 + o2.to(acc) * w2).to(dtype)


def _cudnn_part(q, k, v, causal: bool, scale: float, lse: bool):
    out = torch.ops.aten._scaled_dot_product_cudnn_attention.default(
        q[None], k[None], v[None], None, lse, 0.0, causal, False, scale=scale)
    o = out[0][0]
    # The log-sum-exp comes back [1, H, n] or [1, H, n, 1] by version: reshape reads either.
    return (o, out[1].reshape(q.shape[0], q.shape[1])) if lse else (o, None)


def _cpu_part(q, k, v, causal: bool, scale: float, lse: bool):
    width = max(q.shape[-1], v.shape[-1])
    o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
        _pad_last(q, width)[None], _pad_last(k, width)[None], _pad_last(v, width)[None], 0.0, causal, scale=scale)
    return o[0, ..., : v.shape[-1]], l[0]


def _split(part, q, k, v, prefix: int, scale: float) -> torch.Tensor:
    """Queries over the prefix's keys (no mask) and over their own keys (square causal), merged."""
    n = q.shape[1]
    o2, lse2 = part(q, k[:, prefix : prefix + n], v[:, prefix : prefix + n], True, scale, prefix > 0)
    if prefix == 0:
        return o2.to(q.dtype)
    o1, lse1 = part(q, k[:, :prefix], v[:, :prefix], False, scale, True)
    return _merge(o1, lse1, o2, lse2, q.dtype)


def _flash(q, k, v, scale: float) -> torch.Tensor:
    dv = v.shape[-1]
    width = max(q.shape[-1], dv)
    out = torch.ops.aten._scaled_dot_product_flash_attention.default(
        _pad_last(q, width)[None], _pad_last(k, width)[None], _pad_last(v, width)[None], 0.0, True, False, scale=scale)
    return out[0][0, ..., :dv]


def _efficient(q, k, v, scale: float) -> torch.Tensor:
    # [1, n, H, d] views: the kernel's layout, which the engine's [rows, H, d] tensors already are.
    out = torch.ops.aten._efficient_attention_forward.default(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], None, None, None, None, None,
        0.0, LOWER_RIGHT, False, scale=scale)
    return out[0][0].transpose(0, 1)


def masked_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, scale: float) -> torch.Tensor:
    """The engine's prefill attention before this module: per ``MASKED_SLICE`` queries a boolean
    [slice, keys] mask, v padded to qk's head dim (in the engine's [L, H, d] layout, as it was),
    SDPA's default choice of kernel."""
    h, n, qk = q.shape
    dv = v.shape[-1]
    if dv < qk:
        v = F.pad(v.transpose(0, 1), (0, qk - dv)).transpose(0, 1)
    out = torch.empty(h, n, dv, dtype=q.dtype, device=q.device)
    for c0 in range(0, n, MASKED_SLICE):
        c1 = min(n, c0 + MASKED_SLICE)
        keys = prefix + c1
        qpos = torch.arange(prefix + c0, prefix + c1, device=q.device)
        mask = torch.arange(keys, device=q.device)[None, :] <= qpos[:, None]
        o = F.scaled_dot_product_attention(q[None, :, c0:c1], k[None, :, :keys], v[None, :, :keys], attn_mask=mask, scale=scale)[0]
        out[:, c0:c1] = o[..., :dv]
    return out


def _one_call(q, k, v, prefix: int, scale: float, method: str) -> torch.Tensor:
    if method == "cudnn":
        return _split(_cudnn_part, q, k, v, prefix, scale)
    if method == "cpu":
        return _split(_cpu_part, q, k, v, prefix, scale)
    if method == "flash":
        return _flash(q, k, v, scale)
    if method == "efficient":
        return _efficient(q, k, v, scale)
    raise ValueError(f"Expected a method in {list(METHODS)}, got {method!r}")


def _sliced(q, k, v, prefix: int, scale: float, method: str, out: torch.Tensor | None) -> torch.Tensor:
    h, n, _ = q.shape
    if method == "masked":
        result = masked_prefill(q, k, v, prefix, scale)
        return result if out is None else out.copy_(result)
    if n <= QUERY_SLICE:
        result = _one_call(q, k, v, prefix, scale, method)
        return result if out is None else out.copy_(result)
    out = torch.empty(h, n, v.shape[-1], dtype=q.dtype, device=q.device) if out is None else out
    for c0 in range(0, n, QUERY_SLICE):
        c1 = min(n, c0 + QUERY_SLICE)
        out[:, c0:c1] = _one_call(q[:, c0:c1], k[:, : prefix + c1], v[:, : prefix + c1], prefix + c0, scale, method)
    return out


def causal_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, scale: float,
                   method: str | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of q [H, n, qk] at positions [prefix, prefix + n) over k [H, L, qk], v [H, L, dv]
    (L = prefix + n), lower-right causal; returns [H, n, dv] in q's dtype (``out`` when given:
    any [H, n, dv] view of q's dtype, written in full).

    method: one of ``METHODS``; None: ``select_method`` for q's device, dtype and head dims (a
    chosen method that raises is dropped and the next one runs, see the Decisions).
    """
    h, n, qk = q.shape
    dv = v.shape[-1]
    if prefix < 0 or k.shape[1] != prefix + n or v.shape[1] != prefix + n:
        raise ValueError(f"Expected {prefix} + {n} keys and values, got {k.shape[1]} and {v.shape[1]}")
    if k.shape[0] != h or v.shape[0] != h or k.shape[2] != qk:
        raise ValueError(f"Expected k [{h}, L, {qk}] and v [{h}, L, dv], got {list(k.shape)} and {list(v.shape)}")
    if out is not None and (tuple(out.shape) != (h, n, dv) or out.dtype != q.dtype):
        raise ValueError(f"Expected out [{h}, {n}, {dv}] of {q.dtype}, got {list(out.shape)} of {out.dtype}")
    if method is not None:
        return _sliced(q, k, v, prefix, scale, method, out)
    chosen = select_method(q.device, q.dtype, qk, dv)
    try:
        return _sliced(q, k, v, prefix, scale, chosen, out)
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, NotImplementedError) as exc:
        if chosen == "masked":
            raise
        key = _key(q.device, q.dtype, qk, dv)
        _drop(key, chosen, f"raised at n={n}, prefix={prefix}: {_why(exc)}")
        _chosen.pop(key, None)  # select again, past the dropped method
        return causal_prefill(q, k, v, prefix, scale, out=out)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, scale: float,
              dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Masked attention in ``dtype`` (scores, softmax and values materialized): the judge."""
    n, length = q.shape[1], k.shape[1]
    scores = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * scale
    visible = torch.arange(length, device=q.device)[None, :] <= torch.arange(prefix, prefix + n, device=q.device)[:, None]
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v.to(dtype)


def engine_layout(n: int, prefix: int, heads: int, qk: int, dv: int, dtype: torch.dtype, device, generator=None,
                  nope: int | None = None):
    """Random q, k, v laid out as ``forward_extend`` passes them: transposed views of [rows, H, d]
    tensors, v a slice of the per-head [k_nope | v] up-projection (strides H * (nope + dv))."""
    length = prefix + n
    nope = qk if nope is None else nope
    q = torch.randn(n, heads, qk, dtype=dtype, device=device, generator=generator).transpose(0, 1)
    k = torch.randn(length, heads, qk, dtype=dtype, device=device, generator=generator).transpose(0, 1)
    kv = torch.randn(length, heads, nope + dv, dtype=dtype, device=device, generator=generator)
    return q, k, kv[..., nope:].transpose(0, 1)


def _why(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def probe(method: str, device: torch.device, dtype: torch.dtype, qk: int, dv: int) -> tuple[bool, str]:
    """Run ``method`` on small problems (``PROBE_SHAPES``, the engine's layouts) and compare it
    with a float32 reference: (True, "") when its error is within ``PROBE_TOLERANCE`` times the
    masked path's (same dtype), else (False, why)."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(29)
    scale = 1.0 / math.sqrt(qk)
    try:
        for n, prefix in PROBE_SHAPES:
            q, k, v = engine_layout(n, prefix, 2, qk, dv, dtype, device, gen)
            want = reference(q, k, v, prefix, scale, torch.float32)
            got = causal_prefill(q, k, v, prefix, scale, method).float()
            base = (masked_prefill(q, k, v, prefix, scale).float() - want).abs().max().item()
            err = (got - want).abs().max().item()
            if not err <= PROBE_TOLERANCE * base + 1e-6:  # NaN fails too
                return False, f"error {err:.3g} against the masked path's {base:.3g} (n={n}, prefix={prefix})"
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        return False, _why(exc)
    return True, ""


def _key(device, dtype: torch.dtype, qk: int, dv: int) -> tuple:
    device = torch.device(device)
    index = device.index if device.index is not None or device.type != "cuda" else torch.cuda.current_device()
    return device.type, index, dtype, qk, dv


def _drop(key: tuple, method: str, why: str) -> None:
    _skipped.setdefault(key, {})[method] = why
    warnings.warn(f"prefill attention: {method} skipped on {key[0]}:{key[1]} {key[2]} qk={key[3]} v={key[4]} ({why})",
                  stacklevel=3)


def select_method(device, dtype: torch.dtype, qk: int, dv: int) -> str:
    """The method this device runs (cached per device, dtype and head dims): see the Decisions."""
    device = torch.device(device)
    key = _key(device, dtype, qk, dv)
    if key not in _chosen:
        chosen = "masked"
        for method in CUDA_ORDER if device.type == "cuda" else ("cpu",):
            if method in _skipped.get(key, {}):
                continue
            ok, why = probe(method, device, dtype, qk, dv)
            if ok:
                chosen = method
                break
            _drop(key, method, why)
        _chosen[key] = chosen
    return _chosen[key]


def skipped_methods(device, dtype: torch.dtype, qk: int, dv: int) -> dict:
    """{method: why} of the methods ``select_method`` skipped for this key (empty before it ran)."""
    return dict(_skipped.get(_key(device, dtype, qk, dv), {}))
