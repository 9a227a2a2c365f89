"""``python -m serving ...``: the engine's command line (see ``serving.stack.cli``).

Without a CUDA GPU the Triton kernel runs in Triton's CPU interpreter, which must be chosen
before ``kernel`` is imported (as ``tests/conftest.py`` does).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from serving.stack.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
