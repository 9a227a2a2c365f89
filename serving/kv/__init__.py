"""The KV cache and what a step reads of it: ``pool`` (one latent row per token slot,
page_size=1, the allocator and slot table), ``indices`` (a step's ``kv_indices`` built on the
device) and ``batch`` (``StepBatch``, ``StepShape``, ``ForwardBatch``: the step shape every
room above shares).
"""
