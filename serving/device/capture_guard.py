"""Capturing a CUDA graph without Python's cycle collector running inside it.

A dead object's CUDA graph, pinned buffer or event freed by the cycle collector while a stream
captures invalidates the capture (``cudaErrorStreamCaptureInvalidated``, after "operation not
permitted when stream is capturing" from ``CUDAGraph::reset``); torch no longer collects on
entering ``torch.cuda.graph``. Seen on an H200 in the ``decode-speed`` gate, which drops an engine
with its graphs before building the next: the collector fired inside a later capture, at a
context that depended on how many objects the run had allocated.

It sits in the engine layer because both wings capture graphs: ``serving.graphs`` its steps,
``serving.defrag`` its row moves; neither imports the other.
"""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def collected_before_capture():
    """Collect garbage now, then keep the cycle collector off until the block ends (restored as it
    was): nothing a dead object owns is freed mid-capture. Reference counting still frees acyclic
    garbage at once, as it would anyway."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
