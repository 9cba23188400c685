"""Facts about the machine a trial ran on, recorded in every summary.json.

A throughput figure means little without the CPU model, the core counts and the
library versions behind it; a memory peak means little without the memory (and
container limit) it had to fit in. Everything here is cheap and never raises:
a fact we cannot read is None.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from pathlib import Path
from typing import Any

LIBRARIES = ("numpy", "pyarrow", "psutil")


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def _physical_cores() -> int | None:
    """Physical cores, counted as ``psutil.cpu_count(logical=False)`` counts them on Linux
    (without importing psutil, ~25 ms of every trial runner's start): the distinct sibling
    lists in sysfs, else /proc/cpuinfo's cores per physical package."""
    import glob

    cpus = "/sys/devices/system/cpu/cpu[0-9]*/topology/"
    siblings = set()
    for path in glob.glob(cpus + "core_cpus_list") or glob.glob(cpus + "thread_siblings_list"):
        try:
            with open(path, "rb") as f:
                siblings.add(f.read().strip())
        except OSError:
            continue
    if siblings:
        return len(siblings)
    packages: dict[bytes, int] = {}
    current: dict[bytes, bytes] = {}
    try:
        with open("/proc/cpuinfo", "rb") as f:
            for line in [*f, b""]:  # a blank line ends each processor's section
                line = line.strip().lower()
                if not line:
                    if b"physical id" in current and b"cpu cores" in current:
                        packages[current[b"physical id"]] = int(current[b"cpu cores"])
                    current = {}
                elif line.startswith((b"physical id", b"cpu cores")):
                    key, _, value = line.partition(b":")
                    current[key.strip()] = value.strip()
    except (OSError, ValueError):
        return None
    return sum(packages.values()) or None


def _memory_total() -> int | None:
    """The host's memory in bytes (MemTotal, what ``psutil.virtual_memory().total`` reads)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_memory_limit() -> int | None:
    """The container's memory limit (cgroup v2 or v1), None when unlimited or unknown."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="ascii") as f:
                raw = f.read().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < 1 << 60:  # v1 reports "no limit" as a huge number
            return int(raw)
        return None
    return None


def library_versions() -> dict[str, str | None]:
    """The installed versions of LIBRARIES, without importing any of them.

    ``importlib.metadata`` would give the same answer, but importing it and scanning
    every distribution on sys.path cost ~0.1 s of every trial runner's start-up.
    """
    return {name: _version(name) for name in LIBRARIES}


def _version(name: str) -> str | None:
    module = sys.modules.get(name)
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version  # already imported: the very code that runs
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        # <site-packages>/<name>/__init__.py sits beside <name>-<version>.dist-info
        site = Path(spec.origin).parent.parent
        found = sorted(site.glob(f"{name}-*.dist-info"))
        if len(found) == 1:
            return found[0].name[len(name) + 1 : -len(".dist-info")]
    from importlib import metadata  # elsewhere (an egg, a zip): ask the slow way

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


_STATIC: dict[str, Any] | None = None  # the facts that do not change while a host is up


def _static_facts() -> dict[str, Any]:
    """The CPU, the memory, the platform and the libraries: read once a process. A warm
    runner (``workloads.warm``) reads them before it forks, so its trials do not read
    /proc/cpuinfo, sysfs and site-packages again (``benchmarks/bench_trial_cycle.py``,
    "set-up before the clock"); the forks run on the same host, with the libraries the
    server imported."""
    global _STATIC
    if _STATIC is None:
        try:
            from workloads import __version__ as workloads_version
        except ImportError:  # pragma: no cover - the package always has it
            workloads_version = None
        _STATIC = {
            "hostname": platform.node(),  # gethostname(), without importing socket
            "cpu_model": _cpu_model(),
            "cores_logical": os.cpu_count(),
            "cores_physical": _physical_cores(),
            "memory_bytes": _memory_total(),
            "platform": platform.platform(),
            "kernel": platform.release(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "libraries": library_versions(),
            "workloads_version": workloads_version,
        }
    return _STATIC


def host_facts() -> dict[str, Any]:
    """This process's host: the static facts, and what a process or its container may use
    now (its CPU affinity, its memory limit), read at each call."""
    try:
        available = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        available = os.cpu_count()
    static = _static_facts()
    facts = {key: static[key] for key in ("hostname", "cpu_model", "cores_logical",
                                          "cores_physical")}  # fmt: skip
    facts["cores_available"] = available  # affinity mask: what this process may use
    facts["memory_bytes"] = static["memory_bytes"]
    facts["cgroup_memory_limit_bytes"] = _cgroup_memory_limit()
    for key in ("platform", "kernel", "machine", "python"):
        facts[key] = static[key]
    facts["libraries"] = dict(static["libraries"])
    facts["workloads_version"] = static["workloads_version"]
    return facts
