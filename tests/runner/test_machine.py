"""Machine description: the probe, the device override and the comparability fingerprint."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from runner.records import machine
from runner.records.machine import MachineInfo, parse_devices, probe_machine

BASE = dict(hostname="gpu-host-1", platform="Linux-x", arch="x86_64", python="3.11.7",
            cpu_count=16, devices=["cpu", "cuda"], gpu_name="NVIDIA H200", gpu_count=1,
            driver="550.54", cuda="12.4", torch="2.5.1", triton="3.1.0")


@pytest.fixture(autouse=True)
def fresh_cache():
    machine._cached_probe.cache_clear()
    yield
    machine._cached_probe.cache_clear()


@pytest.mark.parametrize(
    ("text", "expected"),
    [(None, None), ("", None), (" ", None), ("cuda", ["cpu", "cuda"]),
     ("CUDA, cpu,,cuda", ["cpu", "cuda"]), ("cpu", ["cpu"])],
)
def test_parse_devices(text, expected):
    assert parse_devices(text) == expected


def test_fingerprint_ignores_host_but_not_the_stack():
    base = MachineInfo(**BASE)
    assert base.fingerprint.startswith("sha256:")
    assert MachineInfo(**BASE | {"hostname": "gpu-host-2", "cpu_count": 8}).fingerprint == base.fingerprint
    for field, value in [("gpu_name", "NVIDIA A100"), ("gpu_count", 2), ("driver", "560.1"),
                         ("cuda", "12.6"), ("torch", "2.6.0"), ("triton", None), ("arch", "aarch64")]:
        assert MachineInfo(**BASE | {field: value}).fingerprint != base.fingerprint, field


def test_probe_survives_a_broken_interpreter(tmp_path):
    info = machine._probe(python=str(tmp_path / "no-python"), timeout_s=5)
    assert info.devices == ["cpu"]
    assert info.torch is None and info.gpu_count == 0 and info.driver is None
    crashing = tmp_path / "crash.sh"
    crashing.write_text("#!/bin/sh\nkill -SEGV $$\n")
    crashing.chmod(0o755)
    assert machine._probe(python=str(crashing), timeout_s=5).devices == ["cpu"]


def test_probe_times_out(tmp_path):
    slow = tmp_path / "slow.sh"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    assert machine._probe(python=str(slow), timeout_s=0.5).torch is None


def test_probe_real_machine_cached_and_overridden(monkeypatch):
    monkeypatch.delenv("RUNNER_DEVICES", raising=False)
    info = probe_machine()
    assert "cpu" in info.devices and info.devices == sorted(info.devices)
    assert info.python == ".".join(map(str, sys.version_info[:3]))
    # versions of the packages this interpreter has, and nothing for those it lacks
    assert (info.torch is not None) == (importlib.util.find_spec("torch") is not None)
    if "cuda" not in info.devices:
        assert info.gpu_name is None or info.gpu_count >= 0
    assert probe_machine() is info  # cached
    monkeypatch.setenv("RUNNER_DEVICES", "cuda")
    forced = probe_machine()
    assert forced.devices == ["cpu", "cuda"]
    monkeypatch.setenv("RUNNER_DEVICES", "cpu")
    assert probe_machine().devices == ["cpu"]
    assert machine._cached_probe.cache_info().misses == 1


def test_probe_without_torch_reports_no_torch(tmp_path):
    bare = tmp_path / "bare-python"  # the same interpreter without site-packages: no torch, no triton
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    info = machine._probe(python=str(bare), timeout_s=30)
    assert (info.torch, info.triton, info.cuda, info.devices) == (None, None, None, ["cpu"])
    assert "torch" not in info.software() and "triton" not in info.software()
    assert info.software() == f"python {info.python}"


def test_software_lists_only_what_is_installed():
    assert MachineInfo(**BASE).software() == "python 3.11.7, torch 2.5.1, triton 3.1.0, CUDA 12.4, driver 550.54"
    bare = MachineInfo(**BASE | {"torch": None, "triton": None, "cuda": None, "driver": None})
    assert bare.software() == "python 3.11.7"


def test_without_torch_the_gpus_nvidia_smi_lists_decide_cuda(tmp_path, monkeypatch):
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    tools = tmp_path / "bin"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf 'NVIDIA H200, 570.1\\nNVIDIA H200, 570.1\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    info = machine._probe(python=str(bare), timeout_s=30)
    assert info.devices == ["cpu", "cuda"] and info.torch is None
    assert (info.gpu_name, info.gpu_count, info.driver) == ("NVIDIA H200", 2, "570.1")
    smi.write_text("#!/bin/sh\nexit 9\n")
    assert machine._probe(python=str(bare), timeout_s=30).devices == ["cpu"]
