"""What machine a run happened on, and whether two machines' timings are comparable.

Decisions:

- Nothing here imports torch or triton into the runner. Package versions come from the
  installed distributions' metadata (``importlib.metadata``), read by a small child interpreter
  (``sys.executable -c ...``), so a project without torch pays nothing and reports nothing.
- CUDA is asked only where it can answer: when torch is installed *and* an NVIDIA driver is
  present (``/proc/driver/nvidia/version`` or ``nvidia-smi``). Only then does the child import
  torch and allocate one element on the GPU, which decides the ``cuda`` device. A broken CUDA
  stack, a driver hang or a segfault in an extension is a missing field in the record, never
  a crash of the runner.
- Without torch (a project whose gates use CUDA some other way), the GPUs ``nvidia-smi``
  lists decide the ``cuda`` device, with their name and driver.
- The CUDA version torch was built for is read from torch's ``version.py`` source, without
  importing torch.
- The probe runs only in commands that run gates (``gate``, ``advance``) and is cached for the
  life of the process.

``RUNNER_DEVICES`` (a comma list such as ``cpu,cuda``) overrides the detected devices; it is
read on every call, so tests and operators can force a device set after the first probe.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys

from pydantic import BaseModel, ConfigDict, field_validator

from runner.formatting import CONTROL_CHARS, one_line

DEVICES_ENV = "RUNNER_DEVICES"

# Runs in a child interpreter; prints one JSON object on its last stdout line.
_PROBE_SCRIPT = r"""
import ast, importlib.metadata, importlib.util, json, os, shutil

def version(name):
    try:
        if importlib.util.find_spec(name) is None:
            return None
        return importlib.metadata.version(name).split("+")[0]
    except Exception:
        return None

def built_cuda():
    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            tree = ast.parse(open(os.path.join(folder, "version.py"), encoding="utf-8").read())
        except Exception:
            continue
        for node in tree.body:
            target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
            if getattr(target, "id", None) == "cuda" and isinstance(node.value, ast.Constant):
                return node.value.value
    return None

info = {"torch": version("torch"), "triton": version("triton"), "cuda": None, "gpu_name": None,
        "gpu_count": 0, "cuda_usable": False}
driver = os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None
if info["torch"] is not None:
    info["cuda"] = built_cuda()
    if driver:
        try:  # in the probe's own child process only; the runner never imports torch
            torch = importlib.import_module("torch")
            info["cuda"] = torch.version.cuda
            if torch.cuda.is_available():
                info["gpu_count"] = torch.cuda.device_count()
                info["gpu_name"] = torch.cuda.get_device_name(0)
                torch.zeros(1, device="cuda").add_(1)
                torch.cuda.synchronize()
                info["cuda_usable"] = True
        except Exception:
            pass
print(json.dumps(info))
"""

# Fields that decide whether two machines' timings can be compared (not the host name:
# GPU hosts are leased fresh each time, so the same hardware shows up under new names).
_COMPARABLE_FIELDS = ("gpu_name", "gpu_count", "driver", "cuda", "torch", "triton", "arch")


class MachineInfo(BaseModel):
    """The machine a run happened on.

    ``platform`` is ``platform.platform()`` (kernel and libc, informational) and ``arch`` is
    ``platform.machine()`` (``x86_64``, ``aarch64``). ``devices`` is sorted and always holds
    ``"cpu"``; it holds ``"cuda"`` when a CUDA GPU answered a tiny allocation. Versions are
    ``None`` when the package is absent.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("hostname", "platform", "arch", "python", "gpu_name", "driver", "cuda", "torch", "triton",
                     "devices")
    @classmethod
    def _plain(cls, value: object) -> object:
        """No control characters: a machine read from a results file (written anywhere) is printed
        by the views and written into commit messages."""
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and CONTROL_CHARS.search(text):
                raise ValueError(f"holds a control character (a line break or a terminal escape): "
                                 f"{one_line(text)[:60]}")
        return value

    hostname: str
    platform: str
    arch: str
    python: str
    cpu_count: int
    devices: list[str]
    gpu_name: str | None = None
    gpu_count: int = 0
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    triton: str | None = None

    @property
    def fingerprint(self) -> str:
        """``"sha256:<hex>"`` over the fields that make timings comparable (not the host)."""
        fields = {name: getattr(self, name) for name in _COMPARABLE_FIELDS}
        blob = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()

    def software(self) -> str:
        """``python 3.11.7, torch 2.5.1, CUDA 12.4``: only the parts this machine has."""
        parts = [f"python {self.python}"]
        for label, value in (("torch", self.torch), ("triton", self.triton), ("CUDA", self.cuda),
                             ("driver", self.driver)):
            if value:
                parts.append(f"{label} {value}")
        return ", ".join(parts)


