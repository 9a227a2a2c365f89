"""Fill Triton's compile cache for every kernel specialization the kernel phase's gates use.

    python -m phases.kernel.bench.warmup [--workers 8]

The verify profile touches about thirty specializations (dtype, index dtype, tree or causal,
head dims, tile configuration), each through the Triton path and, on sm_90, the Hopper path's
Gluon kernels where they apply; compiled one after another inside the gates they would take
minutes. This runs one tiny input of each specialization in parallel worker processes, so
the gates find the kernels in the shared on-disk cache. It changes no result: the gates still
compile anything missing and check every case themselves.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import time

from phases.kernel.bench.cases import Case, full_cases
from phases.kernel.bench.shapes import BENCH_SHAPES


def compile_key(case: Case) -> tuple:
    """What decides a distinct compiled split kernel for ``case`` (not the lengths)."""
    widest = max(case.draft_lens) * case.num_heads
    return (case.dtype, case.index_dtype, case.tree, case.head_dim, case.v_head_dim, widest <= 16)


def representative_cases() -> list[Case]:
    """One small case per compile key of the verify profile and the benchmark shapes."""
    chosen: dict[tuple, Case] = {}
    candidates = list(full_cases(0))
    candidates += [Case(num_heads=h, draft_lens=(t,), context_lens=(4096,)) for h, t in BENCH_SHAPES]
    for case in candidates:
        key = compile_key(case)
        # Keep lengths short: compile time does not depend on them. 300 keys force a KV split,
        # so the combine kernel compiles too.
        small = dataclasses.replace(case, context_lens=tuple(max(t, 300) for t in case.draft_lens))
        chosen.setdefault(key, small)
    return list(chosen.values())


def _compile_one(case: Case) -> str:
    import torch

    from kernel import mla_verify_attention
    from kernel.bench_api import hopper
    from phases.kernel.bench.cases import build_inputs
    from phases.kernel.verify import hopper_serves

    device = torch.device("cuda")
    inputs = build_inputs(case, device)
    backends = ["triton"] + (["hopper"] if hopper.available(device) and hopper_serves(case) else [])
    for backend in backends:  # the verify gate runs both paths; the benchmark the dispatched one
        mla_verify_attention(**inputs, backend=backend)
    torch.cuda.synchronize()
    return f"{case.describe()} [{'+'.join(backends)}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args(argv)
    cases = representative_cases()
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    with context.Pool(args.workers) as pool:
        for done, name in enumerate(pool.imap_unordered(_compile_one, cases), start=1):
            print(f"[{done}/{len(cases)}] {name}", flush=True)
    print(f"compiled {len(cases)} specializations in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
