"""Phase ``cudagraph``: the engine's decode / verify / draft steps captured in CUDA graphs.

``CudaGraphRunner`` captures ``ModelRunner.forward_step`` once per bucket (batch size x widest
entry) into static buffers and replays it with new lengths, trees and slots (re-planned, never
recaptured); ``buckets`` holds the pure part (which steps a bucket serves, its buffer sizes,
padding), tested on the CPU. ``CudaGraphs`` is the replay factory a ``ModelRunner`` is built
with (``serving.stack`` does that); the runner owns what it captures.
"""

from serving.graphs.buckets import (
           DEFAULT_BATCH_SIZES,
           GraphKey,
           StepFamily,
           families_for,
)
from serving.graphs.runner import CaptureReport, CudaGraphRunner, CudaGraphs

__all__ = ["DEFAULT_BATCH_SIZES", "GraphKey", "StepFamily", "families_for", "CaptureReport", "CudaGraphRunner",
           "CudaGraphs"]
