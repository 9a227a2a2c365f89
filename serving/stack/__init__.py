"""The serving stack put together: ``ServingConfig`` in, a ready engine out.

The top of the serving layers (``docs/ARCHITECTURE.md``): it imports the engine and both of
its wings, ``serving.graphs`` and ``serving.defrag``, which never import each other. The
command line (``serving.stack.cli``, ``python -m serving``), every gate and every test helper
build their engines here.
"""

from serving.stack.build import (
    ServingStack,
    build_backend,
    build_drafter,
    build_engine,
    build_pool,
)
from serving.stack.config import ServingConfig

__all__ = ["ServingConfig", "ServingStack", "build_backend", "build_drafter", "build_engine", "build_pool"]
