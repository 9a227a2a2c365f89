"""Gate ``greedy-trained``: MTP speculation emits plain greedy's tokens on the trained model.

On held-out prompts, plain greedy decoding (its top-two logit gaps recorded) and MTP tree
speculation decode the same requests, first with the model in float32, then in bf16, both
through the kernel backend with CUDA graphs where there is a GPU. Where the outputs first
differ, a plain gap of at most one bf16 ulp of its top logit makes it a near tie
(``phases.common.greedy.compare``): counted per 1k tokens, in float32 as in bf16 (decision of
2026-12-06: the float32 model reads a bf16 pool, and decode and verify reduce a row in different
orders); any other divergence counts its tokens in ``mismatched_tokens_*``, which must be 0.
None in float32 (``near_tie_divergences_fp32``) is a target: decode and verify bit-identical.

Gate: ``call: phases.speculation.greedy_trained:run`` (CUDA). CPU profile (tests):
``run(tiny=True, prompts=2, context=48, max_new_tokens=12, device="cpu")``.
"""

from __future__ import annotations

import torch

from phases.common.engines import main_with_json_args
from phases.common.greedy import compare
from phases.speculation.trained import heldout_contexts, trained_model
from serving.device.select import pick_device
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.stack import ServingConfig, build_engine


def run(prompts: int = 8, context: int = 2048, max_new_tokens: int = 256, speculate: str = "mtp:4x3", tiny: bool = False,
        device: str | None = None) -> dict:
    dev = pick_device(device)
    cuda = dev.type == "cuda"
    folder, _ = trained_model(tiny, log=lambda line: print(line, flush=True))
    asks = heldout_contexts(folder, context, prompts)
    metrics: dict[str, float] = {"requests": 0, "requests_failed": 0, "leaked_slots": 0}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = DeepseekV3Model.from_folder(folder, dev, dtype)
        slots = prompts * (context + max_new_tokens + 128) + 1024
        base = ServingConfig(backend="kernel", pool_slots=slots, pool_dtype=torch.bfloat16, max_requests=prompts,
                             eos_token_ids=(), cuda_graphs=cuda, graph_batch_sizes=tuple(sorted({1, 2, 4, 8, prompts, 4 * prompts})))
        plain_engine = build_engine(base.but(record_margins=True), model).engine
        plain = plain_engine.generate(asks, max_new_tokens)
        spec_engine = build_engine(base.but(speculate=speculate), model).engine
        spec = spec_engine.generate(asks, max_new_tokens)
        mismatched = ties = 0
        gaps = []  # plain's top-two gap where each diverging request first differs
        for p, s in zip(plain, spec):
            m, t = compare(p, s)
            mismatched, ties = mismatched + m, ties + t
            first = next((i for i, (a, b) in enumerate(zip(p.output, s.output)) if a != b), None)
            if first is not None and first < len(p.margins):
                gaps.append(p.margins[first])
        tokens = sum(len(p.output) for p in plain)
        metrics[f"mismatched_tokens_{name}"] = mismatched
        metrics[f"near_tie_divergences_{name}"] = ties
        metrics[f"near_tie_divergences_per_1k_{name}"] = 1000 * ties / max(1, tokens)
        metrics[f"diverging_requests_{name}"] = len(gaps)
        metrics[f"max_divergence_gap_{name}"] = max(gaps, default=0.0)
        metrics[f"near_ties_per_1k_{name}"] = 1000 * sum(p.near_ties for p in plain) / max(1, tokens)
        metrics[f"tokens_per_step_{name}"] = spec_engine.stats.emitted / max(1, spec_engine.stats.request_steps)
        metrics["requests"] += len(plain)
        metrics["requests_failed"] += sum(1 for r in plain + spec if r.error)
        metrics["leaked_slots"] += plain_engine.pool.leaked_slots() + spec_engine.pool.leaked_slots()
        print(f"{name}: {mismatched} mismatched tokens, {ties} near-tie divergences over {tokens} tokens", flush=True)
        del plain_engine, spec_engine, model
    return metrics


if __name__ == "__main__":
    main_with_json_args(run, __doc__)
