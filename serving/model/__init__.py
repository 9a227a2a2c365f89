"""DeepSeek-V3: ``deepseek_v3`` (the forward over a ``ForwardBatch`` and a KV pool), ``rope``,
``fused`` (RMSNorm and rope kernels), ``weights`` (a checkpoint read into one dict),
``sharded_weights`` (one rank's slices of it), ``presets`` (seeded random models), ``limits``
(what the engine will allocate, checked before it does) and ``loading`` (a model from a folder
or a preset, memory checked first).
"""
