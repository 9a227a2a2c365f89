"""``python -m serving generate``: greedy or sampled generation from a model folder or a seeded random model;
``python -m serving profile``: where a replayed decode step's time goes, against its streaming limit.

Example::

    python -m serving generate --random-model tiny --prompt 1,2,3 --max-new-tokens 16 --speculate tree:4x4
    python -m serving generate --random-model tiny --prompt 1,2,3 --temperature 0.7 --top-p 0.95 --speculate tree:2x2
    python -m serving generate --random-model gpu-h16 --random-prompt 131072 --max-new-tokens 64 --backend kernel
    python -m serving profile --random-model dsv3-tp8 --random-prompt 65536 --out prof.json

``generate`` prints the tokens, decode tokens/s, accepted drafts per step and attention's share
of a step. Generation stops at the model's end-of-sequence ids (``generation_config.json`` or
``config.json``, as transformers' ``generate``) unless ``--ignore-eos``. Sampling (``--temperature``,
``--top-p``, ``--top-k``, ``--min-p``, ``--sampling-seed``; defaults from ``generation_config.json``,
``serving.stack.sampling_flags``) keeps speculation lossless: the tokens follow the distribution
plain sampling gives (``serving.speculation.rejection``). A prompt plus ``--max-new-tokens`` past
the model's positions (``max_position_embeddings``) is refused unless ``--context-length`` allows it.
``profile`` decodes ``--batch-size`` requests of a ``--random-prompt``-token context (random
latent rows, or ``--prefill``), times engine steps and the captured graph, traces a few steps
with torch.profiler and prints the step against its streaming limit and the kernels by class
(``serving.stack.profile``), a Markdown table last; ``--out`` writes the same as JSON.
Under ``torchrun --nproc-per-node N`` the model runs tensor-parallel over N ranks
(``serving.engine.tp_launch``); rank 0 prints.

Exit codes: 0 when every request finished (profile: when the profile ran); 2 for a usage or
input error (bad flag value, config, checkpoint, prompt, output path, or more memory than the
device has), reported before anything is allocated; 1 when a request failed while running
(e.g. the KV pool ran out). Each error is one ``error: ...`` line on stderr. Under ``torchrun``
the flags and ``--device`` are checked on every rank before it joins the process group, so a
usage error is the same line and exit code 2 on each rank (torchrun's own exit code is 1 when
any rank fails).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from serving.configs.model import ModelConfig, eos_token_ids
from serving.defrag.cli import defrag_line
from serving.device.select import DTYPES, default_dtype, resolve_device
from serving.engine.tp_launch import generated_tokens, run_on_ranks
from serving.graphs import DEFAULT_BATCH_SIZES
from serving.model.loading import check_memory, load_model, model_config
from serving.model.presets import PRESETS
from serving.parallel.group import TensorParallel, launched_by_torchrun
from serving.sampling.params import SamplingParams
from serving.speculation.drafters import check_drafter, parse_speculate
from serving.speculation.tree import MAX_DRAFT_TOKENS, MAX_VERIFY_TOKENS
from serving.stack import profile as step_profile
from serving.stack import sampling_flags
from serving.stack.build import build_engine
from serving.stack.config import ServingConfig
from serving.stack.prompts import check_prompts, load_tokenizer, parse_prompt

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m serving")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="greedy or sampled generation, optionally with tree speculation")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="Hugging Face folder: config.json + *.safetensors")
    src.add_argument("--random-model", choices=sorted(PRESETS), help="seeded random model preset")
    g.add_argument("--prompt", action="append", default=[], help="token ids '1,2,3' or text; repeat for a batch")
    g.add_argument("--random-prompt", type=int, action="append", default=[], help="a seeded random prompt of this many tokens")
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.add_argument("--speculate", default=None, help="tree:WxD[:layers=K], ngram:WxD[:n=N] or mtp:WxD (the model's MTP module)")
    g.add_argument("--backend", choices=["kernel", "reference"], default=None, help="default: kernel on CUDA, reference on CPU")
    g.add_argument("--device", default=None)
    g.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="model dtype (default bf16 on CUDA, fp32 on CPU)")
    g.add_argument("--pool-slots", type=int, default=None, help="KV pool slots (default: what the prompts need)")
    g.add_argument("--prefill-chunk", type=int, default=32768, help="prompt tokens per prefill forward")
    g.add_argument("--seed", type=int, default=0, help="seed of the random model and the random prompts")
    sampling_flags.add_flags(g)
    g.add_argument("--context-length", type=int, default=None,
                   help="the longest prompt plus --max-new-tokens a request may have (default: the model's "
                        "max_position_embeddings; more runs past the positions the model was made for)")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    g.add_argument("--eos-token-id", type=int, action="append", default=None,
                   help="stop a request after this token (repeat for several; default: the model folder's eos_token_id)")
    g.add_argument("--ignore-eos", action="store_true", help="generate --max-new-tokens tokens, past any end-of-sequence token")
    g.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="replay decode / verify steps from CUDA graphs captured before the first request "
                        "(default: on with the kernel backend on CUDA)")
    g.add_argument("--graph-batch-sizes", default=None, help="comma-separated batch sizes to capture (default 1,2,4,...,256)")
    g.add_argument("--no-defrag", action="store_true", help="measure KV fragmentation but never compact (serving.defrag)")
    p = sub.add_parser("profile", help="where a replayed decode step's time goes, against its streaming limit")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="Hugging Face folder: config.json + *.safetensors")
    src.add_argument("--random-model", choices=sorted(PRESETS), help="seeded random model preset")
    p.add_argument("--random-prompt", type=int, default=4096, help="context tokens of each request (default 4096)")
    p.add_argument("--batch-size", type=int, default=1, help="requests decoded together (default 1)")
    p.add_argument("--steps", type=int, default=20, help="engine steps timed (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="engine steps before the timed ones (default 3)")
    p.add_argument("--trace-steps", type=int, default=5, help="engine steps traced by torch.profiler (default 5)")
    p.add_argument("--prefill", action="store_true",
                   help="prefill the prompt and report its time to first token (default: random latent rows)")
    p.add_argument("--prefill-chunk", type=int, default=32768, help="prompt tokens per prefill forward")
    p.add_argument("--copy-mib", type=int, default=step_profile.COPY_BYTES >> 20,
                   help="MiB per buffer of the copy that measures the bandwidth (default 1024: past the L2)")
    p.add_argument("--backend", choices=["kernel", "reference"], default=None, help="default: kernel on CUDA, reference on CPU")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="model dtype (default bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="replay the decode steps from CUDA graphs (default: on with the kernel backend on CUDA)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the result as JSON to this file")
    return parser


def graph_batch_sizes(text: str | None, entries: int) -> tuple[int, ...]:
    """The buckets to capture: ``text`` (comma-separated), else the default ones up to the first
    that holds ``entries`` (the widest step this run can issue)."""
    if text is None:
        fits = [b for b in DEFAULT_BATCH_SIZES if b >= entries]
        return tuple(b for b in DEFAULT_BATCH_SIZES if b < entries) + tuple(fits[:1])
    parts = text.replace(",", " ").split()
    if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"Expected --graph-batch-sizes as positive integers like '1,2,4,8', got {text!r}")
    return tuple(sorted({int(p) for p in parts}))


def check_options(args: argparse.Namespace) -> None:
    """ValueError naming the first flag whose value the engine cannot use (before anything is loaded)."""
    if args.max_new_tokens < 1:
        raise ValueError(f"Expected --max-new-tokens >= 1, got {args.max_new_tokens}")
    if args.prefill_chunk < 1:
        raise ValueError(f"Expected --prefill-chunk >= 1 (prompt tokens per prefill forward), got {args.prefill_chunk}")
    bad = next((n for n in args.random_prompt if n < 1), None)
    if bad is not None:
        raise ValueError(f"Expected --random-prompt N with N >= 1 tokens, got {bad}")
    if args.pool_slots is not None and args.pool_slots < 2:
        raise ValueError(f"Expected --pool-slots >= 2 (slot 0 is reserved), got {args.pool_slots}")
    if not 0 <= args.seed < 2**63:
        raise ValueError(f"Expected --seed in [0, 2**63), got {args.seed}")
    if args.ignore_eos and args.eos_token_id:
        raise ValueError("Expected either --eos-token-id or --ignore-eos, got both")
    if args.context_length is not None and args.context_length < 2:
        raise ValueError(f"Expected --context-length >= 2 (a prompt token and a new one), got {args.context_length}")
    sampling_flags.check_flags(args)


def check_context(args: argparse.Namespace, cfg: ModelConfig, lens: list[int]) -> None:
    """ValueError unless every prompt plus ``--max-new-tokens`` fits the context length
    (``--context-length``, else the model's ``max_position_embeddings``)."""
    limit = args.context_length or cfg.max_position_embeddings
    longest = max(lens)
    if longest + args.max_new_tokens > limit:
        source = "--context-length" if args.context_length else "the model's max_position_embeddings"
        raise ValueError(f"Expected each prompt plus --max-new-tokens within the context length ({limit:,} tokens: {source}), "
                         f"got a {longest:,}-token prompt + {args.max_new_tokens:,}; shorten the prompt, lower "
                         "--max-new-tokens or raise --context-length to run past the model's positions")


def engine_options(args: argparse.Namespace, device: torch.device) -> tuple[torch.dtype, str, bool]:
    """(model dtype, attention backend, CUDA graphs) from ``--dtype``, ``--backend`` and
    ``--cuda-graphs`` and their defaults on ``device``; ValueError for graphs it cannot capture."""
    dtype = DTYPES[args.dtype] if args.dtype else default_dtype(device)
    backend_name = args.backend or ("kernel" if device.type == "cuda" else "reference")
    graphs = args.cuda_graphs if args.cuda_graphs is not None else (device.type == "cuda" and backend_name == "kernel")
    if graphs and (device.type != "cuda" or backend_name != "kernel"):
        raise ValueError(f"Expected --cuda-graphs with the kernel backend on a CUDA device, got backend {backend_name} on {device}")
    return dtype, backend_name, graphs


def stop_ids(args: argparse.Namespace, cfg: ModelConfig) -> tuple[int, ...]:
    """``--eos-token-id`` values, else the model folder's end-of-sequence ids (random presets: none)."""
    if args.ignore_eos:
        return ()
    if args.eos_token_id:
        bad = next((t for t in args.eos_token_id if not 0 <= t < cfg.vocab_size), None)
        if bad is not None:
            raise ValueError(f"Expected --eos-token-id in [0, {cfg.vocab_size}) (the model's vocab_size), got {bad}")
        return tuple(args.eos_token_id)
    return eos_token_ids(args.model, cfg.vocab_size) if args.model else ()


def generate(args: argparse.Namespace, tp: TensorParallel | None = None) -> dict:
    """Validate every input, check the memory estimate, then load, allocate and run.

    Raises ValueError (ValueError, ConfigError, WeightError, MemoryLimitError) before anything
    large is allocated. ``tp``: this rank's tensor-parallel group under torchrun (None: one
    process); the estimate is then of this rank's part.
    """
    device = resolve_device(args.device) if tp is None else tp.device
    check_options(args)
    dtype, backend_name, graphs = engine_options(args, device)
    cfg = model_config(args.model, args.random_model)
    eos = stop_ids(args, cfg)
    tokenizer = load_tokenizer(args.model)
    prompts = [parse_prompt(p, tokenizer) for p in args.prompt]
    check_prompts(prompts, cfg.vocab_size)
    lens = [len(p) for p in prompts] + list(args.random_prompt)
    if not lens:
        raise ValueError("Expected at least one --prompt or --random-prompt, got none")
    drafter = parse_speculate(args.speculate)
    check_drafter(drafter, cfg)  # a drafter the model cannot serve: refused before loading it
    sampling = sampling_flags.base_params(args, args.model)
    pool_dtype = torch.bfloat16 if backend_name == "kernel" and dtype == torch.float32 else dtype
    slots = args.pool_slots if args.pool_slots is not None else sum(n + args.max_new_tokens + 64 for n in lens) + 4096
    need = sum(lens) + len(lens) + 1
    if slots < need:
        raise ValueError(f"Expected --pool-slots >= {need} (the prompts' {sum(lens)} tokens, a slot per request for its next "
                         f"token and the reserved slot 0), got {slots}")
    check_memory(  # under TP: this rank's part
        cfg, device, dtype, tp, pool_dtype=pool_dtype, pool_slots=slots, prompt_lens=lens, max_new_tokens=args.max_new_tokens,
        prefill_chunk=args.prefill_chunk, draft_tokens=MAX_DRAFT_TOKENS if drafter else 0, random_weights=bool(args.random_model),
    )
    check_context(args, cfg, lens)  # after the estimate: an absurd size is named by what it would allocate
    sizes = graph_batch_sizes(args.graph_batch_sizes, len(lens) * getattr(drafter, "width", 1))
    context = max(lens) + args.max_new_tokens + 2 * MAX_VERIFY_TOKENS
    config = ServingConfig(
        backend=backend_name, speculate=args.speculate, pool_slots=slots, pool_dtype=pool_dtype, max_requests=len(lens),
        max_context=min(context, slots), prefill_chunk=args.prefill_chunk, eos_token_ids=tuple(eos), profile=not graphs,
        cuda_graphs=graphs, graph_batch_sizes=sizes, defrag="measure" if args.no_defrag else "on", sampling=sampling.samples,
    )  # every flag checked: nothing below is refused for a usage error before the model exists
    model = load_model(cfg, device, dtype, folder=args.model, preset=args.random_model, seed=args.seed, tp=tp)
    gen = torch.Generator().manual_seed(args.seed)
    prompts += [torch.randint(0, model.cfg.vocab_size, (n,), generator=gen).tolist() for n in args.random_prompt]
    stack = build_engine(config, model)
    engine, pool, defrag = stack.engine, stack.pool, stack.defrag
    report = stack.capture_report
    warmup_s, graph_bytes = (report.seconds, report.total_bytes) if report is not None else (0.0, 0)
    per_request, seed = sampling_flags.request_params(sampling, len(prompts), args.sampling_seed, tp)
    requests = [engine.add_request(p, args.max_new_tokens, params) for p, params in zip(prompts, per_request)]
    longest = max(len(p) for p in prompts)
    t0 = time.perf_counter()
    if longest > args.prefill_chunk and not args.json and (tp is None or tp.rank == 0):
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
        "eos_token_ids": list(eos),
        "sampling": {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                     "min_p": sampling.min_p, "seed": seed},
        "requests": [{"prompt_tokens": len(r.prompt), "output": r.output, "error": r.error,
                      "finish_reason": "error" if r.error else "eos" if r.output and r.output[-1] in eos else "length",
                      **({"text": tokenizer.decode(r.output)} if tokenizer is not None else {})}
                     for r in requests],
        "tokens_per_step": s.emitted / s.request_steps if s.request_steps else 0.0,
        "prefill_tokens_per_s": s.prefill_tokens / s.prefill_s if s.prefill_s else 0.0,
        "decode_tokens_per_s": s.tokens_per_s,
        "steps": s.steps,
        "accepted_drafts_per_step": s.accepted_per_step,
        "attention_share": s.attention_share if engine.profile else None,
        "cuda_graphs": graphs,
        "warmup_s": warmup_s,
        "graph_memory_mib": graph_bytes / 2**20,
        "graph_replays": engine.runner.graphs.replays if engine.runner.graphs else 0,
        "wall_s": time.perf_counter() - t0,
        "leaked_slots": pool.leaked_slots(),
        "defrag": defrag.summary(),
    }


