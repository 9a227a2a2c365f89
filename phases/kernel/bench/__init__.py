"""The kernel phase's bench: what the gates and the tuning sweeps share.

- ``shapes``: the benchmark's (H, T) shapes and contexts, the ragged batch, the batched decode rows,
  the rows timed beside the peers, and the classes of a row (``bound_class``).
- ``cases``: seeded ``Case`` descriptions and ``build_inputs`` (the exact keyword arguments of
  ``kernel.mla_verify_attention``), plus the verify profiles.
- the roofline (same-run ceilings, bytes / FLOPs of one call) and the timing harness
  (``do_bench`` medians, CUDA-graph replay, CUDA-event timing after an explicit L2 flush, the
  planned serving-engine call) live in ``phases.common`` (``roofline``, ``kernel_timing``):
  phase ``defrag``'s benchmark times with them too.
- ``peers``: FlashMLA and FlashInfer's MLA timed beside the kernel on the same pages, by one
  method (the benchmark gate's ``min_peer_ratio_<class>``); the peers are imported only there.
  ``peer_builds/``: getting their builds onto a GPU host that has no package index.
- ``tune``: tile-configuration sweeps and the fixed-cost study (``python -m phases.kernel.bench.tune``).
- ``hopper_check``: the H200 check of the Hopper path's variants against the Triton path and the
  dispatched wrapper (``OUT=dir python -m phases.kernel.bench.hopper_check``).

The gates (``phases.kernel.build``, ``verify``, ``benchmark``, ``warmup``) import from here;
nothing here imports a gate.
"""
