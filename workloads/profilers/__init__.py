"""Profiler drivers: why a trial scales as it does (py-spy) and where its peak comes from (memray).

``get_profiler(kind)`` imports the driver only when asked, so a trial without
``--profile`` never loads memray or looks for py-spy, nor ``base`` (dataclasses,
ctypes), whose names this package re-exports on first use (PEP 562). Every driver
follows ``base.Profiler``: ``start`` before the timed part of the trial, ``stop`` after,
and ``stop`` returns the ``profile`` section of summary.json. A driver that
cannot run raises ``ProfilerUnavailable`` with one line saying why; the trial
runs anyway and the summary carries that line.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workloads.profilers.base import Profiler, ProfilerUnavailable, Target, allow_tracing_by

_FROM_BASE = frozenset({"Profiler", "ProfilerUnavailable", "Target", "allow_tracing_by"})


def __getattr__(name: str) -> Any:
    """``Profiler``, ``Target``... from ``base``, imported when first asked for."""
    if name in _FROM_BASE:
        from workloads.profilers import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


KINDS = {
    "cpu": "workloads.profilers.pyspy:PySpyProfiler",
    "gil": "workloads.profilers.pyspy:NativePySpyProfiler",
    "memory": "workloads.profilers.memray:MemrayProfiler",
}
# Kinds that watch a workload's whole process, from before ``prepare()``: loading the
# inputs is often the memory peak. CPU shares stay about the timed part (the scaling).
LIFETIME = frozenset({"memory"})

__all__ = [
    "KINDS",
    "Profiler",
    "ProfilerUnavailable",
    "Target",
    "allow_tracing_by",
    "finish_profile",
    "get_profiler",
    "start_lifetime_profile", "start_profile", "steady_state_begins", "wrap_command",
]  # fmt: skip


def get_profiler(kind: str) -> Profiler:
    """A fresh driver for ``kind`` (one of KINDS); ValueError for any other name."""
    try:
        target = KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown profile {kind!r} (choose from {', '.join(KINDS)})") from None
    module, _, cls = target.partition(":")
    profiler: Profiler = getattr(importlib.import_module(module), cls)()
    return profiler


def wrap_command(kind: str | None, command: list[str], out: Path,
                 env: Mapping[str, str] | None = None) -> list[str]:
    """A ``--command``'s argv, run under the profiler where that is how it profiles (memray);
    ``env`` is the one the command runs with (its PATH finds its ``python``)."""
    if kind != "memory":
        return command
    from workloads.profilers.memray import wrap_python_command

    return wrap_python_command(command, out, env)


def start_profile(kind: str | None, out: Path, target: Target) -> Profiler | dict[str, Any] | None:
    """Start ``kind``'s profiler for a trial: the driver, or the summary section saying why not.

    Never raises for a profiler that cannot run: the trial goes on without a
    profile, and the one line why is printed on stderr and kept in the summary.
    """
    if kind is None:
        return None
    from workloads.profilers.base import ProfilerUnavailable

    profiler = get_profiler(kind)
    try:
        profiler.start(out, target)
        if profiler.activate is not None:
            profiler.activate()
    except ProfilerUnavailable as exc:
        return _unavailable(profiler, str(exc))
    except Exception as exc:  # e.g. a memray Tracker already active in this process
        return _unavailable(profiler, f"{profiler.tool} cannot track this process: {exc}")
    return profiler


def start_lifetime_profile(kind: str | None, out: Path) -> Profiler | dict[str, Any] | None:
    """For a workload: start ``kind`` now if it covers the whole process (see LIFETIME), else None.

    The runner calls this before loading the workload and ``start_profile`` for
    the other kinds at the timed part; either way ``finish_profile`` ends it.
    """
    if kind not in LIFETIME:
        return None
    from workloads.profilers.base import ProfilerUnavailable, Target

    # Not through start_profile: memray's Python stacks lose one outer frame for every
    # frame that returns between its activation and the caller (seen with memray 1.20),
    # so the tracker is entered here, one call below the runner that then calls prepare().
    profiler = get_profiler(kind)
    try:
        profiler.start(out, Target(os.getpid(), in_process=True))
        if profiler.activate is not None:
            profiler.activate()
    except ProfilerUnavailable as exc:
        return _unavailable(profiler, str(exc))
    except Exception as exc:
        return _unavailable(profiler, f"{profiler.tool} cannot track this process: {exc}")
    return profiler


def steady_state_begins(started: Profiler | dict[str, Any] | None) -> None:
    """Tell a running profiler the timed part starts now (what grew is counted from here)."""
    if started is not None and not isinstance(started, dict):  # a running Profiler
        started.steady_state_begins()


def finish_profile(started: Profiler | dict[str, Any] | None) -> dict[str, Any] | None:
    """Stop a profiler from ``start_profile``; its summary section (or why there is none)."""
    if started is None or isinstance(started, dict):
        return started
    from workloads.profilers.base import ProfilerUnavailable

    try:
        section = started.stop()
    except ProfilerUnavailable as exc:
        return _unavailable(started, str(exc))
    except Exception as exc:  # a parser bug must not cost the trial its measurements
        section = _unavailable(started, f"{type(exc).__name__}: {exc}")
        section["status"] = "failed"
        return section
    section.setdefault("kind", started.kind)
    section.setdefault("tool", started.tool)
    section["status"] = "ok"
    section["reason"] = None
    return section


def _unavailable(profiler: Profiler, reason: str) -> dict[str, Any]:
    line = " ".join(reason.split())
    print(f"warning: no {profiler.kind} profile: {line}", file=sys.stderr, flush=True)
    return {"kind": profiler.kind, "tool": profiler.tool, "status": "unavailable",
            "reason": line, "files": []}  # fmt: skip