# (flag, its attribute, the smallest value it takes, what it sets): checked in this order.
PROFILE_COUNTS = (
    ("--random-prompt", "random_prompt", 1, "context tokens of each request"),
    ("--batch-size", "batch_size", 1, "requests decoded together"),
    ("--steps", "steps", 1, "engine steps timed"),
    ("--warmup", "warmup", 0, "engine steps before the timed ones"),
    ("--trace-steps", "trace_steps", 1, "engine steps traced"),
    ("--prefill-chunk", "prefill_chunk", 1, "prompt tokens per prefill forward"),
    ("--copy-mib", "copy_mib", 1, "MiB per buffer of the bandwidth copy"),
)


def check_out_path(path: str | None, flag: str = "--out") -> None:
    """ValueError when ``path`` cannot be written as a file (a folder, a missing or read-only folder)."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"Expected {flag} FILE, got the folder {path!r}; name a file in it")
    folder = target.parent
    if not folder.is_dir():
        raise ValueError(f"Expected {flag} FILE in an existing folder, got {path!r} (no folder {str(folder)!r}); create it first")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ValueError(f"Expected {flag} FILE this user may write, got {path!r} (not writable); pick another path")


def check_profile_options(args: argparse.Namespace) -> None:
    """ValueError naming the first ``profile`` flag whose value cannot be used (before anything is loaded)."""
    for flag, name, low, what in PROFILE_COUNTS:
        value = getattr(args, name)
        if value < low:
            raise ValueError(f"Expected {flag} >= {low} ({what}), got {value}")
    if not 0 <= args.seed < 2**63:
        raise ValueError(f"Expected --seed in [0, 2**63), got {args.seed}")
    check_out_path(args.out)


def profile(args: argparse.Namespace, tp: TensorParallel | None = None) -> dict:
    """``python -m serving profile``: check every flag and the memory estimate, measure the copy
    bandwidth, then load the model, build the engine and profile its decode steps
    (``serving.stack.profile.profile_decode``). Returns the profiled row, with the run's settings.

    Raises ValueError (ValueError, ConfigError, WeightError, MemoryLimitError) before anything
    large is allocated. ``tp``: this rank's tensor-parallel group under torchrun.
    """
    device = resolve_device(args.device) if tp is None else tp.device
    check_profile_options(args)
    dtype, backend_name, graphs = engine_options(args, device)
    cfg = model_config(args.model, args.random_model)
    context, batch = args.random_prompt, args.batch_size
    growth = args.warmup + args.steps + args.trace_steps  # each step appends one row per request
    if context + growth + 1 > cfg.max_position_embeddings:
        raise ValueError(f"Expected --random-prompt plus the profiled steps ({context} + {growth}) below the model's "
                         f"max_position_embeddings ({cfg.max_position_embeddings}), got {context + growth + 1}; "
                         "lower --random-prompt or --steps")
    pool_dtype = torch.bfloat16 if backend_name == "kernel" and dtype == torch.float32 else dtype
    slots = batch * (context + growth + 2) + 64
    check_memory(
        cfg, device, dtype, tp, pool_dtype=pool_dtype, pool_slots=slots, prompt_lens=[context] * batch,
        max_new_tokens=growth + 1, prefill_chunk=args.prefill_chunk, random_weights=bool(args.random_model),
    )
    config = ServingConfig(
        backend=backend_name, pool_slots=slots, pool_dtype=pool_dtype, max_requests=batch, max_context=context + growth + 2,
        prefill_chunk=args.prefill_chunk, cuda_graphs=graphs, graph_batch_sizes=(batch,),
    )  # every flag checked: nothing below is refused for a usage error before the model exists
    copy_bw = step_profile.copy_bandwidth(device, args.copy_mib << 20)  # before the model: its two buffers need the room
    model = load_model(cfg, device, dtype, folder=args.model, preset=args.random_model, seed=args.seed, tp=tp)
    stack = build_engine(config, model)
    engine = stack.engine
    if not args.prefill:
        step_profile.randomize_pool(engine, args.seed)
    requests, ttft = step_profile.start_requests(engine, batch, context, torch.Generator().manual_seed(args.seed), args.prefill)
    row = step_profile.profile_decode(engine, requests, copy_bw, warmup=args.warmup, steps=args.steps, trace=args.trace_steps)
    report = stack.capture_report
    row.update({
        "model": args.random_model or args.model,
        "prompt_tokens": context,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "dtype": str(dtype).removeprefix("torch."),
        "backend": backend_name,
        "prefilled": args.prefill,
        "ttft_s": ttft,
        "capture_s": report.seconds if report is not None else 0.0,
        "outputs": [r.output for r in requests],
    })
    step_profile.release(engine, requests)
    return row


def profiled_tokens(result: dict) -> list[int]:
    """What the ranks of a tensor-parallel profile must agree on: every request's tokens."""
    return [t for output in result["outputs"] for t in output + [-1]]


