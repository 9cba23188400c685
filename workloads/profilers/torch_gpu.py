"""PyTorch's CUDA allocator peak for a trial (seed: Pytorch-Memory-Utils), with no code change.

NVML (the agent's sampler) sees what the driver gave each process, CUDA context
and allocator cache included; the allocator's ``max_memory_allocated`` is what
the job's tensors needed at most. Both go into summary.json's ``gpu``.

* A workload runs in the runner's process: ``torch_peak_in_process`` asks torch
  directly, if the job imported it and used CUDA (never imports torch itself).
* A ``--command`` gets an environment hook on machines with an NVIDIA driver:
  ``hook/sitecustomize.py`` first on its PYTHONPATH, which writes the peak
  to a file in the trial's directory twice a second and at exit (a command
  stopped by SIGTERM at the end of its duration still leaves its last figure).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

PEAK_FILE = "torch_gpu_peak.json"
ENV_FILE = "CLOUDPROF_TORCH_PEAK_FILE"
DRIVER_NODES = ("/dev/nvidiactl", "/proc/driver/nvidia/version")  # an NVIDIA driver is loaded


def torch_peak_in_process() -> int | None:
    """The CUDA allocator's peak over all devices, bytes; None if torch/CUDA was not used."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        devices = range(torch.cuda.device_count())
        return sum(int(torch.cuda.max_memory_allocated(d)) for d in devices)
    except Exception:  # a torch without CUDA support, a broken driver
        return None


def hook_env(
    env: Mapping[str, str], out: Path, driver_nodes: tuple[str, ...] = DRIVER_NODES
) -> dict[str, str]:
    """``env`` for a command, with the hook on PYTHONPATH where there is an NVIDIA driver."""
    new = dict(env)
    if not any(os.path.exists(node) for node in driver_nodes):
        return new
    from workloads.profilers.hook import with_hook

    out.mkdir(parents=True, exist_ok=True)  # the command runs before the runner writes there
    new = with_hook(new)
    new[ENV_FILE] = str(out / PEAK_FILE)
    return new


def read_hook_peak(out: Path) -> int | None:
    """The peak the hook wrote for a command, or None (no torch, no CUDA, no hook)."""
    try:
        return int(json.loads((out / PEAK_FILE).read_text())["max_memory_allocated_bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def merge_into(gpu: dict | None, torch_peak: int | None) -> dict | None:
    """summary.json's ``gpu`` with the allocator's peak; NVML's figures stay the headline."""
    if torch_peak is None:
        return gpu
    merged = dict(gpu or {})
    merged["torch_peak_allocated_bytes"] = torch_peak
    if merged.get("peak_mem_bytes") is None:
        merged["peak_mem_bytes"] = torch_peak
        merged["peak_source"] = "PyTorch allocator (max_memory_allocated)"
    return merged
