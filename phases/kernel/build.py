"""Build gate: compile every kernel configuration the benchmark shapes use and read its resources.

For each (H, T) of ``phases.kernel.bench.shapes.BENCH_SHAPES`` this calls ``kernel.compile_stats``
(the Triton path) and ``hopper_compile_stats`` (the Hopper path's Gluon variant that
``hopper.choose_variant`` dispatches, compiled for sm_90 with ``hopper.compile_for_sm90`` and read
with ``ptxas -v`` through ``hopper.resource_stats``) and keeps one entry per distinct (kernel,
config). Register spills are the thing to catch here: a spilling configuration runs, passes
verification and quietly loses a large share of its speed.

Gate: ``call: phases.kernel.build:run`` (CUDA). Metrics: ``configs``, ``spills``, ``max_regs``,
``max_shared_bytes`` over both paths, ``shapes``, and per path ``configs_triton``,
``configs_hopper``, ``spills_triton``, ``spills_hopper`` (Hopper entries only with Gluon).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import torch

from phases.kernel.bench.shapes import BENCH_SHAPES
from runner import gatekit


def run() -> dict:
    """Compile the benchmark shapes' kernels on the current GPU and aggregate their stats."""
    if not torch.cuda.is_available():
        raise RuntimeError("The build gate needs a CUDA GPU (torch.cuda.is_available() is False)")
    from kernel import compile_stats
    from kernel.bench_api import hopper

    total = 2 * len(BENCH_SHAPES) if hopper.HAVE_GLUON else len(BENCH_SHAPES)
    stats = collect_stats(compile_stats, BENCH_SHAPES, on_progress=lambda done, _: gatekit.progress(done, total))
    triton_stats = [dict(s, path="triton") for s in stats]
    hopper_stats: list[dict] = []
    if hopper.HAVE_GLUON:
        hopper_stats = collect_stats(
            hopper_compile_stats, BENCH_SHAPES,
            on_progress=lambda done, _: gatekit.progress(len(BENCH_SHAPES) + done, total),
        )
        hopper_stats = [dict(s, path="hopper") for s in hopper_stats]
    stats = triton_stats + hopper_stats
    metrics = aggregate(stats)
    metrics["shapes"] = len(BENCH_SHAPES)
    table = markdown_table(stats)
    gatekit.write_artifact("build.md", table)
    print(table, flush=True)  # the gate's log keeps the table
    return metrics


def hopper_compile_stats(num_heads: int, max_draft: int) -> list[dict]:
    """The Hopper split kernel ``hopper.choose_variant`` dispatches for (H=num_heads, T=max_draft),
    compiled for sm_90 (tree mask and causal), in ``kernel.compile_stats``'s format plus
    ``setmaxnreg`` (the per-partition register budgets)."""
    from kernel.bench_api import hopper

    variant = hopper.choose_variant(num_heads * max_draft)
    return [_hopper_variant_stats(variant, causal) for causal in (False, True)]


@functools.lru_cache(maxsize=None)
def _hopper_variant_stats(variant, causal: bool) -> dict:
    from kernel.bench_api import hopper

    stats = hopper.resource_stats(hopper.compile_for_sm90(causal, variant))
    kernel = hopper.kernel_name(variant)
    return {"kernel": f"{kernel}[{'causal' if causal else 'tree'}]", "config": variant.describe() + "_sm90",
            "n_regs": stats["n_regs"], "n_spills": stats["n_spills"], "shared_bytes": stats["shared_bytes"],
            "setmaxnreg": stats["setmaxnreg"]}


def triton_compile_for_sm90(config, causal: bool, head_dim: int = 576, v_head_dim: int = 512):
    """Compile the Triton split kernel for sm_90 without a GPU (``kernel.bench_api.compile_split_for_sm90``):
    bf16, ``config``'s block sizes, warps and stages. Returns the compiled kernel (read it with
    ``triton_sm90_stats``)."""
    from kernel.bench_api import HeadDims, compile_split_for_sm90

    return compile_split_for_sm90(config, causal, HeadDims.of(head_dim, v_head_dim))