def print_profile(args: argparse.Namespace, result: dict) -> int:
    """Write ``--out`` and print the profile, its Markdown table last."""
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    where = result["device"] + (f" ({result['gpu']})" if result["gpu"] else "")
    graphs = "CUDA graphs" if result["cuda_graphs"] else "eager steps"
    print(f"{result['model']} on {where}, {result['dtype']}, backend {result['backend']}, {graphs}: B={result['batch']} at "
          f"{result['prompt_tokens']} tokens of context: {result['tokens_per_s']:.1f} tokens/s, step {result['step_ms']:.2f} ms, "
          f"streaming limit {result['limit_ms']:.2f} ms ({result['frac_streaming_limit']:.2f} of it) at "
          f"{result['copy_GBps']:.0f} GB/s copy bandwidth")
    if result["ttft_s"] is not None:
        print(f"time to first token: {result['ttft_s']:.2f} s (prefill of {result['prompt_tokens']} tokens)")
    print()
    print(step_profile.top_kernels_markdown(result))
    print(step_profile.markdown(result), end="")
    return 0


def _error(message: object) -> None:
    print("error: " + " ".join(str(message).split("\n")), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run ``generate`` or ``profile``; returns the exit code (see the module docstring)."""
    args = build_parser().parse_args(argv)
    run, tokens, show, check = COMMANDS[args.command]
    try:
        result = run_on_ranks(args, run, tokens, check) if launched_by_torchrun() else run(args)
    except ValueError as exc:
        _error(exc)
        return EXIT_USAGE
    except OSError as exc:  # a file error none of the loaders wrapped: name the file
        _error(f"{exc.filename or 'I/O'}: {exc.strerror or exc}")
        return EXIT_USAGE
    except (torch.OutOfMemoryError, MemoryError) as exc:
        _error(f"out of memory while running (the estimate missed it): {str(exc).splitlines()[0] if str(exc) else 'MemoryError'}")
        return EXIT_FAILED
    except RuntimeError as exc:
        if "can't allocate memory" not in str(exc):  # torch's CPU allocator failing; anything else is a bug: show it
            raise
        _error(f"out of memory while running (the estimate missed it): {str(exc).splitlines()[-1]}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED
    if result is None:  # a tensor-parallel rank other than 0: rank 0 prints
        return 0
    return show(args, result)


def print_generate(args: argparse.Namespace, result: dict) -> int:
    """Print a ``generate`` result; the exit code (1 when a request failed)."""
    if args.json:
        print(json.dumps(result))
    else:
        for i, r in enumerate(result["requests"]):
            status = f"error: {r['error']}" if r["error"] else r["text"] if "text" in r else " ".join(map(str, r["output"]))
            print(f"[{i}] ({r['prompt_tokens']} prompt tokens) {status}")
        share = "" if result["attention_share"] is None else f"attention {100 * result['attention_share']:.0f}% of a step, "
        graphs = (f", CUDA graphs captured in {result['warmup_s']:.1f} s ({result['graph_memory_mib']:.0f} MiB)"
                  if result["cuda_graphs"] else ", no CUDA graphs")
        how = SamplingParams(**result["sampling"]).describe()
        print(
            f"{how}, backend {result['backend']} on {result['device']}: decode {result['decode_tokens_per_s']:.1f} tokens/s over "
            f"{result['steps']} steps, {result['accepted_drafts_per_step']:.2f} accepted drafts per step "
            f"({result['tokens_per_step']:.2f} tokens per request step), "
            f"{share}prefill {result['prefill_tokens_per_s']:.0f} tokens/s{graphs}"
        )
        print(defrag_line(result["defrag"]))
    failed = [(i, r["error"]) for i, r in enumerate(result["requests"]) if r["error"]]
    for i, message in failed:
        _error(f"request [{i}] failed: {message}")
    return EXIT_FAILED if failed else 0


# command -> (what runs it, on each rank under torchrun; what the ranks must agree on; what prints it; what
# each rank checks before it joins the process group)
COMMANDS = {"generate": (generate, generated_tokens, print_generate, check_options),
            "profile": (profile, profiled_tokens, print_profile, check_profile_options)}
