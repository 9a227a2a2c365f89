"""What the engine will allocate, estimated from the config and the request sizes, and checked
against the device's free memory before anything is allocated.

bytes = weights + KV pool + activations (on the device), plus host bytes (staging while loading
and bookkeeping), each in closed form:

- weights: parameters x model dtype size (routers in float32, as the model keeps them), plus
  the absorbed W_UK / W_UV copies of every ``kv_b_proj``, plus one MoE layer's routed experts
  twice more while the model stacks them. Block-FP8 projections kept as FP8 (``keep_fp8``)
  count 1 byte each plus their float32 scales, and one projection dequantized at a time
  (a prefill chunk's GEMM); ``kv_b_proj`` is dequantized at load and counts in the model dtype.
- KV pool: slots x layers x latent_dim x pool dtype size.
- activations: the larger of a prefill chunk and a decode / verify step, plus the rope tables:
  * a prefill chunk (``prefill_peak``; one request, the layers one at a time): what the forward
    holds through its layers (the step's packed fields, the rope tables gathered for the chunk,
    the context's kv_indices; two hidden-wide vectors more with an MTP module) plus the largest
    of a layer's three phases, each counted as if nothing it allocates were freed before it ends:
    - attention, with forward's x and h alive: per query the projections, rope, the latent row
      written to the pool, q, the output and o_proj's; per query of a ``QUERY_SLICE`` slice the
      two partial outputs (padded to the wider head dim by the cpu and flash kernels), their
      log-sum-exps and the float32 merge (``prefill_attention._merge``); per key of context its
      slot, the gathered row, the ``kv_b_proj`` expansion, K and the zero-padded copy of V;
    - the residual add and the norm after attention (three hidden-wide alive);
    - the MLP, with five hidden-wide alive: gate_up, silu, the product and down; for MoE layers
      the router's float32 scores and selection, two expert iterations' grouped rows (each at
      most the chunk) and the shared experts;
    norms and rope are counted unfused (the fused CUDA kernels allocate only their outputs);
  * a decode / verify step: per token (requests x (1 + drafts)) 14 hidden-wide, 4 MLP-wide and
    6 head-wide (heads x max(qk_head_dim, latent_dim)) vectors in the model dtype, 2 hidden-wide
    (RMSNorm's statistics) and 8 router-wide in float32; float32 logits [tokens, vocab] twice, and
    the reference backend's attention (the larger of the two backends): one request's rows
    gathered and upcast, its [T, L] visibility mask and three score groups of up to
    ``DEFAULT_CHUNK_BYTES``;
  * rope: float32 cos and sin of up to twice the longest position, old and new while grown.
- host: a random model draws every weight in float32 first; a checkpoint is read one tensor at
  a time (its largest tensor in float64 bounds that); 1 KiB per tensor and 64 B per prompt token.

Decisions:
- Closed form, never per tensor: a config.json with a billion layers (or experts) is refused
  in microseconds instead of building a billion tensor names.
- Prefill attention keeps no [queries, keys] tensor (the causal mask is computed in the kernels),
  so no term grows with queries x keys. The masked path is not counted: it runs only where
  every fused kernel failed its probe (with a warning), and adds 9 bytes per (query, key) of a
  4096-query slice (its bool mask, a float conversion and an aligned copy).
- Prefill as the largest phase, not a sum: attention's context-sized and slice-sized temporaries
  are all freed when ``forward_extend`` returns (its output alone survives), before the MLP
  allocates, so the two never coexist. Summing them with a per-token lump of every vector a
  layer might hold (the decode step's 14 / 4 / 6) put a 30000-token chunk of ``tiny`` (float32,
  CPU) at 331 MB, where the profiler's live peak is 118 MB in all and the child's RSS grows
  134-167 MB over a one-token run (glibc's retention included); by phases it is 167 MB (191 MB
  on the device with the pool and rope tables). Within a phase nothing is
  assumed freed early: that slack bounds the order of frees and the allocator's reuse inside a
  phase without modelling either. The CPU flash kernel's per-thread scratch (about 0.5 MiB a
  thread) is a workspace, left to the margin like the split workspace below.
- Available: CUDA: ``torch.cuda.mem_get_info``'s free bytes; CPU: ``MemAvailable`` of
  /proc/meminfo, or less where the cgroup's limit leaves less (``os.sysconf`` without procfs).
  On CPU, device and host bytes share that one budget.
- Margin: refuse above ``MARGIN`` (90%) of what is available: the caching allocator's
  fragmentation, the kernel backend's split workspace (a few MiB), Python objects and what other
  processes take meanwhile are not estimated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from serving.attention.prefill import QUERY_SLICE
from serving.configs.model import ModelConfig

MARGIN = 0.9
REFERENCE_SCORE_BYTES = 512 << 20  # dense_attention.SCORE_BYTES (not imported: keep this module light)
TENSOR_BOOKKEEPING = 1024  # bytes per tensor: name, shape, tensor object
PROMPT_TOKEN_BOOKKEEPING = 64  # bytes per prompt token: Python lists of ids (a few copies)


class MemoryLimitError(ValueError):
    """What the engine would allocate does not fit the device; the message has the numbers."""


@dataclass(frozen=True)
class Parameters:
    """Counts over every tensor of ``weights.expected_shapes(cfg)``: ``model`` elements stored in
    the model dtype, ``fp32`` in float32 (routers), ``tensors`` names, ``largest`` elements of
    the largest tensor a checkpoint may hold (fused experts included)."""

    model: int
    fp32: int
    tensors: int
    largest: int

    @property
    def total(self) -> int:
        return self.model + self.fp32


def unquantized_elements(cfg: ModelConfig) -> int:
    """Elements of ``count_parameters(cfg).model`` that stay dense in a block-FP8 checkpoint: the
    embeddings and heads, every norm, the attention biases, and the MTP module's ``eh_proj``
    (DeepSeek ships it in bf16)."""
    h, layers = cfg.hidden_size, cfg.block_layers
    heads = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    norms = h + layers * (2 * h + cfg.kv_lora_rank + (cfg.q_lora_rank or 0))
    biases = layers * ((cfg.q_lora_rank or 0) + cfg.latent_dim + h) if cfg.attention_bias else 0
    mtp = 3 * h + 2 * h * h + cfg.vocab_size * h if cfg.has_mtp else 0
    return heads + norms + biases + mtp


def count_parameters(cfg: ModelConfig) -> Parameters:
    """Closed-form ``Parameters`` of ``cfg`` (no per-layer or per-expert loop)."""
    h, heads, r, latent = cfg.hidden_size, cfg.num_attention_heads, cfg.kv_lora_rank, cfg.latent_dim
    q_out = heads * cfg.qk_head_dim
    attn = latent * h + r + heads * (cfg.qk_nope_head_dim + cfg.v_head_dim) * r + h * heads * cfg.v_head_dim
    attn_tensors = 4
    if cfg.q_lora_rank is None:
        attn, attn_tensors = attn + q_out * h, attn_tensors + 1
    else:
        q = cfg.q_lora_rank
        attn, attn_tensors = attn + q * h + q + q_out * q, attn_tensors + 3
        if cfg.attention_bias:
            attn, attn_tensors = attn + q, attn_tensors + 1
    if cfg.attention_bias:
        attn, attn_tensors = attn + latent + h, attn_tensors + 2
    layers = cfg.block_layers  # the MTP module's block included
    moe_layers = max(0, layers - cfg.first_k_dense_replace) if cfg.n_routed_experts else 0
    dense_layers = layers - moe_layers
    experts, inter = cfg.n_routed_experts or 0, cfg.moe_intermediate_size
    moe = experts * 3 * inter * h + (3 * inter * cfg.n_shared_experts * h if cfg.n_shared_experts else 0)
    moe_tensors = 2 + 3 * experts + (3 if cfg.n_shared_experts else 0)
    head = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    model = head + h + layers * (2 * h + attn) + dense_layers * 3 * cfg.intermediate_size * h + moe_layers * moe
    fp32 = moe_layers * (experts * h + experts)
    tensors = 2 + (0 if cfg.tie_word_embeddings else 1) + layers * (2 + attn_tensors) + dense_layers * 3 + moe_layers * moe_tensors
    if cfg.has_mtp:  # enorm, hnorm, eh_proj, shared_head.norm, shared_head.head
        model += 3 * h + 2 * h * h + cfg.vocab_size * h
        tensors += 5
    largest = max(cfg.vocab_size * h, q_out * max(h, cfg.q_lora_rank or 0), heads * (cfg.qk_nope_head_dim + cfg.v_head_dim) * r,
                  h * heads * cfg.v_head_dim, cfg.intermediate_size * h if dense_layers else 0,
                  experts * 2 * inter * h if moe_layers else 0, 3 * inter * cfg.n_shared_experts * h if moe_layers else 0)
    return Parameters(model, fp32, tensors, largest)


@dataclass(frozen=True)
class Footprint:
    """Estimated bytes (see the module docstring) and the sizes they were computed from."""

    device: torch.device
    weights: int
    pool: int
    activations: int
    host: int
    parameters: int
    dtype: torch.dtype
    slots: int
    layers: int
    latent_dim: int
    pool_dtype: torch.dtype
    chunk: int
    context: int
    prefill: int
    step_context: int
    step: int

    @property
    def on_device(self) -> int:
        """Bytes from the device's budget (on CPU: everything)."""
        own = self.weights + self.pool + self.activations
        return own + (self.host if self.device.type == "cpu" else 0)


