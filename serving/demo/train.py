"""``python -m serving.demo train --out DIR``: a DeepSeek-V3-shaped model and its MTP module,
trained with transformers on real Python sources, saved as DeepSeek lays a checkpoint out.

What it writes to DIR: ``config.json`` (``num_nextn_predict_layers: 1``), ``model.safetensors``
(the target, by ``save_pretrained``), ``mtp.safetensors`` (the MTP module at layer index
``num_hidden_layers``: ``enorm``, ``hnorm``, ``eh_proj``, a decoder block, ``shared_head``; no
embeddings of its own, so it shares the target's), ``tokenizer.json`` (a byte-level BPE from
``tokenizers``), ``generation_config.json``, ``heldout.json`` (the held-out files and prompts
cut from them) and ``train.json`` (the run: losses, tokens, seconds).

Decisions:
- Shape (default): 576-wide latent rows (kv_lora_rank 512 + rope 64), 8 layers, hidden 768,
  16 heads, q LoRA 384, dense MLPs (MoE is not what this model is for), about 100M parameters.
  ``--tiny`` is the same run at a size a CPU trains in seconds (the tests' path).
- The MTP module is trained jointly with the target (DeepSeek-V3 report §2.2, loss weight
  ``mtp_weight``): row i pairs the target's final-normed hidden state at i with the embedding
  of token i+1 and predicts token i+2, at position i, as SGLang and vLLM run it.
- The output head is shared with the target while training and saved as the module's own
  ``shared_head.head`` (DeepSeek's checkpoints carry that copy too).
- Long positions are trained, not extrapolated: every ``long_every``-th step is one window of
  ``long_seq`` tokens (16k at full size) instead of ``batch`` windows of ``seq``, so the model
  is served at 16k contexts with positions and distances it has seen. A model trained on 2k
  windows alone drafts half as well at 16k (RoPE does not extrapolate); one long window per
  eight steps costs about a tenth more time. ``train.json`` has the held-out loss and top-1
  accuracy by position, so whether the long positions were learnt is on record.
- Deterministic: a fixed number of steps, a seeded model, a seeded sampler of training windows,
  and torch's deterministic algorithms while training (restored after, so the serving code that
  runs next in the same process is not constrained); the corpus is fixed by the interpreter's
  installs (``serving.demo.corpus``).
- Files are separated by an end-of-text token, which is also the model's end-of-sequence and
  beginning-of-sequence id: the saved tokenizer puts it before every text it encodes (as
  DeepSeek's tokenizer adds its BOS), so a prompt reads as the start of a file. Training and
  held-out text are encoded without it and joined by it.
- Training attention (``padded_flash_attention``): SDPA's flash kernels with the value heads
  zero-padded to the query width (64 -> 128), their output cut back. Flash needs one head width;
  under torch's deterministic mode its backward stays parallel (dQ split over the SMs), where
  the memory-efficient kernel's runs one block per (window, head): 16 blocks for a 16k window,
  which made a deterministic run twice as long.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from serving.demo.corpus import split

EOT = "<|endoftext|>"

SIZES = {
    "default": dict(vocab=8192, hidden=768, layers=8, heads=16, q_lora=384, inter=3072, max_bytes=120_000_000,
                    tokenizer_bytes=24_000_000, steps=1100, batch=16, seq=2048, long_seq=16384, long_every=8,
                    lr=1.2e-3, max_files=None, eval_windows=2),
    "tiny": dict(vocab=384, hidden=64, layers=2, heads=2, q_lora=32, inter=128, max_bytes=400_000,
                 tokenizer_bytes=200_000, steps=12, batch=4, seq=64, long_seq=192, long_every=4,
                 lr=3e-3, max_files=3000, eval_windows=1),
}


def window(size: dict, step: int) -> tuple[int, int]:
    """(windows, tokens per window) of a training step: one long window every ``long_every``-th step."""
    if size["long_every"] and step % size["long_every"] == size["long_every"] - 1:
        return 1, size["long_seq"]
    return size["batch"], size["seq"]


def position_buckets(long_seq: int, seq: int) -> list[tuple[int, int]]:
    """Position ranges the held-out evaluation reports: within the short windows, then by fours to ``long_seq``."""
    edges = [0, seq]
    while edges[-1] < long_seq:
        edges.append(min(long_seq, edges[-1] * 4))
    return list(zip(edges[:-1], edges[1:]))


def model_config(size: dict, tiny: bool):
    from transformers import DeepseekV3Config

    latent = (32, 16) if tiny else (512, 64)  # (kv_lora_rank, qk_rope_head_dim): 576-wide rows at full size
    cfg = DeepseekV3Config(
        vocab_size=size["vocab"], hidden_size=size["hidden"], intermediate_size=size["inter"], moe_intermediate_size=64,
        num_hidden_layers=size["layers"], num_attention_heads=size["heads"], num_key_value_heads=size["heads"],
        kv_lora_rank=latent[0], qk_rope_head_dim=latent[1], qk_nope_head_dim=latent[1], v_head_dim=latent[1],
        q_lora_rank=size["q_lora"], n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=size["layers"] + 1,  # every block dense, the MTP module's included
        max_position_embeddings=32768 if not tiny else 2048, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0), bos_token_id=0, eos_token_id=0,
    )
    cfg._attn_implementation = TRAIN_ATTENTION
    return cfg


TRAIN_ATTENTION = "demo_causal_padded_v"  # no "flash" in it: transformers would look for a flash-attn package


def padded_flash_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """Causal self-attention of training windows (transformers' attention-function signature).

    query, key: [B, H, S, d_qk]; value: [B, H, S, d_v] with d_v <= d_qk. Returns ([B, S, H, d_v], None).
    On CUDA only the flash kernels may run (a fallback would be slow or nondeterministic).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if attention_mask is not None or query.shape[2] != key.shape[2]:
        raise ValueError(f"Expected unmasked causal self-attention over one window, got a mask or {query.shape[2]} "
                         f"queries over {key.shape[2]} keys")
    width = value.shape[-1]
    value = F.pad(value, (0, query.shape[-1] - width))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION] if query.is_cuda else [SDPBackend.MATH]):
        out = F.scaled_dot_product_attention(query, key, value, dropout_p=dropout, scale=scaling, is_causal=True)
    return out[..., :width].transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """Make ``TRAIN_ATTENTION`` known to transformers (attention and mask functions)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(TRAIN_ATTENTION, padded_flash_attention)
    AttentionMaskInterface.register(TRAIN_ATTENTION, sdpa_mask)  # None for unpadded causal windows


class MTPModule(nn.Module):
    """DeepSeek's MTP module around transformers' own decoder block (the names it is saved under)."""

    def __init__(self, cfg) -> None:
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
            DeepseekV3DecoderLayer,
            DeepseekV3RMSNorm,
        )

        super().__init__()
        h = cfg.hidden_size
        self.enorm = DeepseekV3RMSNorm(h, cfg.rms_norm_eps)
        self.hnorm = DeepseekV3RMSNorm(h, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.block = DeepseekV3DecoderLayer(cfg, layer_idx=cfg.num_hidden_layers)
        self.shared_head_norm = DeepseekV3RMSNorm(h, cfg.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, next_embeds: torch.Tensor, position_embeddings) -> torch.Tensor:
        """hidden, next_embeds: [B, S, h]; returns the normed output [B, S, h] (before the head)."""
        x = self.eh_proj(torch.cat([self.enorm(next_embeds), self.hnorm(hidden)], dim=-1))
        out = self.block(x, attention_mask=None, position_embeddings=position_embeddings)
        x = out[0] if isinstance(out, tuple) else out
        return self.shared_head_norm(x)


def mtp_state_dict(mtp: MTPModule, head: torch.Tensor, layer: int) -> dict[str, torch.Tensor]:
    """The module's tensors under DeepSeek's names (``model.layers.{layer}.``)."""
    p = f"model.layers.{layer}."
    out = {p + "enorm.weight": mtp.enorm.weight, p + "hnorm.weight": mtp.hnorm.weight, p + "eh_proj.weight": mtp.eh_proj.weight,
           p + "shared_head.norm.weight": mtp.shared_head_norm.weight, p + "shared_head.head.weight": head}
    out.update({p + k: v for k, v in mtp.block.state_dict().items()})
    return {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in out.items()}


def train_tokenizer(texts: list[str], vocab: int, budget: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    sample, total = [], 0
    for t in texts:  # the tokenizer learns from a prefix of the (hash-ordered) corpus
        if total >= budget:
            break
        sample.append(t)
        total += len(t)
    tok.train_from_iterator(sample, trainer=trainer)
    from tokenizers.processors import TemplateProcessing

    eot = tok.token_to_id(EOT)
    tok.post_processor = TemplateProcessing(single=f"{EOT} $A", pair=f"{EOT} $A {EOT} $B", special_tokens=[(EOT, eot)])
    return tok


def run(out: Path, tiny: bool = False, steps: int | None = None, seed: int = 0, device: str | None = None,
        mtp_weight: float = 0.3, log=print, **overrides) -> dict:
    """Train and save; returns the run's summary (also ``out/train.json``). ``overrides`` replace
    entries of the size (``SIZES``), for short runs of the full shape."""
    from safetensors.torch import save_file
    from transformers import DeepseekV3ForCausalLM

    t_start = time.perf_counter()
    size = dict(SIZES["tiny" if tiny else "default"])
    unknown = set(overrides) - set(size)
    if unknown:
        raise ValueError(f"Expected size entries among {sorted(size)}, got {sorted(unknown)}")
    size.update(overrides)
    steps = size["steps"] if steps is None else steps
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out.mkdir(parents=True, exist_ok=True)
    train_files, held_files = split(size["max_bytes"], size["max_files"])
    texts = [f.text() for f in train_files]
    log(f"corpus: {len(train_files)} training files ({sum(map(len, texts)) / 1e6:.1f} M characters), {len(held_files)} held out")
    tok = train_tokenizer(texts, size["vocab"], size["tokenizer_bytes"])
    eot = tok.token_to_id(EOT)
    data = torch.tensor(joined_ids(tok, texts, eot), dtype=torch.long)
    log(f"tokens: {len(data)} ({time.perf_counter() - t_start:.0f} s in)")

    cfg = model_config(size, tiny)
    register_attention()
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(cfg).to(dev)
    mtp = MTPModule(cfg).to(dev)
    params = sum(p.numel() for p in model.parameters()) + sum(p.numel() for p in mtp.parameters())
    log(f"parameters: {params / 1e6:.1f} M (target and MTP module)")
    with deterministic_algorithms():
        history, tokens_seen, train_s = train_steps(model, mtp, data, size, steps, seed, dev, mtp_weight, log)
        heldout = heldout_prompts(tok, held_files, 4096 if not tiny else 96)
        evaluation = evaluate_by_position(model, mtp, heldout_eval_ids(tok, held_files, eot, size), size, dev)
    for name, row in evaluation.items():
        log(f"held out {name}: loss {row['loss']:.3f} top-1 {row['top1']:.3f}, MTP loss {row['mtp_loss']:.3f} top-1 {row['mtp_top1']:.3f}")

    model.eval()
    cfg._attn_implementation = "sdpa"  # what a reader of the folder gets (the name is not saved either way)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    raw = json.loads((out / "config.json").read_text())
    raw["num_nextn_predict_layers"] = 1
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    save_file(mtp_state_dict(mtp, model.lm_head.weight, cfg.num_hidden_layers), str(out / "mtp.safetensors"))
    tok.save(str(out / "tokenizer.json"))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eot, "bos_token_id": eot}))
    (out / "heldout.json").write_text(json.dumps(heldout))
    summary = {"parameters": params, "train_tokens": len(data), "tokens_seen": tokens_seen, "steps": steps,
               "train_s": train_s, "tokens_per_s": tokens_seen / train_s, "total_s": time.perf_counter() - t_start,
               "final_loss": history[-1]["loss"], "final_mtp_loss": history[-1]["mtp_loss"], "device": str(dev),
               "train_files": len(train_files), "heldout_files": len(held_files), "windows": {
                   "seq": size["seq"], "batch": size["batch"], "long_seq": size["long_seq"], "long_every": size["long_every"]},
               "heldout_by_position": evaluation, "history": history}
    (out / "train.json").write_text(json.dumps(summary, indent=1))  # last: its presence marks a finished folder
    log(f"saved {out}: {summary['total_s']:.0f} s in all, {summary['tokens_per_s']:.0f} training tokens/s")
    return summary


def joined_ids(tok, texts: list[str], eot: int) -> list[int]:
    """The texts' tokens, each file followed by the end-of-text id."""
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    return ids


