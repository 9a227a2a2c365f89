"""Build gate: compile every kernel configuration the benchmark shapes use and read its resources.

For each (H, T) of ``phases.kernel.bench.shapes.BENCH_SHAPES`` this calls ``kernel.compile_stats`` and keeps one
entry per distinct (kernel, config). Register spills are the thing to catch here: a spilling
configuration runs, passes verification and quietly loses a large share of its speed.

Gate: ``call: phases.kernel.build:run`` (CUDA). Metrics: ``configs``, ``spills``, ``max_regs``,
``max_shared_bytes``, ``shapes``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from phases.kernel.bench.shapes import BENCH_SHAPES
from runner import gatekit


def run() -> dict:
    """Compile the benchmark shapes' kernels on the current GPU and aggregate their stats."""
    if not torch.cuda.is_available():
        raise RuntimeError("The build gate needs a CUDA GPU (torch.cuda.is_available() is False)")
    from kernel import compile_stats

    stats = collect_stats(compile_stats, BENCH_SHAPES, on_progress=gatekit.progress)
    metrics = aggregate(stats)
    metrics["shapes"] = len(BENCH_SHAPES)
    table = markdown_table(stats)
    gatekit.write_artifact("build.md", table)
    print(table, flush=True)  # the gate's log keeps the table
    return metrics


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
    """``configs`` (distinct), ``spills`` (sum of n_spills), ``max_regs``, ``max_shared_bytes``."""
    return {
        "configs": len(stats),
        "spills": sum(int(s["n_spills"]) for s in stats),
        "max_regs": max((int(s["n_regs"]) for s in stats), default=0),
        "max_shared_bytes": max((int(s["shared_bytes"]) for s in stats), default=0),
    }


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
