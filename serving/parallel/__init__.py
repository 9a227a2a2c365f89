"""Tensor parallelism: ``group`` (the ranks of one process group and their collectives) and
``sharding`` (which part of each checkpoint tensor a rank holds; pure arithmetic).

The launch under ``torchrun`` runs a whole engine per rank, so it lives above the engine
(``serving.engine.tp_launch``).
"""