class deterministic_algorithms:
    """torch's deterministic algorithms inside, the caller's setting after. cuBLAS needs a fixed
    workspace for it (``CUBLAS_WORKSPACE_CONFIG``); set unless the caller chose one."""

    def __enter__(self):
        self.saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        return self

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.saved[0], warn_only=self.saved[1])
        return False


def mtp_inputs(model, x: torch.Tensor, seq: int):
    """(hidden [B, seq, h], the MTP module's next embeddings [B, seq-1, h], its rope) for windows x [B, seq+1]."""
    hidden = model.model(input_ids=x[:, :seq]).last_hidden_state  # final-normed
    positions = torch.arange(seq - 1, device=x.device)[None].expand(x.shape[0], -1)
    embeds = model.model.embed_tokens(x[:, 1:seq])
    return hidden, embeds, model.model.rotary_emb(embeds, positions)


def train_steps(model, mtp, data: torch.Tensor, size: dict, steps: int, seed: int, dev: torch.device,
                mtp_weight: float, log) -> tuple[list[dict], int, float]:
    """The training loop: (loss history, tokens seen, seconds)."""
    vocab = model.config.vocab_size
    params = list(model.parameters()) + list(mtp.parameters())
    opt = torch.optim.AdamW(params, lr=size["lr"], betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    warmup = max(1, steps // 20)
    history, seen = [], 0
    t_train = time.perf_counter()
    model.train()
    mtp.train()
    for step in range(steps):
        bs, seq = window(size, step)
        if len(data) < seq + 3:
            raise ValueError(f"Expected a corpus longer than a {seq}-token window, got {len(data)} tokens")
        starts = torch.randint(0, len(data) - seq - 2, (bs,), generator=gen)
        x = torch.stack([data[s : s + seq + 1] for s in starts.tolist()]).to(dev)
        seen += bs * seq
        lr = size["lr"] * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        with autocast:
            hidden, embeds, rope = mtp_inputs(model, x, seq)
            loss_main = F.cross_entropy(model.lm_head(hidden).float().view(-1, vocab), x[:, 1 : seq + 1].reshape(-1))
            mtp_out = mtp(hidden[:, : seq - 1], embeds, rope)
            loss_mtp = F.cross_entropy(model.lm_head(mtp_out).float().view(-1, vocab), x[:, 2 : seq + 1].reshape(-1))
            loss = loss_main + mtp_weight * loss_mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            row = {"step": step, "seq": seq, "loss": loss_main.item(), "mtp_loss": loss_mtp.item(), "s": time.perf_counter() - t_train}
            history.append(row)
            log(f"step {step} loss {row['loss']:.3f} mtp {row['mtp_loss']:.3f} ({row['s']:.0f} s)")
    return history, seen, time.perf_counter() - t_train


def heldout_eval_ids(tok, files, eot: int, size: dict) -> torch.Tensor:
    """Held-out windows of ``long_seq + 1`` tokens [W, long_seq + 1]: the held-out files joined
    as training joins its files. Fewer (or none) when the held-out text is shorter."""
    n = size["long_seq"] + 1
    ids = joined_ids(tok, [f.text() for f in files], eot)
    count = min(size["eval_windows"], len(ids) // n)
    return torch.tensor(ids[: count * n], dtype=torch.long).view(count, n)


@torch.no_grad()
def evaluate_by_position(model, mtp, windows: torch.Tensor, size: dict, dev: torch.device) -> dict:
    """Held-out cross-entropy and top-1 accuracy, the target's (next token) and the MTP module's
    (the token after it), by position range (``position_buckets``): whether the long positions
    were learnt."""
    seq = windows.shape[1] - 1
    if seq < 2 or len(windows) == 0:
        return {}
    model.eval()
    mtp.eval()
    x = windows.to(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        hidden, embeds, rope = mtp_inputs(model, x, seq)
        logits = model.lm_head(hidden).float()  # predicts x[:, 1:]
        mtp_logits = model.lm_head(mtp(hidden[:, : seq - 1], embeds, rope)).float()  # predicts x[:, 2:]
    loss = F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
    top1 = (logits.argmax(-1) == x[:, 1:]).float()
    mtp_loss = F.cross_entropy(mtp_logits.transpose(1, 2), x[:, 2:], reduction="none")
    mtp_top1 = (mtp_logits.argmax(-1) == x[:, 2:]).float()
    out = {}
    for lo, hi in position_buckets(seq, size["seq"]):
        out[f"{lo}-{hi}"] = {"loss": loss[:, lo:hi].mean().item(), "top1": top1[:, lo:hi].mean().item(),
                             "mtp_loss": mtp_loss[:, lo:hi].mean().item(), "mtp_top1": mtp_top1[:, lo:hi].mean().item()}
    model.train()
    mtp.train()
    return out


def heldout_prompts(tok, files, max_tokens: int) -> dict:
    """The held-out files and, for those long enough, their first ``max_tokens`` tokens."""
    prompts = []
    for f in files:
        ids = tok.encode(f.text(), add_special_tokens=False).ids
        if len(ids) >= max_tokens + 256:
            prompts.append({"file": f.relative, "ids": ids[:max_tokens]})
    return {"files": [f.relative for f in files], "prompts": prompts}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving.demo", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train the demo model and its MTP module, save it to --out")
    t.add_argument("--out", required=True, type=Path)
    t.add_argument("--tiny", action="store_true", help="a model a CPU trains in seconds (the tests' size)")
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        print(f"error: Expected --steps >= 1, got {args.steps}")
        return 2
    run(args.out, tiny=args.tiny, steps=args.steps, seed=args.seed, device=args.device)
    return 0
