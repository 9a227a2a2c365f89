"""Test-suite set-up shared by every test folder.

Without a CUDA GPU the Triton kernels run in Triton's CPU interpreter, which must be
chosen before ``triton`` decorates any kernel, hence here, before test modules import.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
