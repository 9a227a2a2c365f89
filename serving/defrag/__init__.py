"""KV defragmentation for the page_size=1 pool (phase ``defrag``): measure fragmentation, plan
the fewest row moves that make requests contiguous, apply them between engine steps.

- ``measure``: runs per 1k tokens per request, leading runs, free-run histogram.
- ``planner``: ``plan_compaction`` (pure: host lists in, ordered moves out), ``simulate``.
- ``executor``: ``Compaction`` applies a plan to a ``KVPool`` a budget at a time, atomically per piece.
- ``policy``: ``DefragPolicy`` and ``Defragmenter``, the engine's between-steps hook
  (``serving.stack`` builds it into the engine).
"""

from serving.defrag.executor import Compaction
from serving.defrag.measure import PoolFragmentation, RunTracker, measure, measure_pool
from serving.defrag.planner import MovePlan, plan_compaction, simulate
from serving.defrag.policy import Defragmenter, DefragPolicy

__all__ = [
    "Compaction",
    "DefragPolicy",
    "Defragmenter",
    "MovePlan",
    "PoolFragmentation",
    "RunTracker",
    "measure",
    "measure_pool",
    "plan_compaction",
    "simulate",
]
