"""The device and dtype a command or gate runs on, from their names on the command line.

One place for both: ``DTYPES`` (``--dtype`` names) and ``pick_device`` (a name, else CUDA when
there is one), with ``resolve_device`` refusing a device this machine does not have.
"""

from __future__ import annotations

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def pick_device(name: str | None = None) -> torch.device:
    """``name`` as a torch.device, else ``cuda`` when a GPU is visible, else ``cpu`` (unchecked)."""
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def resolve_device(name: str | None, flag: str = "--device") -> torch.device:
    """``pick_device(name)``, refused (``ValueError`` naming ``flag``) when it is not cpu, cuda or
    cuda:N, or is a GPU this machine does not have."""
    if name is None:
        return pick_device()
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"Expected {flag} cpu, cuda or cuda:N, got {name!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = f"torch {torch.__version__} is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ValueError(f"Expected a CUDA GPU for {flag} {name}, got none ({why}); use {flag} cpu")
        if (device.index or 0) >= torch.cuda.device_count():
            raise ValueError(f"Expected {flag} cuda:N with N < {torch.cuda.device_count()}, got {name!r}")
    return device


def default_dtype(device: torch.device) -> torch.dtype:
    """The model dtype when none is named: bf16 on CUDA, fp32 on the CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32
