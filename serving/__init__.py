"""Serving engine for DeepSeek-V3-family models over the MLA verify kernel.

Rooms, from the base up (a room imports only rooms below it; ``tests/test_layers.py``):

- ``configs`` (the checkpoint's ``config.json`` and ``quantization_config``) and ``device``
  (device and dtype choice, timers, the capture guard);
- ``quant`` (block-FP8 weights and the GEMMs), ``kv`` (the page_size=1 pool, a step's batch
  and shape), ``parallel`` (tensor-parallel groups and sharding) and ``sampling`` (a request's
  sampling parameters, counter-based draws and the on-device sampler);
- ``attention`` (the decode / verify backends and prefill attention);
- ``model`` (DeepSeek-V3's forward, weights, presets, memory limits, loading);
- ``speculation`` (draft trees, drafters, acceptance: greedy, or speculative sampling);
- ``engine`` (the generation loop and the model runner);
- ``graphs`` and ``defrag`` (CUDA graph capture, KV defragmentation);
- ``stack`` (the one builder, the command line, the profiler) and ``demo`` (a trained model).
"""