def _size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def prefill_peak(cfg: ModelConfig, a: int, p: int, chunk: int, context: int) -> int:
    """Peak activation bytes of one prefill forward of ``chunk`` queries over ``context`` keys
    (one request; model dtype of ``a`` bytes, pool dtype of ``p``): what the forward holds
    through its layers plus the largest of a layer's three phases (attention, the residual add
    and norm after it, the MLP), each counting what it allocates as alive until it ends."""
    f32, h, heads, latent, r = 4, cfg.hidden_size, cfg.num_attention_heads, cfg.latent_dim, cfg.kv_lora_rank
    qk, v, nope, rope = cfg.qk_head_dim, cfg.v_head_dim, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
    wide = max(qk, v)  # the cpu and flash kernels' head dim: the narrower of q / k and v padded to it
    upcast = a != f32  # .float() (and the cast back) copies only below float32

    def norm(width: int) -> int:  # rms_norm unfused: (x.float()), pow, x32 * statistics, (.to(dtype)), weight *
        return width * (2 * f32 + a + (f32 + a if upcast else 0)) + f32

    t, s, n = chunk, min(chunk, QUERY_SLICE), context
    # Through every layer: the step's packed fields (host and device copies), the rope tables gathered for
    # the chunk, the context's kv_indices; with an MTP module its block runs with two more hidden-wide
    # vectors alive (the target's normed output and the module's embedding).
    held = t * (64 + a * rope + (2 * a * h if cfg.has_mtp else 0)) + 4 * n

    # Attention (forward's x and h held). Per query: the projections (q's LoRA and its norm), rope (the
    # concatenation and the rotation's four temporaries), the latent row's norm and the row written to the
    # pool (and its cast), forward_extend's q and out, q padded where narrower, o_proj's output. Per query
    # of a slice: the two partial outputs and their log-sum-exps, and the merge (five [H, n] float32
    # log-sum-exps and weights, three v-wide float32 products, the partials' casts up and the result's
    # down). Per key of context: its slot (int64), the gathered row (and its cast), the kv_b_proj
    # expansion [H, nope + v], K, and the padded copy of V (or of K).
    if cfg.q_lora_rank is None:
        projections = a * (heads * qk + latent)
    else:
        projections = a * (cfg.q_lora_rank + latent + heads * qk) + norm(cfg.q_lora_rank)
    row = a * latent + (p * latent if p != a else 0)
    per_query = projections + 5 * a * (heads + 1) * rope + norm(r) + row + a * heads * (qk + v) \
        + (a * heads * wide if qk < wide else 0) + a * h
    merge = 5 * f32 * heads + 3 * f32 * heads * v + (2 * f32 * heads * v + a * heads * v if upcast else 0)
    per_slice_query = 2 * (a * heads * wide + f32 * heads) + merge
    per_key = 8 + row + a * heads * (nope + v + qk) + a * heads * wide * ((v < wide) + (qk < wide))
    attention = t * (2 * a * h + per_query) + s * per_slice_query + n * per_key

    # The residual add and the norm after attention: x, h and the attention's output held.
    add_norm = t * (3 * a * h + a * h + norm(h))

    # The MLP: forward's x and h, the block's attention output and its new x and h held (five hidden-wide).
    # Dense: gate_up, silu, the product, down. MoE (rows grouped per expert): the router's float32 scores and
    # the selection's masks and indices, the routed output, unique's sort, then per expert its rows (at most
    # the chunk: their indices, gathered x, gate_up, silu, the product, down, the weight, the float32
    # weighted y and its cast), two iterations' alive at once (names are rebound one at a time), and the
    # shared experts' MLP and sum.
    moe = bool(cfg.n_routed_experts) and cfg.block_layers > cfg.first_k_dense_replace
    mlp = t * (5 * a * h + a * (4 * cfg.intermediate_size + h)) if not moe or cfg.first_k_dense_replace > 0 else 0
    if moe:
        e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
        route = (f32 * h if upcast else 0) + 22 * e + 32 * cfg.n_group + 12 * cfg.topk_group + 24 * k + 8
        per_row = 16 + f32 + a * (2 * h + 4 * cfg.moe_intermediate_size) + f32 * h + (a * h if upcast else 0)
        routed = a * h + 24 * k + 2 * k + min(2, k) * per_row
        shared = a * (4 * cfg.moe_intermediate_size * cfg.n_shared_experts + 2 * h) if cfg.n_shared_experts else 0
        mlp = max(mlp, t * (5 * a * h + route + routed + shared))
    logits = 2 * f32 * cfg.vocab_size  # the prompt's last row
    return held + max(attention, add_norm, mlp) + logits


