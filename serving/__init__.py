"""Serving engine for DeepSeek-V3-family models over the MLA verify kernel.

Subpackages, one per phase: ``serving.engine`` (model, KV pool, attention backends,
tree speculative decoding, the ``generate`` command).
"""
