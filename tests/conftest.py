"""Test-suite set-up shared by every test folder.

Without a CUDA GPU the Triton kernels run in Triton's CPU interpreter, which must be
chosen before ``triton`` decorates any kernel, hence here, before test modules import.
torch is imported only where it is installed: the runner's tests (``tests/runner/``) also run
on an install that holds the runner alone.
"""

import importlib.util
import os

if importlib.util.find_spec("torch") is not None:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
