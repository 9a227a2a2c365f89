"""Tune the weight-streaming GEMM: per projection, row count and weight kind, the fastest tiling.

For each dense projection of a preset's decoder layer (the fused ``q_a_kv_a`` and ``gate_up``
as the model holds them), rows 1, 2, 4, 8, 16 and bf16 and block-FP8 weights, every candidate
``StreamConfig`` is first checked against a float64 product on random inputs (poisoned output,
error at most twice bf16 ``F.linear``'s; a tiling that fails to compile is recorded as refused),
then timed: a CUDA graph runs the GEMM over several weight copies (together well past the L2, as
a decode step walks its layers) and the replay's median gives the time per GEMM. bf16 cells
also time ``F.linear`` (cuBLAS) and keep it unless the kernel is ``TORCH_MARGIN`` faster; FP8
cells always name a tiling (dequantizing for cuBLAS reads more bytes, not fewer).

Usage (GPU): ``python -m phases.backend.bench.stream_gemm [--preset dsv3-tp8] [--quick]
[--write-table [PATH]] [--out FILE.json]``; ``--quick`` times only the tilings the device's
current table names plus a few defaults. Without a GPU, ``--from-json FILE --write-table PATH``
writes a table from a measurement file (``--out``'s format).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from serving.quant import stream_tuning
from serving.quant.fp8 import quantize
from serving.quant.stream_gemm import DEFAULT_FP8, StreamConfig, fp8_tiling_problem, stream_linear

ROWS = stream_tuning.ROW_BUCKETS
KINDS = stream_tuning.WEIGHT_KINDS
FLUSH_TARGET = 400 << 20  # weight bytes per graph: far past the L2
TORCH_MARGIN = 0.97  # a bf16 cell takes the kernel only when it beats cuBLAS by 3% (replay noise is ~1%)
MAX_ERR_VS_TORCH = 2.0
SECONDS_PER_TIMING = 0.05  # the estimate's guesses: a check, a capture and 30 replays
SECONDS_PER_COMPILE = 1.5


def projection_shapes(preset: str) -> list[tuple[str, int, int]]:
    """(name, N, K) of one decoder layer's dense projections of ``preset``, fused as the model holds them."""
    from serving.model.presets import preset_config

    cfg = preset_config(preset)
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    q_width = heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
    latent = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    if cfg.q_lora_rank:
        attn = [("self_attn.q_a_kv_a", cfg.q_lora_rank + latent, h), ("self_attn.q_b_proj", q_width, cfg.q_lora_rank)]
    else:
        attn = [("self_attn.q_proj", q_width, h), ("self_attn.kv_a_proj_with_mqa", latent, h)]
    mlp = [("mlp.gate_up", 2 * cfg.intermediate_size, h), ("mlp.down_proj", h, cfg.intermediate_size)]
    return attn + mlp[:1] + [("self_attn.o_proj", h, heads * cfg.v_head_dim)] + mlp[1:]


def fits(config: StreamConfig, kind: str, rows: int) -> bool:
    """Whether ``stream_linear`` takes ``config`` for this weight kind and row count."""
    if not config.dot and rows != 1:
        return False
    return kind != "fp8" or fp8_tiling_problem(config) is None


def candidate_grid(kind: str, rows: int, sms: int) -> list[StreamConfig]:
    """The full sweep for one cell: row sums at one row, dots at any, four grid sizes."""
    programs = [sms * f for f in (1, 2, 4, 8)]
    grid = []
    if rows == 1:
        for bn, bk, w, s, p in itertools.product((8, 16, 32, 64, 128), (128, 256, 512), (4, 8), (1, 3, 4), programs):
            grid.append(StreamConfig(bn, bk, w, s, p, False))
    for bn, bk, w, s, p in itertools.product((32, 64, 128), (128, 256), (4, 8), (3, 5), programs):
        grid.append(StreamConfig(bn, bk, w, s, p, True))
    return [c for c in grid if fits(c, kind, rows)]


def quick_grid(kind: str, rows: int, sms: int, device: torch.device) -> list[StreamConfig]:
    """The tilings the device's current table names for ``kind`` (any cell), plus a few defaults."""
    named = []
    try:
        path = stream_tuning.table_path(stream_tuning.device_name(device))
        if path.exists():
            named = [c for c in stream_tuning.load_table(path).values() if isinstance(c, StreamConfig)]
    except stream_tuning.TableError as error:
        print(f"quick: current table not used: {error}", flush=True)
    defaults = [DEFAULT_FP8, StreamConfig(32, 128, 8, 1, 8 * sms, False), StreamConfig(32, 128, 4, 3, 8 * sms, True),
                StreamConfig(64, 128, 4, 5, sms, True)]
    return [c for c in dict.fromkeys(named + defaults) if fits(c, kind, rows)]


