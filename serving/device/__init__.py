"""The device the engine runs on: ``select`` (device and dtype from the command line's names),
``timing`` (CUDA-event and wall-clock timers) and ``capture_guard`` (CUDA graph capture
without the cycle collector inside it).

The base of the serving rooms: imports nothing of ``serving``.
"""