def probe_machine(timeout_s: float = 60) -> MachineInfo:
    """Describe this machine; the probe runs once per process, ``RUNNER_DEVICES`` every call."""
    info = _cached_probe(timeout_s)
    override = parse_devices(os.environ.get(DEVICES_ENV))
    if override is not None:
        info = info.model_copy(update={"devices": override})
    return info


def parse_devices(text: str | None) -> list[str] | None:
    """Parse a ``RUNNER_DEVICES`` value: sorted, de-duplicated, always with ``cpu``.

    Returns ``None`` when ``text`` is ``None`` or blank (no override).
    """
    if text is None or not text.strip():
        return None
    names = {part.strip().lower() for part in text.split(",") if part.strip()}
    return sorted(names | {"cpu"})


@functools.lru_cache(maxsize=None)
def _cached_probe(timeout_s: float) -> MachineInfo:
    return _probe(python=sys.executable, timeout_s=timeout_s)


def _probe(*, python: str, timeout_s: float) -> MachineInfo:
    """Build a ``MachineInfo`` by running the probe under ``python``; never raises."""
    found = _run_probe_script(python, timeout_s)
    if found.get("torch") is None:
        gpus = _nvidia_gpus()
        if gpus:
            found = {**found, "cuda_usable": True, "gpu_count": len(gpus), "gpu_name": gpus[0][0]}
    devices = ["cpu", "cuda"] if found.get("cuda_usable") else ["cpu"]
    return MachineInfo(
        hostname=socket.gethostname(),
        platform=platform.platform(),
        arch=platform.machine(),
        python=platform.python_version(),
        cpu_count=os.cpu_count() or 1,
        devices=devices,
        gpu_name=_str_or_none(found.get("gpu_name")),
        gpu_count=int(found.get("gpu_count") or 0),
        driver=_nvidia_driver() if found.get("gpu_count") else None,
        cuda=_str_or_none(found.get("cuda")),
        torch=_str_or_none(found.get("torch")),
        triton=_str_or_none(found.get("triton")),
    )


def child_json(argv: list[str], timeout_s: float, *, cwd=None, env=None):
    """The JSON value on the last stdout line of ``argv`` run as a child (no stdin), or None when
    it cannot start, times out, exits non-zero, prints nothing or prints no JSON there."""
    try:
        proc = subprocess.run(argv, cwd=cwd, env=None if env is None else dict(env), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return None
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        return None


def _run_probe_script(python: str, timeout_s: float) -> dict:
    found = child_json([python, "-c", _PROBE_SCRIPT], timeout_s)
    return found if isinstance(found, dict) else {}


def _nvidia_driver() -> str | None:
    gpus = _nvidia_gpus()
    return gpus[0][1] if gpus else None


def _nvidia_gpus() -> list[tuple[str, str | None]]:
    """``(name, driver)`` of every GPU ``nvidia-smi`` lists; ``[]`` without it or on any error."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if proc.returncode != 0:
        return []
    gpus = []
    for line in proc.stdout.strip().splitlines():
        name, _, driver = line.rpartition(",")
        if name.strip():
            gpus.append((name.strip(), driver.strip() or None))
    return gpus


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)
