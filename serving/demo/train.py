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
- Reproducible inputs: a fixed number of steps, a seeded model and a seeded sampler of training
  windows; the corpus is fixed by the interpreter's installs (``serving.demo.corpus``). The GPU's
  training kernels are not bitwise deterministic: two runs' losses agree to about 0.1.
- Files are separated by an end-of-text token, which is also the model's end-of-sequence id.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from serving.demo.corpus import split

EOT = "<|endoftext|>"

SIZES = {
    "default": dict(vocab=8192, hidden=768, layers=8, heads=16, q_lora=384, inter=3072, max_bytes=120_000_000,
                    tokenizer_bytes=24_000_000, steps=1100, batch=16, seq=2048, lr=1.2e-3, max_files=None),
    "tiny": dict(vocab=384, hidden=64, layers=2, heads=2, q_lora=32, inter=128, max_bytes=400_000,
                 tokenizer_bytes=200_000, steps=12, batch=4, seq=64, lr=3e-3, max_files=3000),
}


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
    cfg._attn_implementation = "sdpa"
    return cfg


class MTPModule(nn.Module):
    """DeepSeek's MTP module around transformers' own decoder block (the names it is saved under)."""

    def __init__(self, cfg) -> None:
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm

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
    return tok


def run(out: Path, tiny: bool = False, steps: int | None = None, seed: int = 0, device: str | None = None,
        mtp_weight: float = 0.3, log=print) -> dict:
    """Train and save; returns the run's summary (also ``out/train.json``)."""
    from safetensors.torch import save_file
    from transformers import DeepseekV3ForCausalLM

    t_start = time.perf_counter()
    size = dict(SIZES["tiny" if tiny else "default"])
    steps = size["steps"] if steps is None else steps
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out.mkdir(parents=True, exist_ok=True)
    train_files, held_files = split(size["max_bytes"], size["max_files"])
    texts = [f.text() for f in train_files]
    log(f"corpus: {len(train_files)} training files ({sum(map(len, texts)) / 1e6:.1f} M characters), {len(held_files)} held out")
    tok = train_tokenizer(texts, size["vocab"], size["tokenizer_bytes"])
    eot = tok.token_to_id(EOT)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eot)
    data = torch.tensor(ids, dtype=torch.long)
    log(f"tokens: {len(data)} ({time.perf_counter() - t_start:.0f} s in)")

    cfg = model_config(size, tiny)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(cfg).to(dev)
    mtp = MTPModule(cfg).to(dev)
    params = sum(p.numel() for p in model.parameters()) + sum(p.numel() for p in mtp.parameters())
    log(f"parameters: {params / 1e6:.1f} M (target and MTP module)")
    opt = torch.optim.AdamW(list(model.parameters()) + list(mtp.parameters()), lr=size["lr"], betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    seq, bs = size["seq"], size["batch"]
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    warmup = max(1, steps // 20)
    history = []
    t_train = time.perf_counter()
    model.train()
    mtp.train()
    for step in range(steps):
        starts = torch.randint(0, len(data) - seq - 2, (bs,), generator=gen)
        x = torch.stack([data[s : s + seq + 1] for s in starts.tolist()]).to(dev)
        lr = size["lr"] * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        with autocast:
            inputs = x[:, :seq]
            hidden = model.model(input_ids=inputs).last_hidden_state  # final-normed
            loss_main = F.cross_entropy(model.lm_head(hidden).float().view(-1, cfg.vocab_size), x[:, 1 : seq + 1].reshape(-1))
            positions = torch.arange(seq - 1, device=dev)[None].expand(bs, -1)
            embeds = model.model.embed_tokens(x[:, 1:seq])
            rope = model.model.rotary_emb(embeds, positions)
            mtp_out = mtp(hidden[:, : seq - 1], embeds, rope)
            loss_mtp = F.cross_entropy(model.lm_head(mtp_out).float().view(-1, cfg.vocab_size), x[:, 2 : seq + 1].reshape(-1))
            loss = loss_main + mtp_weight * loss_mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()) + list(mtp.parameters()), 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            row = {"step": step, "loss": loss_main.item(), "mtp_loss": loss_mtp.item(), "s": time.perf_counter() - t_train}
            history.append(row)
            log(f"step {step} loss {row['loss']:.3f} mtp {row['mtp_loss']:.3f} ({row['s']:.0f} s)")
    train_s = time.perf_counter() - t_train

    model.eval()
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    raw = json.loads((out / "config.json").read_text())
    raw["num_nextn_predict_layers"] = 1
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    save_file(mtp_state_dict(mtp, model.lm_head.weight, cfg.num_hidden_layers), str(out / "mtp.safetensors"))
    tok.save(str(out / "tokenizer.json"))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eot, "bos_token_id": eot}))
    heldout = heldout_prompts(tok, held_files, 4096 if not tiny else 96)
    (out / "heldout.json").write_text(json.dumps(heldout))
    summary = {"parameters": params, "train_tokens": len(data), "tokens_seen": steps * bs * seq, "steps": steps,
               "train_s": train_s, "tokens_per_s": steps * bs * seq / train_s, "total_s": time.perf_counter() - t_start,
               "final_loss": history[-1]["loss"], "final_mtp_loss": history[-1]["mtp_loss"], "device": str(dev),
               "train_files": len(train_files), "heldout_files": len(held_files), "history": history}
    (out / "train.json").write_text(json.dumps(summary, indent=1))
    log(f"saved {out}: {summary['total_s']:.0f} s in all, {summary['tokens_per_s']:.0f} training tokens/s")
    return summary


def heldout_prompts(tok, files, max_tokens: int) -> dict:
    """The held-out files and, for those long enough, their first ``max_tokens`` tokens."""
    prompts = []
    for f in files:
        ids = tok.encode(f.text()).ids
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
