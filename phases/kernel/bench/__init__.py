"""The kernel phase's bench: what the gates and the tuning sweeps share.

- ``shapes``: the benchmark's (H, T) shapes and contexts, the ragged batch, the batched decode rows,
  and the class of a row (``bound_class``).
- ``cases``: seeded ``Case`` descriptions and ``build_inputs`` (the exact keyword arguments of
  ``kernel.mla_verify_attention``), plus the verify profiles.
- the roofline (same-run ceilings, bytes / FLOPs of one call) and the timing harness
  (``do_bench`` medians, CUDA-graph replay, CUDA-event timing after an explicit L2 flush, the
  planned serving-engine call) live in ``phases.common`` (``roofline``, ``kernel_timing``):
  phase ``defrag``'s benchmark times with them too.
- ``tune``: tile-configuration sweeps and the fixed-cost study (``python -m phases.kernel.bench.tune``).
- ``hopper_check``: the H200 check of the Hopper path's variants against the Triton path and the
  dispatched wrapper (``OUT=dir python -m phases.kernel.bench.hopper_check``).

The gates (``phases.kernel.build``, ``verify``, ``benchmark``, ``warmup``) import from here;
nothing here imports a gate.
"""
