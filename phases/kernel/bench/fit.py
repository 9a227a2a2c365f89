"""The fixed-cost fit ``t = a + bytes / BW`` of the benchmark's sweep, per (H, T) over contexts.

``a`` is what a call costs whatever its size (launch ramp, the first tile's latency, the
combine, the drain of the last wave); ``BW`` the rate at which the rest streams. For memory-bound
rows the streaming rate is the one to compare with the copy bandwidth; for compute-bound rows
the bytes only stand for the work (which grows with the context as the bytes do), so their
``BW`` is an effective rate. Ordinary least squares on the B=1 sweep rows of each (H, T).
"""

from __future__ import annotations

from dataclasses import dataclass

from phases.kernel.bench.shapes import HEAD_DIM


@dataclass(frozen=True)
class Fit:
    num_heads: int
    num_draft: int
    bound: str
    a_us: float  # fixed cost, µs
    bw_TBps: float  # streaming rate, TB/s
    points: int
    max_resid_us: float  # largest |measured - fitted| over the points


def fit_fixed_cost(rows) -> list[Fit]:
    """One ``Fit`` per (H, T) with at least three B=1 sweep rows (``BenchRow``s: ``kind``,
    ``batch_size``, ``total_kv``, ``num_draft``, ``num_heads``, ``time_us``, ``bound``)."""
    groups: dict[tuple[int, int], list] = {}
    for r in rows:
        if r.kind == "sweep" and r.batch_size == 1:
            groups.setdefault((r.num_heads, r.num_draft), []).append(r)
    fits = []
    for (heads, draft), group in sorted(groups.items()):
        if len(group) < 3:
            continue
        xs = [r.total_kv * HEAD_DIM * 2 for r in group]  # bf16 KV bytes, the part that grows with context
        ys = [r.time_us for r in group]
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0  # µs per byte
        a = my - slope * mx
        resid = max(abs(y - (a + slope * x)) for x, y in zip(xs, ys))
        bw = 1e-6 / slope if slope > 0 else float("inf")  # bytes per µs -> TB/s
        fits.append(Fit(heads, draft, group[0].bound, round(a, 2), round(bw, 3), n, round(resid, 2)))
    return fits


def fit_table(fits: list[Fit], copy_bw_TBps: float) -> str:
    lines = [
        "# Fixed cost per shape: t = a + bytes / BW (B=1 sweep, least squares over contexts)",
        "",
        f"Copy bandwidth of the same run: {copy_bw_TBps:.2f} TB/s. Compute-bound rows: BW is an effective rate.",
        "",
        "| class | H | T | a (µs) | BW (TB/s) | BW / copy | points | max resid (µs) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in sorted(fits, key=lambda f: ("memory", "mid", "compute").index(f.bound)):
        lines.append(f"| {f.bound} | {f.num_heads} | {f.num_draft} | {f.a_us:.1f} | {f.bw_TBps:.2f} | "
                     f"{f.bw_TBps / copy_bw_TBps:.2f} | {f.points} | {f.max_resid_us:.1f} |")
    return "\n".join(lines) + "\n"
