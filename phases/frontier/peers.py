"""Gate ``peers``: the kernel against FlashMLA and FlashInfer's MLA, timed beside it in this process.

The comparison of ``phases.kernel.bench.peers`` (decision of 2026-12-03, in the plan): 17 rows
(B=1 (H, T) in {(16,1), (128,1), (16,8), (128,8)} at 16k and 64k, the eight batched decode rows,
the ragged batch), one pool of 64-token pages that all three read, causal (the peers have no
tree mask), each call checked against the fp32 oracle, captured in a CUDA graph and replayed
``repetitions`` rounds of ``replays`` replays, the three interleaved, the L2 flushed before every
replay. A round gives one sample of best peer's time over the kernel's per row;
``min_peer_ratio_<class>`` (memory, mid, compute, decode, ragged) is the samples of the class's
row with the lowest median, judged on the interval of that median.

The peers are the ``peers`` extra (``sgl-flash-mla``, ``flashinfer-python``;
``phases/kernel/bench/peer_builds/`` carries them to a host without a package index): without
them the runner blocks the gate (``requires: module:flash_mla, module:flashinfer``), and run
standalone it raises naming them before anything is timed.

Metrics: ``min_peer_ratio_<class>``, ``peer_ratio_<row>`` (samples), ``peer_rows``,
``max_rel_err_peer_rows``, ``copy_bw_TBps`` and ``bf16_TFLOPs`` (the same run's ceilings),
``elapsed_s``. Artifacts: ``peers.json``, ``peers.md``.

Gate: ``call: phases.frontier.peers:run`` (CUDA, the peers installed).
Standalone: ``python -m phases.frontier.peers [--repetitions N] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from phases.common.roofline import measure_ceilings
from phases.kernel.bench.peers import (
    DEFAULT_REPETITIONS,
    DEFAULT_REPLAYS,
    PeerRow,
    load_peers,
    measure_peers,
    peer_shapes,
    peers_table,
    summarize_peers,
)
from runner import gatekit


def run(seed: int = 0, repetitions: int = DEFAULT_REPETITIONS, replays: int = DEFAULT_REPLAYS,
        artifacts_dir: str | None = None) -> dict:
    """Load the peers, measure the ceilings, then every row beside them; returns the metrics.

    artifacts_dir: where ``peers.json`` and ``peers.md`` go (None: the runner's artifacts)."""
    if not torch.cuda.is_available():
        raise RuntimeError("The peers gate needs a CUDA GPU (torch.cuda.is_available() is False)")
    device = torch.device("cuda")
    started = time.perf_counter()
    libs = load_peers(device)  # a missing peer raises before anything is timed
    ceilings = measure_ceilings(device)
    shapes = peer_shapes(seed)
    measured: list[PeerRow] = []

    def report(row: PeerRow) -> None:
        measured.append(row)
        gatekit.progress(len(measured), len(shapes))

    rows = measure_peers(shapes, ceilings, device, libs, repetitions=repetitions, replays=replays, on_row=report)
    metrics = summarize_peers(rows)
    metrics["copy_bw_TBps"] = round(ceilings.copy_bw_bytes_per_s / 1e12, 3)
    metrics["bf16_TFLOPs"] = round(ceilings.bf16_flops_per_s / 1e12, 1)
    table = peers_table(rows, libs.versions)
    device_info = {"name": torch.cuda.get_device_name(device), "peers": libs.versions}
    files = {"peers.json": json.dumps({"device": device_info, "ceilings": asdict(ceilings),
                                       "rows": [asdict(r) for r in rows]}, indent=1),
             "peers.md": table}
    for name, text in files.items():
        if artifacts_dir is None:
            gatekit.write_artifact(name, text)
        else:
            Path(artifacts_dir).mkdir(parents=True, exist_ok=True)
            (Path(artifacts_dir) / name).write_text(text)
    metrics["elapsed_s"] = round(time.perf_counter() - started, 2)
    print(table, flush=True)  # the gate's log keeps the table
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repetitions", type=int, default=DEFAULT_REPETITIONS, help="rounds (ratio samples per row)")
    parser.add_argument("--out", default=None, help="directory for peers.json and peers.md")
    args = parser.parse_args(argv)
    print(json.dumps(run(seed=args.seed, repetitions=args.repetitions, artifacts_dir=args.out), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
