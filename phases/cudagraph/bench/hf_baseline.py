"""The baseline a user would otherwise pick: transformers' ``DeepseekV3ForCausalLM`` decoding at a
long context, eager and with a static cache under ``torch.compile(mode="reduce-overhead")``.

Same shapes as the engine's random preset (``dsv3-tp8`` by default), random bf16 weights, B=1.
The static cache is filled with random keys and values up to ``context`` (no prefill: decode
cost does not depend on their values) and each step decodes one token at the next position,
attending over the whole context, as the engine's ``end_to_end`` rows do.

    python -m phases.cudagraph.bench.hf_baseline --context 65536 [--compile] --out hf.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from serving.model.presets import PRESETS

HF_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
           "num_attention_heads", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
           "first_k_dense_replace", "max_position_embeddings", "rope_parameters")


def build(preset: str, device: str = "cuda"):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    params = {k: PRESETS[preset][k] for k in HF_KEYS if k in PRESETS[preset]}
    params.update(num_key_value_heads=params["num_attention_heads"], n_routed_experts=8, num_experts_per_tok=2,
                  n_group=1, topk_group=1)  # every layer dense (first_k_dense_replace): no expert is built
    cfg = DeepseekV3Config(**params)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = DeepseekV3ForCausalLM(cfg).to(torch.bfloat16).eval()
    return model, cfg


def run(preset: str = "dsv3-tp8", context: int = 65536, steps: int = 10, warmup: int = 3, compile: bool = False,
        device: str = "cuda") -> dict:
    from transformers import StaticCache

    model, cfg = build(preset, device)
    cache = StaticCache(config=cfg, max_cache_len=context + warmup + steps + 1)
    step = torch.tensor([[1]], device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad():
        model(step, past_key_values=cache, cache_position=torch.tensor([0], device=device), use_cache=True)
        for layer in cache.layers:  # random keys and values for the whole context
            layer.keys.normal_()
            layer.values.normal_()
        forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=False) if compile else model.forward
        times = []
        t_compile = time.perf_counter()
        for i in range(warmup + steps):
            position = torch.tensor([context + i], device=device)
            sync()
            t0 = time.perf_counter()
            out = forward(step, past_key_values=cache, cache_position=position, use_cache=True)
            step = out.logits[:, -1:].argmax(-1)
            sync()
            times.append(time.perf_counter() - t0)
            if i == warmup - 1:
                t_compile = time.perf_counter() - t_compile
    median = statistics.median(times[warmup:])
    return {"preset": preset, "context": context, "compile": compile, "tokens_per_s": 1 / median, "step_ms": median * 1e3,
            "warmup_s": t_compile}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="dsv3-tp8")
    parser.add_argument("--context", type=int, default=65536)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = run(args.preset, args.context, compile=args.compile)
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
