"""What a checkpoint says it is: ``model`` (``config.json`` as ``ModelConfig``, end-of-sequence
ids) and ``quantization`` (``quantization_config`` and which tensors may be FP8).

The base of the serving rooms: imports nothing of ``serving``.
"""
