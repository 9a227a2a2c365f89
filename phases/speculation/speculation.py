"""Gate ``speculation``: tokens/s and tokens per verify step of every drafter against plain
decoding, on the trained demo model, on held-out files.

One engine per mode (plain, n-gram, layer-skip tree, MTP chain, MTP tree), bf16, the kernel
backend, CUDA graphs; each decodes ``max_new_tokens`` past prompts of each context length at
each batch size (end-of-sequence ignored, so every mode emits the same count). A short
generation first settles every kernel. Rows: ``{mode}_{ctx}_b{B}_tok_s``, ``_tokens_per_step``
(tokens emitted per request per step: 1 for plain) and, for the speculative modes, ``_ratio``
(tokens/s over plain's at the same context and batch).

The headline's sides, plain and the two MTP modes (chain and tree), are measured at batch 1 in
``samples`` rounds (7 by default), each on its own held-out prompt (round ``r``: the ``r``-th),
the engines kept and their order rotating round by round, so drift and the prompt hit every
side alike. Their rows' ``_tokens_per_step`` and each MTP mode's ``_ratio`` (against plain on the
same prompt) are samples, one per round, and ``_tok_s`` the median; every other row is measured
once, on the first prompts, its ratio over plain's reported tokens/s.

Headline metrics, per round the smallest over the contexts at batch 1 (samples, whose thresholds
the runner judges on the interval of their median): ``mtp_<mode>_ratio_b1`` and
``mtp_<mode>_tokens_per_step_b1`` for each MTP mode measured, and ``mtp_best_ratio_b1`` /
``mtp_best_tokens_per_step_b1``, those of the MTP mode whose ratio has the higher median
(``mtp_best_mode`` names it): speculation pays when its better mode does (decision of
2026-12-06); the tree's own ratio is phase ``frontier``'s ``mtp-tree`` gate.

Sampled rows (reported, never judged: the plan's thresholds stay greedy): plain, n-gram and the
two MTP modes again with ``temperature=0.7, top_p=0.95`` (``SAMPLED``; request i seeded i), at
every context and batch size, measured once each on the first prompts, on the same engines
(built to serve sampled requests: with CUDA graphs their sampled steps are captured too, beside
the greedy ones the greedy rows replay). Rows ``sampled_{mode}_{ctx}_b{B}_tok_s``,
``_tokens_per_step`` and, but for plain, ``_ratio`` (over sampled plain's tokens/s at the same
context and batch). A greedy loop is easy to draft; sampled text is not, so these rows measure
the drafters where loops cannot flatter them. Cost: 16 more generations at the defaults (about
a minute on an H200 at the NOTES' speeds, most of it the B=8 16k prefills) and the sampled
graphs' capture. The CPU profile (no
CUDA) measures them only when ``sampled_modes`` names them: it checks plumbing, and under
Triton's interpreter every generation costs seconds.

Gate: ``call: phases.speculation.speculation:run`` (CUDA). CPU profile (tests):
``run(tiny=True, contexts=[48], batch_sizes=[1, 2], max_new_tokens=8, device="cpu")``.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from phases.common.engines import main_with_json_args, metrics_table
from phases.common.samples import SAMPLES, check_count, median, ratios, round_order
from phases.speculation.trained import heldout_contexts, trained_model
from serving.device.select import pick_device
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.sampling import SamplingParams
from serving.stack import ServingConfig, build_engine

try:
    from runner import gatekit
except ImportError:  # the gate also runs where the runner is not importable
    gatekit = None

MODES = {"plain": None, "ngram": "ngram:4x4", "layer_skip": "tree:4x4:layers=2", "mtp_chain": "mtp:1x3", "mtp_tree": "mtp:4x3"}
SAMPLED_MODES = ("plain", "mtp_chain", "mtp_tree")  # the headline's sides: interleaved rounds at batch 1
MTP_MODES = ("mtp_chain", "mtp_tree")
SAMPLED_ROW_MODES = ("plain", "ngram", "mtp_chain", "mtp_tree")  # reported sampled rows
SAMPLED = SamplingParams(temperature=0.7, top_p=0.95)


def _label(ctx: int) -> str:
    return f"{ctx // 1024}k" if ctx % 1024 == 0 else str(ctx)


def measure(engine, prompts: list[list[int]], max_new_tokens: int, what: str) -> tuple[float, float]:
    """One generation from a fresh count: (tokens/s, tokens emitted per request per step)."""
    engine.stats = type(engine.stats)()
    reqs = engine.generate(prompts, max_new_tokens)
    if any(r.error for r in reqs):
        raise RuntimeError(f"{what}: {next(r.error for r in reqs if r.error)}")
    s = engine.stats
    return s.tokens_per_s, s.emitted / s.request_steps


def measure_sampled(engine, prompts: list[list[int]], max_new_tokens: int, what: str) -> tuple[float, float]:
    """``measure`` with ``SAMPLED`` (request i seeded i, so a rerun draws alike)."""
    engine.stats = type(engine.stats)()
    reqs = engine.generate(prompts, max_new_tokens, [dataclasses.replace(SAMPLED, seed=i) for i in range(len(prompts))])
    if any(r.error for r in reqs):
        raise RuntimeError(f"{what}: {next(r.error for r in reqs if r.error)}")
    s = engine.stats
    return s.tokens_per_s, s.emitted / s.request_steps


def run(contexts: list[int] = (2048, 16384), batch_sizes: list[int] = (1, 8), max_new_tokens: int = 256,
        modes: dict | None = None, samples: int = SAMPLES, tiny: bool = False, device: str | None = None,
        sampled_modes: tuple[str, ...] | None = None) -> dict:
    """The table's rows and the headline (see the module docstring); ``sampled_modes``: the modes
    of the sampled rows (None: those of ``SAMPLED_ROW_MODES`` measured, on CUDA; () for none)."""
    check_count(samples)
    dev = pick_device(device)
    say = lambda line: print(line, flush=True)  # noqa: E731 - the gate log
    folder, summary = trained_model(tiny, log=say)
    cuda = dev.type == "cuda"
    model = DeepseekV3Model.from_folder(folder, dev, torch.bfloat16 if cuda else torch.float32)
    modes = dict(MODES if modes is None else modes)
    sampled = [m for m in SAMPLED_MODES if m in modes] if 1 in batch_sizes else []
    if sampled_modes is None:
        sampled_modes = SAMPLED_ROW_MODES if dev.type == "cuda" else ()
    with_sampling = [m for m in sampled_modes if m in modes]
    top_b = max(batch_sizes)
    slots = top_b * (max(contexts) + max_new_tokens + 128) + 4096
    metrics: dict = {"train_s": summary["total_s"], "train_loss": summary["final_loss"],
                     "train_mtp_loss": summary["final_mtp_loss"], "parameters_m": summary["parameters"] / 1e6}
    results: dict[tuple[str, int, int], list[tuple[float, float]]] = {}  # (mode, ctx, B): one (tok/s, per step) a run
    sampled_rows: dict[tuple[str, int, int], tuple[float, float]] = {}
    kept = {}
    for mode, spec in modes.items():
        config = ServingConfig(backend="kernel", speculate=spec, pool_slots=slots, max_requests=top_b,
                               max_context=max(contexts) + max_new_tokens + 128, eos_token_ids=(),
                               cuda_graphs=cuda, graph_batch_sizes=tuple(sorted({1, 2, 4, 8, 16, 32, top_b * 4})),
                               sampling=mode in with_sampling)
        t0 = time.perf_counter()
        engine = build_engine(config, model).engine
        engine.generate(heldout_contexts(folder, 64, 1), 8)  # settle every kernel the steps launch
        if mode in with_sampling and cuda:  # and the sampled steps' (nothing to compile on the CPU profile)
            engine.generate(heldout_contexts(folder, 64, 1), 8, dataclasses.replace(SAMPLED, seed=0))
        say(f"{mode}: engine ready in {time.perf_counter() - t0:.1f} s")
        for ctx in contexts:
            for b in batch_sizes:
                if mode in sampled and b == 1:
                    continue  # measured in the interleaved rounds below
                results[(mode, ctx, b)] = [measure(engine, heldout_contexts(folder, ctx, b), max_new_tokens,
                                                   f"{mode} at {ctx} x {b}")]
                _say_row(say, mode, ctx, b, results[(mode, ctx, b)])
        for ctx in contexts if mode in with_sampling else ():
            for b in batch_sizes:
                row = measure_sampled(engine, heldout_contexts(folder, ctx, b), max_new_tokens, f"sampled {mode} at {ctx} x {b}")
                sampled_rows[(mode, ctx, b)] = row
                _say_row(say, "sampled_" + mode, ctx, b, [row])
        if mode in sampled:
            kept[mode] = engine
        del engine
    for ctx in contexts if sampled else ():
        prompts = heldout_contexts(folder, ctx, samples)
        for r in range(samples):
            for mode in round_order(sampled, r):
                results.setdefault((mode, ctx, 1), []).append(
                    measure(kept[mode], [prompts[r]], max_new_tokens, f"{mode} at {ctx} x 1, round {r}"))
        for mode in sampled:
            _say_row(say, mode, ctx, 1, results[(mode, ctx, 1)])
    del kept
    order = list(modes)
    results = dict(sorted(results.items(), key=lambda item: (order.index(item[0][0]), list(contexts).index(item[0][1]),
                                                             list(batch_sizes).index(item[0][2]))))
    rows = []
    for (mode, ctx, b), runs in results.items():
        key = f"{mode}_{_label(ctx)}_b{b}"
        metrics[key + "_tok_s"] = median([t for t, _ in runs])
        per_step = [p for _, p in runs]
        metrics[key + "_tokens_per_step"] = per_step if mode in sampled and b == 1 else per_step[0]
        rows.append((mode, ctx, b, metrics[key + "_tok_s"], median(per_step)))
    for (mode, ctx, b), runs in results.items():
        if mode == "plain":
            continue
        key, plain = f"{mode}_{_label(ctx)}_b{b}", f"plain_{_label(ctx)}_b{b}"
        if mode in sampled and b == 1:  # paired: plain on the same prompt, in the same round
            metrics[key + "_ratio"] = ratios([t for t, _ in runs], [t for t, _ in results[("plain", ctx, 1)]])
        else:
            metrics[key + "_ratio"] = metrics[key + "_tok_s"] / metrics[plain + "_tok_s"]
    if 1 in batch_sizes:
        headline_modes = [m for m in MTP_MODES if m in modes]
        for mode in headline_modes:
            metrics[f"{mode}_ratio_b1"] = _worst_context(metrics, contexts, mode, "_ratio")
            metrics[f"{mode}_tokens_per_step_b1"] = _worst_context(metrics, contexts, mode, "_tokens_per_step")
        if headline_modes:
            best = max(headline_modes, key=lambda m: median(_as_list(metrics[f"{m}_ratio_b1"])))
            metrics["mtp_best_mode"] = best
            metrics["mtp_best_ratio_b1"] = metrics[f"{best}_ratio_b1"]
            metrics["mtp_best_tokens_per_step_b1"] = metrics[f"{best}_tokens_per_step_b1"]
    srows = []
    for (mode, ctx, b), (tok_s, per_step) in sampled_rows.items():
        key = f"sampled_{mode}_{_label(ctx)}_b{b}"
        metrics[key + "_tok_s"], metrics[key + "_tokens_per_step"] = tok_s, per_step
        if mode != "plain" and ("plain", ctx, b) in sampled_rows:
            metrics[key + "_ratio"] = tok_s / sampled_rows[("plain", ctx, b)][0]
        srows.append((mode, ctx, b, tok_s, per_step))
    if gatekit is not None:
        sampled_table = f"\nSampled ({SAMPLED.describe()}), reported only:\n\n" + table(srows) if srows else ""
        gatekit.write_artifact("speculation.md", table(rows) + sampled_table + "\n" + metrics_table(metrics))
    return metrics


def _worst_context(metrics: dict, contexts, mode: str, suffix: str):
    """``mode``'s batch-1 ``suffix`` metric at the worse context: per round when sampled."""
    values = [metrics[f"{mode}_{_label(c)}_b1{suffix}"] for c in contexts]
    if isinstance(values[0], list):
        return [min(per_context) for per_context in zip(*values)]
    return min(values)


def _as_list(value) -> list[float]:
    return value if isinstance(value, list) else [value]


def _say_row(say, mode: str, ctx: int, b: int, runs: list[tuple[float, float]]) -> None:
    tok_s, per_step = median([t for t, _ in runs]), median([p for _, p in runs])
    count = f" (median of {len(runs)})" if len(runs) > 1 else ""
    say(f"{mode}_{_label(ctx)}_b{b}: {tok_s:.0f} tok/s, {per_step:.2f} tokens per step{count}")


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