def estimate(
    cfg: ModelConfig,
    device: torch.device | str,
    dtype: torch.dtype,
    *,
    pool_dtype: torch.dtype | None = None,
    pool_slots: int = 0,
    prompt_lens: list[int] | tuple[int, ...] = (),
    max_new_tokens: int = 0,
    prefill_chunk: int = 32768,
    draft_tokens: int = 0,
    random_weights: bool = False,
    keep_fp8: bool = False,
) -> Footprint:
    """The bytes a model of ``cfg`` in ``dtype`` on ``device`` with a pool of ``pool_slots`` rows
    takes to serve prompts of ``prompt_lens`` tokens (``draft_tokens`` per verify step).

    random_weights: weights drawn in float32 on the host (``random_models``), else read from a
    checkpoint. With no slots and no prompts it covers loading the weights only.
    keep_fp8: a block-FP8 ``cfg``'s projections stay FP8 on the device (else dequantized at load).
    """
    device = torch.device(device)
    pool_dtype = pool_dtype or dtype
    a, f32 = _size(dtype), 4
    params = count_parameters(cfg)
    h, heads, latent = cfg.hidden_size, cfg.num_attention_heads, cfg.latent_dim
    kv_b = heads * (cfg.qk_nope_head_dim + cfg.v_head_dim) * cfg.kv_lora_rank
    moe_layers = cfg.block_layers > cfg.first_k_dense_replace and bool(cfg.n_routed_experts)
    stacking = 2 * (cfg.n_routed_experts or 0) * 3 * cfg.moe_intermediate_size * h * a if moe_layers else 0
    weights = params.model * a + params.fp32 * f32 + cfg.block_layers * kv_b * a + stacking
    if cfg.quantization is not None and keep_fp8:
        dense = unquantized_elements(cfg) + cfg.block_layers * kv_b
        quantized = params.model - dense
        block = cfg.quantization.block
        widest = max(h, cfg.intermediate_size, heads * max(cfg.qk_head_dim, cfg.qk_nope_head_dim + cfg.v_head_dim),
                     cfg.moe_intermediate_size * max(1, cfg.n_shared_experts), cfg.q_lora_rank or 0)
        scales = f32 * (quantized // (block * block) + params.tensors * (2 * (widest // block + 1) + 1))  # ceil per tensor
        q_out = heads * cfg.qk_head_dim
        dequantized = max(q_out * (cfg.q_lora_rank or h), (latent + (cfg.q_lora_rank or 0)) * h, h * heads * cfg.v_head_dim,
                          2 * cfg.intermediate_size * h, 2 * cfg.moe_intermediate_size * max(1, cfg.n_shared_experts) * h)
        weights = dense * a + quantized + scales + params.fp32 * f32 + cfg.block_layers * kv_b * a + stacking // a \
            + dequantized * a  # the largest projection dequantized for one prefill GEMM
    pool = pool_slots * cfg.block_layers * latent * _size(pool_dtype)

    longest = max(prompt_lens, default=0)
    chunk = min(prefill_chunk, longest)
    prefill = prefill_peak(cfg, a, _size(pool_dtype), chunk, longest) if prompt_lens else 0
    width_mlp = max(cfg.intermediate_size, cfg.moe_intermediate_size * max(2, cfg.n_shared_experts))
    per_token = a * (14 * h + 4 * width_mlp + 6 * heads * max(cfg.qk_head_dim, latent)) + f32 * (2 * h + 8 * (cfg.n_routed_experts or 0))
    step_context = min(pool_slots, longest + max_new_tokens + 64) if prompt_lens else 0
    t = 1 + draft_tokens
    tokens = len(prompt_lens) * t
    scores = 3 * min(t * heads * step_context * f32, max(REFERENCE_SCORE_BYTES, t * step_context * f32))
    step = tokens * (per_token + 2 * f32 * cfg.vocab_size) + step_context * (2 * latent * f32 + t) + scores
    rope = 16 * max(step_context, longest, 2048) * cfg.qk_rope_head_dim if prompt_lens else 0
    activations = (max(prefill, step) + rope + 8 * pool_slots) if prompt_lens else 0

    staging = params.total * f32 if random_weights else params.largest * 8
    if random_weights and device.type == "cpu" and dtype == torch.float32:
        staging = 0  # the float32 draws are the weights
    host = staging + params.tensors * TENSOR_BOOKKEEPING + sum(prompt_lens) * PROMPT_TOKEN_BOOKKEEPING
    return Footprint(device, weights, pool, activations, host, params.total, dtype, pool_slots, cfg.block_layers,
                     latent, pool_dtype, chunk, longest, prefill, step_context, step)


def host_available_bytes() -> int:
    """Bytes the host can still hand out: /proc/meminfo's MemAvailable, capped by the cgroup's limit."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    if avail is None:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit, usage = Path(limit_file).read_text().strip(), int(Path(usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit.isdigit():
            avail = min(avail, max(0, int(limit) - usage))
    return avail


def available_bytes(device: torch.device) -> int:
    """Free bytes of ``device``: ``torch.cuda.mem_get_info`` on CUDA, the host's otherwise."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return host_available_bytes()


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check(fp: Footprint, device_free: int | None = None, host_free: int | None = None) -> None:
    """MemoryLimitError unless ``fp`` fits ``MARGIN`` of the free bytes (measured when not given)."""
    device_free = available_bytes(fp.device) if device_free is None else device_free
    if fp.on_device > MARGIN * device_free:
        parts = [("weights", fp.weights), ("KV pool", fp.pool), ("activations", fp.activations)]
        if fp.device.type == "cpu":
            parts.append(("host", fp.host))
        _refuse(fp, fp.on_device, device_free, str(fp.device), max(parts, key=lambda p: p[1])[0])
    if fp.device.type != "cpu":
        host_free = host_available_bytes() if host_free is None else host_free
        if fp.host > MARGIN * host_free:
            _refuse(fp, fp.host, host_free, "the host", "host")


HINTS = {
    "weights": "the weights alone are too large: use a device with more memory, a smaller dtype or a smaller model",
    "KV pool": "use fewer KV pool slots (--pool-slots, or shorter prompts and fewer --max-new-tokens)",
    "activations": "use a smaller --prefill-chunk, shorter prompts or fewer --max-new-tokens",
    "host": "free host memory, or load a smaller model",
}


def _refuse(fp: Footprint, need: int, free: int, where: str, largest: str) -> None:
    raise MemoryLimitError(
        f"Expected what the engine allocates to fit in {int(MARGIN * 100)}% of the {fmt_bytes(free)} free on {where}, "
        f"got an estimated {fmt_bytes(need)}: weights {fmt_bytes(fp.weights)} ({fp.parameters:,} parameters, "
        f"{str(fp.dtype).removeprefix('torch.')}), KV pool {fmt_bytes(fp.pool)} ({fp.slots:,} slots x {fp.layers:,} layers x "
        f"{fp.latent_dim} x {_size(fp.pool_dtype)} B), activations {fmt_bytes(fp.activations)} (prefill {fmt_bytes(fp.prefill)} "
        f"for a {fp.chunk:,}-token chunk over {fp.context:,} tokens of context, decode {fmt_bytes(fp.step)} over up to "
        f"{fp.step_context:,} tokens), host {fmt_bytes(fp.host)}; {HINTS[largest]}"
    )
