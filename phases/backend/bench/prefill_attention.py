"""Chunked-prefill attention on the GPU: every ``serving.attention.prefill`` method per chunk.

One chunk of 8192 queries at prefixes 0, 57k and 180k (multiples of 8192, where the engine's
chunks start) with ``dsv3-tp8``'s heads (16, qk 192, v 128) in bf16, random inputs (never zeros)
in the engine's layouts. Per method: its probe (a method failing it is skipped, the reason
kept); a check against float64 on ``CHECK_ROWS`` query rows, its output filled with NaN first
(error over the masked path's on the same rows: exact when within ``PROBE_TOLERANCE``); the
first call's time apart (cuDNN builds a plan per shape, FlexAttention compiles); the median of
``REPS`` calls by CUDA events; TFLOP/s over the chunk's causal FLOPs
2 H (qk + v) (n prefix + n (n + 1) / 2) and their fraction of the bf16 matmul rate measured in
the same run. FlexAttention (compiled, a lower-right block mask) is timed as a candidate the
engine does not run. The table names the fastest exact method per prefix.

``--ttft N``: the first token of an N-token random prompt on a random ``dsv3-tp8`` model end to
end (``Engine.stats.prefill_s``, kernel backend), twice per (chunk, method): the first run
includes the probe and cuDNN's plans for the new shapes. ``--no-kernels`` skips the per-chunk
part. The same end-to-end number from the command line: ``python -m serving generate
--random-model dsv3-tp8 --random-prompt N --max-new-tokens 1 --json`` (prompt tokens over
``prefill_tokens_per_s``).

Usage (GPU): ``python -m phases.backend.bench.prefill_attention [--out FILE.json] [--ttft 65536]``;
the table prints last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

from phases.common.roofline import measure_ceilings
from serving.attention import prefill as pa

HEADS, QK, DV, NOPE = 16, 192, 128, 128  # one dsv3-tp8 rank: 128 heads over 8, qk = nope 128 + rope 64
CHUNK = 8192
PREFIXES = (0, 7 * 8192, 22 * 8192)  # 0, 57k, 180k
METHODS = ("masked", "cudnn", "flash", "efficient", "flex")
CHECK_ROWS = 64
REPS = 10

_flex_compiled = None


def chunk_flops(n: int, prefix: int, heads: int = HEADS, qk: int = QK, dv: int = DV) -> int:
    """Q.K^T and P.V over the visible keys of an n-query chunk after ``prefix`` cached tokens."""
    return 2 * heads * (qk + dv) * (n * prefix + n * (n + 1) // 2)


def _flex(q, k, v, prefix: int, scale: float):
    """FlexAttention over the lower-right causal block mask: returns a call writing into out."""
    global _flex_compiled
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _flex_compiled is None:
        _flex_compiled = torch.compile(flex_attention, dynamic=False)
    n, length = q.shape[1], k.shape[1]
    mask = create_block_mask(lambda b, h, qi, kj: kj <= qi + prefix, None, None, n, length, device=q.device)
    return lambda out: out.copy_(_flex_compiled(q[None], k[None], v[None], block_mask=mask, scale=scale)[0])


def _rows_reference(q, k, v, prefix: int, scale: float, rows: torch.Tensor) -> torch.Tensor:
    """float64 attention of the query ``rows`` only: [H, len(rows), dv]."""
    qs = q[:, rows].double()
    scores = (qs @ k.double().transpose(-1, -2)) * scale  # [H, r, L]
    visible = torch.arange(k.shape[1], device=q.device)[None, :] <= (prefix + rows)[:, None]
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v.double()


def _median_ms(fn, reps: int) -> float:
    fn()  # warm: the first call was the check's
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end))


def _why(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def bench_prefix(device: torch.device, prefix: int, methods, bf16_rate: float, reps: int = REPS) -> dict:
    gen = torch.Generator(device=device).manual_seed(prefix + 29)
    q, k, v = pa.engine_layout(CHUNK, prefix, HEADS, QK, DV, torch.bfloat16, device, gen, nope=NOPE)
    scale = 1.0 / math.sqrt(QK)
    rows = torch.linspace(0, CHUNK - 1, CHECK_ROWS, device=device).round().long()
    truth = _rows_reference(q, k, v, prefix, scale, rows)
    flops = chunk_flops(CHUNK, prefix)
    out = torch.empty(HEADS, CHUNK, DV, dtype=torch.bfloat16, device=device)
    results, base_err = {}, None
    for method in ["masked"] + [m for m in methods if m != "masked"]:  # the masked path's error is every check's scale
        row = dict(method=method)
        try:
            if method in pa.CUDA_ORDER:
                ok, why = pa.probe(method, device, torch.bfloat16, QK, DV)
                if not ok:
                    raise RuntimeError(f"probe: {why}")
            call = _flex(q, k, v, prefix, scale) if method == "flex" else \
                (lambda o, m=method: pa.causal_prefill(q, k, v, prefix, scale, m, out=o))
            out.fill_(float("nan"))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call(out)
            torch.cuda.synchronize()
            row["first_ms"] = (time.perf_counter() - t0) * 1e3
            got = out[:, rows].double()
            err = (got - truth).abs().max().item() if not torch.isnan(out).any() else float("nan")
            if method == "masked":
                base_err = err
            row["max_err"] = err
            row["err_vs_masked"] = err / base_err if base_err else float("nan")
            row["exact"] = bool(err <= pa.PROBE_TOLERANCE * base_err) if base_err else False
            row["ms"] = _median_ms(lambda: call(out), reps)
            row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
            row["frac_bf16_mm"] = flops / (row["ms"] * 1e-3) / bf16_rate
        except torch.OutOfMemoryError as exc:
            row["skipped"] = _why(exc)
            torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001 - a method that cannot run here is reported, not fatal
            row["skipped"] = _why(exc)
        print(json.dumps(dict(prefix=prefix, **row)), flush=True)
        results[method] = row
    exact = [r for r in results.values() if r.get("exact") and "ms" in r]
    winner = min(exact, key=lambda r: r["ms"])["method"] if exact else None
    del q, k, v, truth
    torch.cuda.empty_cache()
    return dict(prefix=prefix, n=CHUNK, flops=flops, methods=results, winner=winner)


def ttft(device: torch.device, tokens: int, chunks, methods) -> list[dict]:
    """First-token seconds of one ``tokens``-long prompt on a random dsv3-tp8 model, twice per
    (chunk, method); method None: the engine's own choice."""
    from serving.model.presets import random_model
    from serving.stack import ServingConfig, build_engine

    model = random_model("dsv3-tp8", device, torch.bfloat16)
    pool = model.new_pool(tokens + 64, torch.bfloat16)
    prompt = torch.randint(0, model.cfg.vocab_size, (tokens,), generator=torch.Generator().manual_seed(tokens)).tolist()
    out = []
    for chunk in chunks:
        for method in methods:
            runs = []
            for _ in range(2):
                eng = build_engine(ServingConfig(backend="kernel", pool_slots=pool.num_slots, prefill_chunk=chunk), model, pool).engine
                eng.runner.backend.prefill_method = method
                req = eng.generate([prompt], 1)[0]
                runs.append(dict(prefill_s=eng.stats.prefill_s, token=req.output[:1], error=req.error))
            ran = method or pa.select_method(device, torch.bfloat16, model.cfg.qk_head_dim, model.cfg.v_head_dim)
            row = dict(tokens=tokens, chunk=chunk, method=ran, requested=method or "auto", first_s=runs[0]["prefill_s"],
                       second_s=runs[1]["prefill_s"], first_token=runs[1]["token"], error=runs[0]["error"] or runs[1]["error"])
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def bench(device: torch.device, methods=METHODS, prefixes=PREFIXES, reps: int = REPS, ttft_tokens: int = 0,
          ttft_chunks=(8192, 32768), ttft_methods=(None, "masked"), kernels: bool = True) -> dict:
    ceilings = measure_ceilings(device)
    result = dict(device=torch.cuda.get_device_name(device), torch=torch.__version__,
                  cudnn=torch.backends.cudnn.version(), bf16_flops_per_s=ceilings.bf16_flops_per_s,
                  avoid_recompile=os.environ.get("TORCH_CUDNN_SDPA_AVOID_RECOMPILE"),
                  engine_choice=pa.select_method(device, torch.bfloat16, QK, DV),
                  engine_skipped=pa.skipped_methods(device, torch.bfloat16, QK, DV), chunks=[], ttft=[])
    print(json.dumps({k: v for k, v in result.items() if k not in ("chunks", "ttft")}), flush=True)
    if kernels:
        result["chunks"] = [bench_prefix(device, p, methods, ceilings.bf16_flops_per_s, reps) for p in prefixes]
    if ttft_tokens:
        result["ttft"] = ttft(device, ttft_tokens, ttft_chunks, ttft_methods)
    return result


