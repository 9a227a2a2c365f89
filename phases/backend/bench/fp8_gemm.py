"""Weight-streaming block-FP8 GEMM on the H200: fraction of copy bandwidth on the FP8 bytes.

For each projection of a ``dsv3-tp8`` layer (one TP=8 rank of DeepSeek-V3) and each decode or
verify row count, a CUDA graph runs the GEMM over ``layers`` distinct weights (together well
past the 50 MB L2, as a decode step walks its layers), and the replay's median time gives the
bytes/s on the weights. Every tiling tried (BLOCK_N, warps, the split-K grid) is first checked
against a float64 product on the same random inputs; the dense bf16 ``F.linear`` of the same
dequantized weights is timed beside it, so the table shows what FP8 buys per projection.

Usage (GPU): ``python -m phases.backend.bench.fp8_gemm [--out FILE.json]``; the table prints last.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys

import torch
import torch.nn.functional as F

from phases.common.roofline import measure_ceilings
from serving.quant import fp8_gemm
from serving.quant.fp8 import quantize

# (name, N, K) of one dsv3-tp8 layer's dense projections (DeepSeek-V3 sharded over 8 ranks)
SHAPES = [("q_a", 1536, 7168), ("q_b", 3072, 1536), ("kv_a", 576, 7168), ("o", 7168, 2048),
          ("gate_up", 4608, 7168), ("down", 7168, 2304)]
ROWS = (1, 8, 64)
TILINGS = [dict(block_n=b, num_warps=w, programs=p) for b, w, p in itertools.product((32, 64, 128), (4, 8), (264, 528))]
FLUSH_TARGET = 400 << 20  # weights per graph: far past the L2


def _median_replay_us(fn, reps: int = 30) -> float:
    for _ in range(3):
        fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        start[i].record()
        graph.replay()
        end[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end)) * 1e3


def _check(x: torch.Tensor, w, tiling: dict) -> float:
    """Error of the kernel against float64, over the error of bf16 F.linear against float64."""
    truth = x.double() @ w.dequantize(torch.float64).T
    got = fp8_gemm.w8_linear(x, w, out=torch.full((x.shape[0], w.q.shape[0]), float("nan"), dtype=x.dtype, device=x.device), **tiling)
    if torch.isnan(got).any():
        return float("inf")
    ref = (F.linear(x, w.dequantize(x.dtype)).double() - truth).abs().max().item()
    return (got.double() - truth).abs().max().item() / max(ref, 1e-30)


def bench(device: torch.device) -> dict:
    ceilings = measure_ceilings(device)
    bw = ceilings.copy_bw_bytes_per_s
    rows_out = []
    for (name, n, k), m in itertools.product(SHAPES, ROWS):
        fp8_bytes = n * k + 4 * ((n + 127) // 128) * ((k + 127) // 128)
        layers = max(4, FLUSH_TARGET // fp8_bytes)
        gen = torch.Generator(device=device).manual_seed(n * 31 + k + m)
        weights = [quantize(torch.randn(n, k, device=device, generator=gen) * 0.05) for _ in range(layers)]
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen)
        out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
        best = None
        for tiling in TILINGS:
            err = _check(x, weights[0], tiling)
            if not err <= 2.0:
                print(f"{name} M={m} {tiling}: error {err:.2f}x bf16's, skipped", flush=True)
                continue
            us = _median_replay_us(lambda: [fp8_gemm.w8_linear(x, w, out=out, **tiling) for w in weights]) / layers
            frac = fp8_bytes / (us * 1e-6) / bw
            if best is None or us < best["us"]:
                best = dict(tiling=tiling, us=us, frac_copy=frac, err_vs_bf16=err)
        default_us = _median_replay_us(lambda: [fp8_gemm.w8_linear(x, w, out=out) for w in weights]) / layers
        dense = [w.dequantize(torch.bfloat16) for w in weights[: max(4, layers // 2)]]
        dense_us = _median_replay_us(lambda: [F.linear(x, d, out=out) for d in dense]) / len(dense)
        row = dict(name=name, n=n, k=k, m=m, fp8_bytes=fp8_bytes, best=best, default_us=default_us,
                   default_frac_copy=fp8_bytes / (default_us * 1e-6) / bw, bf16_us=dense_us,
                   bf16_frac_copy=2 * n * k / (dense_us * 1e-6) / bw)
        rows_out.append(row)
        print(json.dumps(row), flush=True)
        del weights, dense
        torch.cuda.empty_cache()
    return dict(copy_bw_bytes_per_s=bw, bf16_flops_per_s=ceilings.bf16_flops_per_s, rows=rows_out)


def table(result: dict) -> str:
    lines = [f"copy bandwidth {result['copy_bw_bytes_per_s'] / 1e12:.2f} TB/s (read + written)", "",
             "| proj | N x K | M | FP8 default µs (frac) | FP8 best µs (frac) | best tiling | bf16 µs (frac) | FP8 / bf16 time |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        b = r["best"] or {}
        t = b.get("tiling", {})
        lines.append(f"| {r['name']} | {r['n']}x{r['k']} | {r['m']} | {r['default_us']:.1f} ({r['default_frac_copy']:.2f}) | "
                     f"{b.get('us', float('nan')):.1f} ({b.get('frac_copy', float('nan')):.2f}) | "
                     f"n{t.get('block_n')} w{t.get('num_warps')} p{t.get('programs')} | {r['bf16_us']:.1f} ({r['bf16_frac_copy']:.2f}) | "
                     f"{b.get('us', float('nan')) / r['bf16_us']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the measurements as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_gemm_bench: needs a CUDA GPU", file=sys.stderr)
        return 3
    result = bench(torch.device("cuda"))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