def triton_sm90_stats(config, causal: bool, head_dim: int = 576, v_head_dim: int = 512) -> dict:
    """``triton_compile_for_sm90``'s kernel read with ``hopper.resource_stats`` (``ptxas -v``):
    ``kernel``, ``config``, ``n_regs``, ``n_spills`` (spill store + load bytes; the gate's
    driver-side count is local-memory words), ``shared_bytes`` and ``mma`` ("wgmma" when the PTX
    has ``wgmma.mma_async``, "mma.sync" when it only has ``mma.sync``)."""
    from kernel.bench_api import hopper

    compiled = triton_compile_for_sm90(config, causal, head_dim, v_head_dim)
    stats = hopper.resource_stats(compiled)
    ptx = compiled.asm["ptx"]
    mma = "wgmma" if "wgmma.mma_async" in ptx else ("mma.sync" if "mma.sync" in ptx else "none")
    return {"kernel": f"_mla_verify_split_kernel[{'causal' if causal else 'tree'}]",
            "config": config.describe() + "_sm90", "n_regs": stats["n_regs"], "n_spills": stats["n_spills"],
            "shared_bytes": stats["shared_bytes"], "mma": mma}


def collect_stats(
    compile_stats: Callable[..., list[dict]],
    shapes: Iterable[tuple[int, int]],
    on_progress: Callable[[int, int], None] | None = None,
) -> list[dict]:
    """Distinct compiled configurations over ``shapes``, first-seen order.

    Each entry is a ``compile_stats`` dict (``kernel``, ``config``, ``n_regs``, ``n_spills``,
    ``shared_bytes``) plus ``shapes``: the ``"H,T"`` pairs that use it. ``on_progress(done, total)``
    is called after each shape.
    """
    shapes = list(shapes)
    distinct: dict[tuple[str, str], dict] = {}
    for done, (num_heads, max_draft) in enumerate(shapes, start=1):
        for entry in compile_stats(num_heads=num_heads, max_draft=max_draft):
            key = (str(entry["kernel"]), str(entry["config"]))
            record = distinct.setdefault(key, {**entry, "shapes": []})
            record["shapes"].append(f"{num_heads},{max_draft}")
        if on_progress is not None:
            on_progress(done, len(shapes))
    return list(distinct.values())


def aggregate(stats: list[dict]) -> dict:
    """``configs`` (distinct), ``spills`` (sum of n_spills), ``max_regs``, ``max_shared_bytes`` over
    every entry, and ``configs_<path>`` / ``spills_<path>`` per kernel path (an entry's ``path``,
    "triton" when absent)."""
    metrics = {
        "configs": len(stats),
        "spills": sum(int(s["n_spills"]) for s in stats),
        "max_regs": max((int(s["n_regs"]) for s in stats), default=0),
        "max_shared_bytes": max((int(s["shared_bytes"]) for s in stats), default=0),
    }
    for path in ("triton", "hopper"):
        entries = [s for s in stats if s.get("path", "triton") == path]
        metrics[f"configs_{path}"] = len(entries)
        metrics[f"spills_{path}"] = sum(int(s["n_spills"]) for s in entries)
    return metrics


def markdown_table(stats: list[dict]) -> str:
    """One line per distinct configuration: kernel, config, regs, spills, shared bytes, shapes."""
    lines = [
        "# Compiled kernel configurations",
        "",
        "| kernel | config | regs | spills | shared bytes | (H,T) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for s in stats:
        lines.append(
            f"| {s['kernel']} | {s['config']} | {s['n_regs']} | {s['n_spills']} | {s['shared_bytes']} | "
            f"{' '.join(s['shapes'])} |"
        )
    return "\n".join(lines) + "\n"
