"""A model that has learnt something, made here: ``python -m serving.demo train --out DIR``.

The trainer (``train``) uses transformers and PyTorch; the engine never imports this package.
"""
