"""A benchmark that is noisy by construction: each call draws its timings from a seeded normal
distribution, so the runner's samples, intervals and rank tests can be shown on numbers that
come out the same on every machine.

``BENCH_SEED`` (default 1) picks the draw, ``BENCH_SHIFT`` (default 0) moves the centre: the
README's example runs the gates with another seed (the same distribution: no significant
change) and with a shift (a real regression).
"""

from __future__ import annotations

import os
import random


def run(centre: float, spread: float, samples: int = 20) -> dict:
    draw = random.Random(int(os.environ.get("BENCH_SEED", "1")))
    shift = float(os.environ.get("BENCH_SHIFT", "0"))
    return {"speedup": [round(draw.gauss(centre + shift, spread), 3) for _ in range(samples)]}
