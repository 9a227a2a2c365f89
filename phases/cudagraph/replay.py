"""Gate ``replay``: captured steps replay bitwise like eager ones, for every bucket and any batch.

The engine's decode and verify steps (``gpu-h16``: 576-wide latent rows, bf16) are captured
once per bucket batch size. Then, for ``rounds`` rounds per bucket, a new batch is drawn: as
many requests as the bucket holds or fewer (so padding is exercised), context lengths from 1
to ``max_context`` (log-uniform; scattered slots with random rows in the pool), random draft
trees. Each round:

- the step is prepared and replayed with ``torch.cuda.set_sync_debug_mode("error")`` on
  (``host_syncs_in_replay``: replays that synchronised with the host);
- its outputs were poisoned first and must equal, bit for bit, the same step run eagerly on
  the same static buffers and plan (``replay_mismatches``), and its tokens must equal those of
  the plain eager path (exact sizes, its own plan made for the step, the bucket's tile
  configuration), near ties of the replay apart (``unpadded_mismatches``; with a near tie of
  either path apart: ``unpadded_mismatches_either_tie``, as padding changes the GEMMs' shapes
  and float32 noise can move a q or latent value across a bf16 rounding boundary); the
  attention plan a replay runs must be the one made for the step's own lengths (``stale_plans``);
- every row of the pool, live or free, except the step's own new rows keeps its checksum
  (``padding_corrupted_rows``: padding writes only slot 0).

Then speculative decoding with graphs against plain greedy decoding through the reference
backend (``phases.common.greedy``, phase ``backend``'s check, at a small profile): ``mismatched_tokens`` and near ties
counted apart, as in phase ``backend``'s gate. ``uncaptured_batch_sizes`` counts buckets
whose capture failed.

Gate: ``call: phases.cudagraph.replay:run`` (CUDA). CPU: ``run(..., device="cpu")`` runs the
same rounds without capture (tests).
"""

from __future__ import annotations

import math
import random
import struct
import sys
import time

import torch

from phases.common.engines import capture_report, main_with_json_args, make_engine
from phases.common.greedy import greedy_check
from serving.device.select import pick_device
from serving.engine.model_runner import unpack_outputs
from serving.graphs.runner import CudaGraphRunner
from serving.kv.batch import StepBatch, StepEntry
from serving.model.presets import random_model
from serving.speculation.tree import DraftTree

try:
    from runner import gatekit
except ImportError:
    gatekit = None

TREE = "tree:4x4:layers=1"


def random_tree(rng: random.Random, size: int, vocab: int) -> DraftTree:
    parents = [rng.randrange(-1, t) for t in range(size)]
    tokens = [rng.randrange(vocab) for _ in range(size)]
    return DraftTree(tokens, parents)


def fill_requests(pool, rng: random.Random, lengths: list[int]) -> list[int]:
    """Live requests with the given context lengths on scattered free slots; returns their ids."""
    free = pool.allocator.free_slots()
    chosen = rng.sample(free, sum(lengths))
    pool.allocator.reserve(chosen)
    ids, at = [], 0
    for i, n in enumerate(lengths):
        req = 10_000 + i
        pool.table.add(req)
        pool.table.append(req, chosen[at : at + n])
        at += n
        ids.append(req)
    return ids


def checksums(pool, slots: torch.Tensor, chunk: int = 32768) -> torch.Tensor:
    """float64 [2, layers, len(slots)]: per row, the sum of its 16-bit words and their sum
    weighted by position (exact in float64), in chunks of rows to bound the temporaries."""
    weights = torch.arange(1, pool.kv.shape[-1] + 1, device=pool.kv.device, dtype=torch.float64)
    out = []
    for start in range(0, slots.numel(), chunk):
        words = pool.kv[:, slots[start : start + chunk]].view(torch.int16).to(torch.float64)
        out.append(torch.stack([words.sum(-1), (words * weights).sum(-1)]))
    return torch.cat(out, dim=-1) if out else torch.zeros(2, pool.kv.shape[0], 0, dtype=torch.float64)


def draw_lengths(rng: random.Random, count: int, max_context: int, budget: int) -> list[int]:
    lengths = [max(1, int(math.exp(rng.uniform(0, math.log(max_context))))) for _ in range(count)]
    scale = min(1.0, budget / sum(lengths))
    return [max(1, int(n * scale)) for n in lengths]