def _median_replay_us(fn, reps: int = 30) -> float:
    from phases.backend.bench.fp8_gemm import _median_replay_us as replay

    return replay(fn, reps)


def _error_vs_torch(x: torch.Tensor, w, config: StreamConfig) -> float:
    """The kernel's largest error against float64 over bf16 F.linear's (inf: output not written whole)."""
    dense64 = w.dequantize(torch.float64) if not isinstance(w, torch.Tensor) else w.double()
    truth = x.double() @ dense64.T
    out = torch.full((x.shape[0], dense64.shape[0]), float("nan"), dtype=x.dtype, device=x.device)
    stream_linear(x, w, config, out=out)
    if torch.isnan(out).any():
        return float("inf")
    ref = F.linear(x, w if isinstance(w, torch.Tensor) else w.dequantize(x.dtype)).double()
    return (out.double() - truth).abs().max().item() / max((ref - truth).abs().max().item(), 1e-30)


def tune_cell(kind: str, name: str, n: int, k: int, rows: int, configs: list[StreamConfig], device: torch.device,
              copy_bw: float) -> dict:
    weight_bytes = n * k + 4 * -(-n // 128) * -(-k // 128) if kind == "fp8" else 2 * n * k
    copies = max(4, FLUSH_TARGET // weight_bytes)
    gen = torch.Generator(device=device).manual_seed(n * 31 + k + rows)
    draws = (torch.randn(n, k, device=device, generator=gen) / k**0.5 for _ in range(copies))
    weights = [quantize(d) if kind == "fp8" else d.to(torch.bfloat16) for d in draws]
    x = torch.randn(rows, k, device=device, dtype=torch.bfloat16, generator=gen)
    out = torch.empty(rows, n, device=device, dtype=torch.bfloat16)
    tried, refused = [], 0
    for config in configs:
        try:
            err = _error_vs_torch(x, weights[0], config)
        except Exception as error:  # noqa: BLE001  (OutOfResources and other compile failures: refused)
            refused += 1
            print(f"{kind} {n}x{k} M={rows} {config}: {type(error).__name__}: {str(error).splitlines()[0]}", flush=True)
            continue
        if not err <= MAX_ERR_VS_TORCH:
            print(f"{kind} {n}x{k} M={rows} {config}: error {err:.2f}x torch's, rejected", flush=True)
            continue
        us = _median_replay_us(lambda: [stream_linear(x, w, config, out=out) for w in weights]) / copies
        tried.append(dict(config=vars(config), us=us, err_vs_torch=err))
    tried.sort(key=lambda t: t["us"])
    torch_us = None
    if kind == "bf16":
        torch_us = _median_replay_us(lambda: [F.linear(x, w, out=out) for w in weights]) / copies
    best = tried[0] if tried else None
    if best is None:
        choice = "torch" if kind == "bf16" else None
    elif kind == "bf16" and not best["us"] < TORCH_MARGIN * torch_us:
        choice = "torch"
    else:
        choice = best["config"]
    frac = (lambda us: None if us is None else weight_bytes / (us * 1e-6) / copy_bw)
    del weights
    torch.cuda.empty_cache()
    return dict(weight=kind, n=n, k=k, rows=rows, weight_bytes=weight_bytes, copies=copies, choice=choice,
                best_us=best and best["us"], best_frac_copy=frac(best and best["us"]), torch_us=torch_us,
                torch_frac_copy=frac(torch_us), tried=tried[:5], refused=refused, names=[name])


def bench(device: torch.device, preset: str, quick: bool, kinds: list[str], rows_list: list[int]) -> dict:
    from phases.common.roofline import measure_ceilings

    sms = torch.cuda.get_device_properties(device).multi_processor_count
    copy_bw = measure_ceilings(device).copy_bw_bytes_per_s
    shapes = projection_shapes(preset)
    plan = [(kind, name, n, k, rows, quick_grid(kind, rows, sms, device) if quick else candidate_grid(kind, rows, sms))
            for kind in kinds for name, n, k in shapes for rows in rows_list]
    timings = sum(len(c) for *_, c in plan)
    compiles = len({(kind, max(16, rows) if c.dot else 1, c.block_n, c.block_k, c.num_warps, c.num_stages, c.dot)
                    for kind, _, _, _, rows, cs in plan for c in cs})  # split-K's own specializations aside
    print(f"plan: {len(plan)} cells, {timings} timings, about {compiles} compiles: roughly "
          f"{(timings * SECONDS_PER_TIMING + compiles * SECONDS_PER_COMPILE) / 60:.1f} min", flush=True)
    cells = []
    for kind, name, n, k, rows, configs in plan:
        cell = tune_cell(kind, name, n, k, rows, configs, device, copy_bw)
        print(json.dumps({f: cell[f] for f in ("weight", "n", "k", "rows", "choice", "best_us", "best_frac_copy",
                                                 "torch_us", "torch_frac_copy")}), flush=True)
        cells.append(cell)
    return dict(device=torch.cuda.get_device_name(device), capability=list(torch.cuda.get_device_capability(device)),
                preset=preset, copy_bw_bytes_per_s=copy_bw, torch=torch.__version__,
                measured=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), cells=cells)


def table_from_measurements(result: dict, source: str) -> dict:
    """The table (``stream_tuning``'s format) of a measurement: each cell's choice, its times as provenance."""
    cells = []
    for c in result["cells"]:
        if c["choice"] is None:  # an FP8 cell no tiling passed: left to the default tiling
            continue
        cells.append(dict(weight=c["weight"], n=c["n"], k=c["k"], rows=c["rows"], choice=c["choice"],
                          best_us=c.get("best_us"), torch_us=c.get("torch_us"), names=c.get("names", [])))
    header = {f: result[f] for f in ("device", "capability", "torch", "measured", "copy_bw_bytes_per_s", "preset") if f in result}
    return dict(header, source=source, cells=cells)


def write_table(table: dict, path: Path) -> None:
    stream_tuning.parse_table(path, json.loads(json.dumps(table)))  # refuse to write what lookup would refuse
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1) + "\n")