def _f(x, spec: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table(result: dict) -> str:
    lines = [f"{result['device']}, torch {result['torch']}, cuDNN {result['cudnn']}; bf16 matmul "
             f"{result['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s; engine's choice: {result['engine_choice']}"
             + (f" (skipped: {result['engine_skipped']})" if result["engine_skipped"] else "")
             + (f"; TORCH_CUDNN_SDPA_AVOID_RECOMPILE={result['avoid_recompile']}" if result["avoid_recompile"] else "")]
    if result["chunks"]:
        lines += ["", f"Per {CHUNK}-query chunk ({HEADS} heads, qk {QK}, v {DV}, bf16); err: max error on {CHECK_ROWS} rows "
                  "against float64, over the masked path's", "",
                  "| prefix | method | ms (median) | first call ms | TFLOP/s | frac bf16 mm | err / masked | exact | vs masked |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in result["chunks"]:
            base = c["methods"].get("masked", {}).get("ms")
            for name, r in c["methods"].items():
                if "skipped" in r:
                    lines.append(f"| {c['prefix']} | {name} | skipped: {r['skipped'][:120]} | | | | | | |")
                    continue
                win = " **fastest exact**" if name == c["winner"] else ""
                speed = _f(base / r["ms"], ".2f") + "x" if base else "n/a"
                lines.append(f"| {c['prefix']} | {name}{win} | {r['ms']:.2f} | {r['first_ms']:.1f} | {r['tflops']:.0f} | "
                             f"{r['frac_bf16_mm']:.2f} | {_f(r['err_vs_masked'], '.2f')} | {'yes' if r['exact'] else 'NO'} | {speed} |")
    if result["ttft"]:
        lines += ["", "End to end: first token of a random prompt on random dsv3-tp8 (kernel backend)", "",
                  "| tokens | chunk | method | first run s | second run s | first token | error |", "|---|---|---|---|---|---|---|"]
        for r in result["ttft"]:
            lines.append(f"| {r['tokens']} | {r['chunk']} | {r['method']} ({r['requested']}) | {r['first_s']:.2f} | "
                         f"{r['second_s']:.2f} | {r['first_token']} | {r['error'] or ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the measurements as JSON here")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {','.join(METHODS)}")
    parser.add_argument("--prefixes", default=",".join(map(str, PREFIXES)), help="comma-separated prefix lengths")
    parser.add_argument("--reps", type=int, default=REPS)
    parser.add_argument("--kernels", action=argparse.BooleanOptionalAction, default=True, help="time the per-chunk calls")
    parser.add_argument("--ttft", type=int, default=0, help="also time the first token of a prompt of this many tokens")
    parser.add_argument("--ttft-chunks", default="8192,32768", help="comma-separated prefill chunks for --ttft")
    parser.add_argument("--ttft-methods", default="auto,masked", help="comma-separated methods for --ttft (auto: the engine's)")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    ttft_methods = [None if m == "auto" else m for m in args.ttft_methods.split(",") if m]
    bad += [m for m in ttft_methods if m is not None and m not in pa.METHODS]
    if bad or args.reps < 1:
        print(f"prefill_attention_bench: Expected methods of {list(METHODS)} and --reps >= 1, got {bad} and {args.reps}",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("prefill_attention_bench: needs a CUDA GPU", file=sys.stderr)
        return 3
    result = bench(torch.device("cuda"), methods, [int(p) for p in args.prefixes.split(",") if p], args.reps, args.ttft,
                   [int(c) for c in args.ttft_chunks.split(",") if c], ttft_methods, args.kernels)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
