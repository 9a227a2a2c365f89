"""``python -m serving generate``: greedy generation from a model folder or a seeded random model.

Example::

    python -m serving generate --random-model tiny --prompt 1,2,3 --max-new-tokens 16 --speculate tree:4x4
    python -m serving generate --random-model gpu-h16 --random-prompt 131072 --max-new-tokens 64 --backend kernel

Prints the tokens, decode tokens/s, accepted drafts per step and attention's share of a step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from serving.engine.attention import make_backend
from serving.engine.drafters import parse_speculate
from serving.engine.engine import Engine
from serving.engine.model import DeepseekV3Model
from serving.engine.random_models import PRESETS, random_model

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_prompt(text: str, folder: str | None) -> list[int]:
    """Comma- or space-separated token ids, else text through the folder's tokenizer.json."""
    parts = text.replace(",", " ").split()
    if parts and all(p.isdigit() for p in parts):
        return [int(p) for p in parts]
    tok_file = Path(folder or "") / "tokenizer.json"
    if folder is None or not tok_file.is_file():
        raise ValueError(f"Expected token ids like '1,2,3' (no tokenizer.json for text), got {text!r}")
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # optional dependency
        raise ValueError("Expected the 'tokenizers' package for text prompts, got none installed") from exc
    return Tokenizer.from_file(str(tok_file)).encode(text).ids


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m serving")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="greedy generation, optionally with tree speculation")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="Hugging Face folder: config.json + *.safetensors")
    src.add_argument("--random-model", choices=sorted(PRESETS), help="seeded random model preset")
    g.add_argument("--prompt", action="append", default=[], help="token ids '1,2,3' or text; repeat for a batch")
    g.add_argument("--random-prompt", type=int, action="append", default=[], help="a seeded random prompt of this many tokens")
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.add_argument("--speculate", default=None, help="tree:WxD[:layers=K] or ngram:WxD[:n=N]")
    g.add_argument("--backend", choices=["kernel", "reference"], default=None, help="default: kernel on CUDA, reference on CPU")
    g.add_argument("--device", default=None)
    g.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="model dtype (default bf16 on CUDA, fp32 on CPU)")
    g.add_argument("--pool-slots", type=int, default=None, help="KV pool slots (default: what the prompts need)")
    g.add_argument("--prefill-chunk", type=int, default=8192)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    g.add_argument("--no-defrag", action="store_true", help="measure KV fragmentation but never compact (serving.defrag)")
    return parser


def generate(args: argparse.Namespace) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    backend_name = args.backend or ("kernel" if device.type == "cuda" else "reference")
    model = random_model(args.random_model, device, dtype, args.seed) if args.random_model else DeepseekV3Model.from_folder(args.model, device, dtype)
    prompts = [parse_prompt(p, args.model) for p in args.prompt]
    gen = torch.Generator().manual_seed(args.seed)
    prompts += [torch.randint(0, model.cfg.vocab_size, (n,), generator=gen).tolist() for n in args.random_prompt]
    if not prompts:
        raise ValueError("Expected at least one --prompt or --random-prompt, got none")
    pool_dtype = torch.bfloat16 if backend_name == "kernel" and dtype == torch.float32 else dtype
    slots = args.pool_slots or sum(len(p) + args.max_new_tokens + 64 for p in prompts) + 4096
    pool = model.new_pool(slots, pool_dtype)
    backend = make_backend(backend_name, pool, model.cfg.num_attention_heads, model.cfg.kv_lora_rank, model.sm_scale)
    engine = Engine(model, pool, backend, parse_speculate(args.speculate), prefill_chunk=args.prefill_chunk, profile=True)
    from serving.defrag.cli import attach_defrag  # phase defrag: compaction between steps
    defrag = attach_defrag(engine, enabled=not args.no_defrag)
    requests = [engine.add_request(p, args.max_new_tokens) for p in prompts]
    longest = max(len(p) for p in prompts)
    t0 = time.perf_counter()
    if longest > args.prefill_chunk and not args.json:
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task("prefill", total=sum(len(p) for p in prompts))
            done = {"n": 0}

            def progress(end: int, total: int) -> None:
                bar.update(task, completed=done["n"] + end)
                if end == total:
                    done["n"] += total

            engine.run(requests, progress)
    else:
        engine.run(requests)
    s = engine.stats
    return {
        "backend": backend_name,
        "device": str(device),
        "requests": [{"prompt_tokens": len(r.prompt), "output": r.output, "error": r.error} for r in requests],
        "prefill_tokens_per_s": s.prefill_tokens / s.prefill_s if s.prefill_s else 0.0,
        "decode_tokens_per_s": s.tokens_per_s,
        "steps": s.steps,
        "accepted_drafts_per_step": s.accepted_per_step,
        "attention_share": s.attention_share,
        "wall_s": time.perf_counter() - t0,
        "leaked_slots": pool.leaked_slots(),
        "defrag": defrag.summary(),
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = generate(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
        return 0
    for i, r in enumerate(result["requests"]):
        status = f"error: {r['error']}" if r["error"] else " ".join(map(str, r["output"]))
        print(f"[{i}] ({r['prompt_tokens']} prompt tokens) {status}")
    print(
        f"backend {result['backend']} on {result['device']}: decode {result['decode_tokens_per_s']:.1f} tokens/s over "
        f"{result['steps']} steps, {result['accepted_drafts_per_step']:.2f} accepted drafts per step, "
        f"attention {100 * result['attention_share']:.0f}% of a step, prefill {result['prefill_tokens_per_s']:.0f} tokens/s"
    )
    from serving.defrag.cli import defrag_line
    print(defrag_line(result["defrag"]))
    return 0
