"""Gate ``speculation``: tokens/s and tokens per verify step of every drafter against plain
decoding, on the trained demo model, on held-out files.

One engine per mode (plain, n-gram, layer-skip tree, MTP chain, MTP tree), bf16, the kernel
backend, CUDA graphs; each decodes ``max_new_tokens`` past prompts of each context length at
each batch size (end-of-sequence ignored, so every mode emits the same count). A short
generation first settles every kernel. Rows: ``{mode}_{ctx}_b{B}_tok_s``, ``_tokens_per_step``
(tokens emitted per request per step: 1 for plain) and, for the speculative modes, ``_ratio``
(tokens/s over plain's at the same context and batch).

Headline metrics: ``mtp_tree_ratio_b1`` and ``mtp_tree_tokens_per_step_b1``, the smallest over
the contexts at batch 1.

Gate: ``call: phases.speculation.benchmark:run`` (CUDA). CPU profile (tests):
``run(tiny=True, contexts=[48], batch_sizes=[1, 2], max_new_tokens=8, device="cpu")``.
"""

from __future__ import annotations

import time

import torch

from phases.common.engines import main_with_json_args, metrics_table, pick_device
from phases.speculation.trained import heldout_contexts, trained_model
from serving.engine.model import DeepseekV3Model
from serving.stack import ServingConfig, build_engine

try:
    from runner import gatekit
except ImportError:  # the gate also runs where the runner is not importable
    gatekit = None

MODES = {"plain": None, "ngram": "ngram:4x4", "layer_skip": "tree:4x4:layers=2", "mtp_chain": "mtp:1x3", "mtp_tree": "mtp:4x3"}


def _label(ctx: int) -> str:
    return f"{ctx // 1024}k" if ctx % 1024 == 0 else str(ctx)


def run(contexts: list[int] = (2048, 16384), batch_sizes: list[int] = (1, 8), max_new_tokens: int = 256,
        modes: dict | None = None, tiny: bool = False, device: str | None = None) -> dict:
    dev = pick_device(device)
    say = lambda line: print(line, flush=True)  # noqa: E731 - the gate log
    folder, summary = trained_model(tiny, log=say)
    cuda = dev.type == "cuda"
    model = DeepseekV3Model.from_folder(folder, dev, torch.bfloat16 if cuda else torch.float32)
    modes = dict(MODES if modes is None else modes)
    top_b = max(batch_sizes)
    slots = top_b * (max(contexts) + max_new_tokens + 128) + 4096
    metrics: dict[str, float] = {"train_s": summary["total_s"], "train_loss": summary["final_loss"],
                                 "train_mtp_loss": summary["final_mtp_loss"], "parameters_m": summary["parameters"] / 1e6}
    rows = []
    for mode, spec in modes.items():
        config = ServingConfig(backend="kernel", speculate=spec, pool_slots=slots, max_requests=top_b,
                               max_context=max(contexts) + max_new_tokens + 128, eos_token_ids=(),
                               cuda_graphs=cuda, graph_batch_sizes=tuple(sorted({1, 2, 4, 8, 16, 32, top_b * 4})))
        t0 = time.perf_counter()
        engine = build_engine(config, model).engine
        engine.generate(heldout_contexts(folder, 64, 1), 8)  # settle every kernel the steps launch
        say(f"{mode}: engine ready in {time.perf_counter() - t0:.1f} s")
        for ctx in contexts:
            for b in batch_sizes:
                engine.stats = type(engine.stats)()
                reqs = engine.generate(heldout_contexts(folder, ctx, b), max_new_tokens)
                if any(r.error for r in reqs):
                    raise RuntimeError(f"{mode} at {ctx} x {b}: {next(r.error for r in reqs if r.error)}")
                s = engine.stats
                key = f"{mode}_{_label(ctx)}_b{b}"
                metrics[key + "_tok_s"] = s.tokens_per_s
                metrics[key + "_tokens_per_step"] = s.emitted / s.request_steps
                rows.append((mode, ctx, b, s.tokens_per_s, s.emitted / s.request_steps))
                say(f"{key}: {s.tokens_per_s:.0f} tok/s, {s.emitted / s.request_steps:.2f} tokens per step")
        del engine
    for mode in modes:
        if mode == "plain":
            continue
        for ctx in contexts:
            for b in batch_sizes:
                key = f"{mode}_{_label(ctx)}_b{b}"
                metrics[key + "_ratio"] = metrics[key + "_tok_s"] / metrics[f"plain_{_label(ctx)}_b{b}_tok_s"]
    if "mtp_tree" in modes and 1 in batch_sizes:
        metrics["mtp_tree_ratio_b1"] = min(metrics[f"mtp_tree_{_label(c)}_b1_ratio"] for c in contexts)
        metrics["mtp_tree_tokens_per_step_b1"] = min(metrics[f"mtp_tree_{_label(c)}_b1_tokens_per_step"] for c in contexts)
    if gatekit is not None:
        gatekit.write_artifact("speculation.md", table(rows) + "\n" + metrics_table(metrics))
    return metrics


def table(rows) -> str:
    """The speculation table: per context and batch, each mode's tokens/s, its ratio to plain
    and its tokens per step."""
    plain = {(c, b): t for m, c, b, t, _ in rows if m == "plain"}
    lines = ["| mode | context | batch | tokens/s | × plain | tokens per step |", "|---|---|---|---|---|---|"]
    for m, c, b, t, per in rows:
        ratio = t / plain[(c, b)] if (c, b) in plain and plain[(c, b)] else float("nan")
        lines.append(f"| {m} | {c} | {b} | {t:.0f} | {ratio:.2f} | {per:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main_with_json_args(run, __doc__)
