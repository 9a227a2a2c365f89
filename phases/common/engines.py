"""What the serving gates share: engines built through ``serving.stack``, long shared contexts,
the gates' small command-line and report helpers.

This is the one place gate code of several phases shares (``phases/common``); no phase imports
another phase's modules (``tests/test_layers.py``).
"""

from __future__ import annotations

from phases.common.samples import table_value
from serving.engine.engine import Engine, Request
from serving.graphs import DEFAULT_BATCH_SIZES, CaptureReport
from serving.kv.pool import KVPool
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.stack import ServingConfig, build_engine


def metrics_table(metrics: dict) -> str:
    """A gate's metrics as a Markdown table (a report artifact); samples as their median."""
    lines = [f"| {k} | {table_value(v)} |" for k, v in sorted(metrics.items())]
    return "| metric | value |\n|---|---|\n" + "\n".join(lines) + "\n"


def main_with_json_args(run, doc: str) -> None:
    """``python -m <gate> --args '{...}'``: run the gate with those keyword arguments and print its metrics."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--args", default="{}", help="JSON keyword arguments for run()")
    print(json.dumps(run(**json.loads(parser.parse_args().args)), indent=1))


def make_engine(model: DeepseekV3Model, pool: KVPool, backend: str, speculate: str | None, cuda_graphs: bool = False,
                graph_batch_sizes=None, **engine_options) -> Engine:
    """An engine over ``pool`` (shared with other engines of the gate), built by
    ``serving.stack.build_engine``; ``cuda_graphs``: its runner captures its steps first (kernel
    backend, CUDA); ``engine_options``: more ``ServingConfig`` fields (prefill_chunk,
    record_margins, profile, pinned_tiles, capture_graphs)."""
    config = ServingConfig(backend=backend, speculate=speculate, pool_slots=pool.num_slots, cuda_graphs=cuda_graphs,
                           graph_batch_sizes=tuple(graph_batch_sizes or DEFAULT_BATCH_SIZES), **engine_options)
    return build_engine(config, model, pool).engine


def capture_report(engine: Engine) -> CaptureReport:
    """What capturing ``engine``'s graphs cost (its runner owns them)."""
    if engine.runner.graphs is None:
        raise ValueError("Expected an engine built with cuda_graphs, got one without graphs")
    return engine.runner.graphs.report


class SharedContext:
    """A long random prefix prefilled once; requests start from a copy of its rows.

    Building a 128k context per request would dominate a gate's time; copying rows is a
    device memcpy. The prefix's own request holds its slots until ``release``.
    """

    def __init__(self, engine: Engine, tokens: list[int], progress=None) -> None:
        self.engine = engine
        self.tokens = tokens
        self.holder = engine.add_request(tokens, 2)  # prefill emits one token; the rows stay cached
        engine.prefill(self.holder, progress)
        if self.holder.error:
            raise RuntimeError(f"prefill of the shared context failed: {self.holder.error}")

    @property
    def slots(self) -> list[int]:
        return self.engine.pool.table.slots(self.holder.req_id)

    def start(self, engine: Engine, suffix: list[int], max_new_tokens: int) -> Request:
        """A request whose prompt is the shared prefix + ``suffix``, its prefix rows copied."""
        req = engine.add_request(self.tokens + suffix, max_new_tokens)
        engine.fork_prefix(req, self.slots)
        return req

    def release(self) -> None:
        self.engine.pool.release_request(self.holder.req_id)
