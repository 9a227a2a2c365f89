"""Attention: ``backends`` (the kernel and reference backends of decode and verify steps,
shaped like SGLang's ``AttentionBackend``), ``dense`` (the portable float32 path) and
``prefill`` (causal prefill over a prefix with no mask tensor).

Below ``model``: the model calls its backend, as SGLang's ``models/`` call ``layers/attention``.
"""
