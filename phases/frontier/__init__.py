"""Phase ``frontier``: the project against the state of the art and the hardware's limits.

Its gates measure the other phases' code (``peers``: the kernel against FlashMLA and
FlashInfer; ``end-to-end`` and ``end-to-end-fp8``: a decode step against its streaming limit;
``mtp-tree``: MTP tree speculation against plain decoding), so this phase may import their gate
code; no phase imports this one (``tests/test_layers.py``).
"""