def plain_step(engine, step: StepBatch, key, plain_engines: dict):
    """``step`` through the plain eager path (exact sizes, no padding, its own plan made now): an
    engine over the same model and pool without graphs, whose kernel backend is pinned to the
    bucket's tile configuration (``ServingConfig.pinned_tiles``). The attention is then the same
    decomposition as the replay's, so tokens may differ only at a near tie of the padded
    products, and a replay that kept a stale plan differs outright."""
    width = key.family.shape.width
    if width not in plain_engines:
        plain_engines[width] = make_engine(engine.model, engine.pool, "kernel", None,
                                           pinned_tiles=(engine.pool.table.max_requests, width))
    return plain_engines[width].runner.run(step)


def replay_rounds(engine, graphs: CudaGraphRunner, rounds: int, max_context: int, seed: int) -> dict:
    """The bitwise / token / sync / padding checks over every captured target bucket.

    A population of as many requests as the largest bucket holds scattered contexts of 1 to
    ``max_context`` tokens; each round takes a random subset of it (the composition) and a
    random prefix of each (new lengths), so rounds cost no re-filling. A step writes its
    accepted slots into the rows after the prefix; they are restored from the host lists.
    """
    pool, runner, vocab = engine.pool, engine.runner, engine.model.cfg.vocab_size
    rng = random.Random(seed)
    totals = dict(replay_mismatches=0, stale_plans=0, unpadded_mismatches=0, unpadded_mismatches_either_tie=0, host_syncs_in_replay=0,
                  padding_corrupted_rows=0, replays_checked=0)
    cuda = pool.kv.device.type == "cuda"
    keys = [k for k in graphs.keys if k.family.shape.accept]
    plain_engines: dict = {}
    widest = max(k.family.shape.width for k in keys)
    count = max(k.batch for k in keys)
    lengths = draw_lengths(rng, count, max_context, (pool.allocator.num_free - count * widest) // 2)
    population = fill_requests(pool, rng, lengths)
    every = torch.arange(1, pool.num_slots, device=pool.kv.device)  # live and free rows alike: padding may write neither
    baseline = checksums(pool, every)
    for key in keys:
        width, kind = key.family.shape.width, key.family.shape.kind
        for r in range(rounds):
            chosen = rng.sample(population, rng.randint(key.batch // 2 + 1, key.batch) if key.batch > 1 else 1)
            entries = []
            for req in chosen:
                n = rng.randint(1, pool.table.length(req))
                tree = random_tree(rng, rng.randrange(0, width), vocab) if width > 1 else DraftTree()
                entries.append(StepEntry(pool.table.row(req), n, pool.alloc(1 + len(tree)), [rng.randrange(vocab)] + tree.tokens,
                                         [n] + [n + d for d in tree.depths()],
                                         [-1] + [0 if p < 0 else p + 1 for p in tree.parents] if kind == "verify" else None))
            step = StepBatch(kind, entries, accept=True)
            assert graphs.key_for(step) == key, f"round {r}: {step.batch_size} entries did not land in {key.describe()}"
            cap = graphs.graphs[key]
            for out in cap.outputs:  # poisoned: a replay that writes nothing cannot pass
                out.fill_(-7)
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            try:
                graphs.replay_into(step, key)
            except RuntimeError as exc:
                if "synchroniz" not in str(exc):
                    raise
                totals["host_syncs_in_replay"] += 1
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
            # re-planned for this step's lengths (on the host, or by the graph on the device), not the capture's or the last
            totals["stale_plans"] += int(not runner.backend.plan_matches([e.num_tokens for e in entries],
                                                                         [e.kv_len for e in entries]))
            got = graphs.read(step, key)  # the real rows only: padded rows carry whatever their buffers held
            now = checksums(pool, every)
            changed = (now != baseline).any(0).any(0)
            changed[torch.tensor([x - 1 for e in entries for x in e.tail], dtype=torch.long, device=changed.device)] = False
            totals["padding_corrupted_rows"] += int(changed.sum())
            eager = runner.forward_step(cap.batch, key.family.shape)  # same buffers and plan, not captured
            want = unpack_outputs(eager[0].cpu(), eager[1].cpu(), step, key.family.shape, cap.layout.tokens, cap.layout.batch)
            same = all(struct.pack(f"{len(a)}f", *a) == struct.pack(f"{len(b)}f", *b) for a, b in zip(got.gap, want.gap))
            same = same and (got.pred, got.near_tie, got.n_accepted, got.path, got.bonus) == (
                want.pred, want.near_tie, want.n_accepted, want.path, want.bonus)
            totals["replay_mismatches"] += 0 if same else 1
            plain = plain_step(engine, step, key, plain_engines)
            differ = [(i, j) for i, (pa, pb) in enumerate(zip(got.pred, plain.pred))
                      for j, (a, b) in enumerate(zip(pa, pb)) if a != b]
            for i, j in differ:  # the evidence, in the gate's log
                print(f"unpadded mismatch: {key.describe()} round {r} entry {i} row {j}: tokens {got.pred[i][j]} / "
                      f"{plain.pred[i][j]}, top-two gap {got.gap[i][j]:.6g} / {plain.gap[i][j]:.6g}, near tie "
                      f"{got.near_tie[i][j]} / {plain.near_tie[i][j]} (replay / unpadded)", file=sys.stderr, flush=True)
            totals["unpadded_mismatches"] += sum(not got.near_tie[i][j] for i, j in differ)  # a near tie of the replay apart
            totals["unpadded_mismatches_either_tie"] += sum(not (got.near_tie[i][j] or plain.near_tie[i][j]) for i, j in differ)
            totals["replays_checked"] += 1
            for req, e in zip(chosen, entries):
                pool.free(e.tail)
                host = pool.table.slots(req)[e.prefix_len : e.prefix_len + e.num_tokens]
                if host:  # the accepted slots the step wrote after the prefix
                    pool.table.rows[pool.table.row(req), e.prefix_len : e.prefix_len + len(host)] = torch.tensor(host, dtype=torch.int32)
            baseline = checksums(pool, every)  # the eager runs rewrote this round's new rows (the plain one from other sizes)
    for req in population:
        pool.release_request(req)
    return totals


def run(
    batch_sizes: list[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
    rounds: int = 20,
    preset: str = "gpu-h16",
    max_context: int = 131072,
    pool_slots: int = 600_000,
    greedy: dict | None = None,
    device: str | None = None,
    seed: int = 0,
) -> dict:
    """Run the gate; returns its metrics (see the module docstring). ``greedy``: keyword
    arguments of the speculative-decoding check (``phases.common.greedy.greedy_check``)."""
    dev = pick_device(device)
    cuda = dev.type == "cuda"
    t0 = time.perf_counter()
    model = random_model(preset, dev, torch.float32, seed)  # fp32 compute, bf16 pool: as the greedy gate
    pool = model.new_pool(pool_slots, torch.bfloat16, max_requests=max(batch_sizes), max_context=max_context + 128)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=torch.Generator().manual_seed(seed)).to(pool.kv.dtype)
                  if not cuda else torch.randn(pool.kv.shape, device=dev).to(pool.kv.dtype))
    engine = make_engine(model, pool, "kernel", TREE, cuda_graphs=True, graph_batch_sizes=tuple(batch_sizes),
                         capture_graphs=cuda)
    report, graphs = capture_report(engine), engine.runner.graphs
    captured = {k.batch for k in graphs.graphs}
    metrics = dict(uncaptured_batch_sizes=len(set(batch_sizes) - captured), capture_s=report.seconds,
                   graph_memory_mib=report.total_bytes / 2**20, buckets=len(set(batch_sizes)))
    print(f"captured {len(graphs.graphs)} graphs in {report.seconds:.1f} s", file=sys.stderr, flush=True)
    metrics.update(replay_rounds(engine, graphs, rounds, max_context, seed))
    metrics["leaked_slots"] = pool.leaked_slots() + pool.allocator.capacity - pool.allocator.num_free
    del engine, graphs, pool
    if cuda:
        torch.cuda.empty_cache()
    spec = dict(prompts=8, max_new_tokens=64, contexts=[4096, 32768], preset=preset, speculate=TREE, cuda_graphs=cuda)
    spec.update(greedy or {})
    if not cuda:
        spec.update(device="cpu")
    g = greedy_check(**spec)  # its own artifacts off: this gate writes its own
    metrics.update(mismatched_tokens=g["mismatched_tokens"], near_tie_divergences=g["near_tie_divergences"],
                   requests_failed=g["requests_failed"], tokens_compared=g["tokens_compared"],
                   accepted_per_step=g["accepted_per_step_kernel"])
    metrics["wall_s"] = time.perf_counter() - t0
    if gatekit:
        gatekit.write_artifact("capture.md", f"# Capture ({report.seconds:.1f} s)\n\n" + report.table() + "\n")
    return metrics


def main() -> None:
    main_with_json_args(run, __doc__)


if __name__ == "__main__":
    main()
