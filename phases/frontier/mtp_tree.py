"""Gate ``mtp-tree``: MTP tree speculation at batch 1 against plain decoding, on the trained demo model.

The measurement is phase ``speculation``'s (``phases.speculation.speculation``) restricted to
its two sides: plain greedy decoding and the MTP tree (``mtp:4x3``), at batch 1, in ``samples``
interleaved rounds per context, each round on its own held-out prompt. ``mtp_tree_ratio_b1`` is,
per round, the tree's tokens/s over plain's on the same prompt at the worse context: samples,
judged on the interval of their median. Phase ``speculation`` asks that speculation pay (its
better MTP mode); this gate asks that the tree pay, which is where a draft tree must beat a
chain of the same depth (decision of 2026-12-06).

The demo model is trained once per trainer version and reused from the temporary folder
(``phases.speculation.trained``): on a host that ran phase ``speculation`` it is not trained again.

Gate: ``call: phases.frontier.mtp_tree:run`` (CUDA). CPU profile (tests):
``run(tiny=True, contexts=[40], max_new_tokens=4, samples=6, device="cpu")``.
"""

from __future__ import annotations

from phases.common.engines import main_with_json_args
from phases.common.samples import SAMPLES
from phases.speculation import speculation


def run(contexts: list[int] = (2048, 16384), max_new_tokens: int = 256, speculate: str = "mtp:4x3",
        samples: int = SAMPLES, tiny: bool = False, device: str | None = None) -> dict:
    """Plain and the MTP tree ``speculate`` at batch 1; returns ``mtp_tree_ratio_b1`` and
    ``mtp_tree_tokens_per_step_b1`` (samples) with the rows' tokens/s and ratios."""
    metrics = speculation.run(contexts=contexts, batch_sizes=[1], max_new_tokens=max_new_tokens,
                              modes={"plain": None, "mtp_tree": speculate}, samples=samples, tiny=tiny, device=device,
                              sampled_modes=())  # the sampled rows are phase speculation's report
    return {k: v for k, v in metrics.items() if not k.startswith("mtp_best")}


if __name__ == "__main__":
    main_with_json_args(run, __doc__)
