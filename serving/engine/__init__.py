"""The engine: ``engine`` (the generation loop: chunked prefill, then plain decode or
tree-speculative verify steps), ``model_runner`` (the seam between the engine and the model)
and ``tp_launch`` (``torchrun``: every rank runs the same engine over its shards).
"""

from serving.engine.engine import Engine, Request

__all__ = ["Engine", "Request"]