def summary(result: dict, names_by_shape: dict | None = None) -> str:
    bw = result["copy_bw_bytes_per_s"]
    lines = [f"{result['device']}: copy {bw / 1e12:.2f} TB/s (read + written), preset {result.get('preset', '?')}", "",
             "| weight | projection | N x K | M | chosen | best kernel µs (of copy) | torch µs (of copy) | tiling |",
             "|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        best = c["tried"][0]["config"] if c.get("tried") else None
        tiling = StreamConfig(**best).describe() if best else "-"
        kernel = f"{c['best_us']:.2f} ({c['best_frac_copy']:.2f})" if c.get("best_us") else "-"
        cublas = f"{c['torch_us']:.2f} ({c['torch_frac_copy']:.2f})" if c.get("torch_us") else "-"
        chosen = "torch" if c["choice"] == "torch" else "kernel" if c["choice"] else "default"
        lines.append(f"| {c['weight']} | {', '.join(c.get('names', []))} | {c['n']}x{c['k']} | {c['rows']} | {chosen} | "
                     f"{kernel} | {cublas} | {tiling} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="dsv3-tp8")
    parser.add_argument("--quick", action="store_true", help="only the current table's tilings and a few defaults")
    parser.add_argument("--kinds", default=",".join(KINDS), help="weight kinds, comma-separated")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts, comma-separated")
    parser.add_argument("--write-table", nargs="?", const="", metavar="PATH",
                        help="write the table (default: serving/quant/tuned/<device>.json)")
    parser.add_argument("--out", help="write the measurements as JSON here")
    parser.add_argument("--from-json", metavar="FILE", help="no GPU: take the measurements from FILE (--out's format)")
    args = parser.parse_args(argv)
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
        source = args.from_json
    else:
        if not torch.cuda.is_available():
            print("stream_gemm tuner: needs a CUDA GPU (or --from-json FILE to write a table from measurements)", file=sys.stderr)
            return 3
        kinds = args.kinds.split(",")
        rows = [int(r) for r in args.rows.split(",")]
        if not set(kinds) <= set(KINDS) or not set(rows) <= set(ROWS):
            parser.error(f"expected kinds in {KINDS} and rows in {ROWS}, got {kinds} {rows}")
        result = bench(torch.device("cuda"), args.preset, args.quick, kinds, rows)
        source = f"phases/backend/bench/stream_gemm.py --preset {args.preset}{' --quick' if args.quick else ''}"
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    if args.write_table is not None:
        path = Path(args.write_table) if args.write_table else stream_tuning.table_path(result["device"])
        write_table(table_from_measurements(result, source), path)
        print(f"table: {path}")
    print(summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
