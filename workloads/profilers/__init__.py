"""Profiler drivers: why a trial scales as it does (py-spy) and where its peak comes from (memray).

``get_profiler(kind)`` imports the driver only when asked, so a trial without
``--profile`` never loads memray or looks for py-spy. Every driver follows
``base.Profiler``: ``start`` before the timed part of the trial, ``stop`` after,
and ``stop`` returns the ``profile`` section of summary.json. A driver that
cannot run raises ``ProfilerUnavailable`` with one line saying why; the trial
runs anyway and the summary carries that line.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from workloads.profilers.base import Profiler, ProfilerUnavailable, Target, allow_tracing_by

KINDS = {
    "cpu": "workloads.profilers.pyspy:PySpyProfiler",
    "memory": "workloads.profilers.memray:MemrayProfiler",
}

__all__ = [
    "KINDS",
    "Profiler",
    "ProfilerUnavailable",
    "Target",
    "allow_tracing_by",
    "finish_profile",
    "get_profiler",
    "start_profile", "wrap_command",
]  # fmt: skip


def get_profiler(kind: str) -> Profiler:
    """A fresh driver for ``kind`` ("cpu" or "memory"); ValueError for any other name."""
    try:
        target = KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown profile {kind!r} (choose from {', '.join(KINDS)})") from None
    module, _, cls = target.partition(":")
    profiler: Profiler = getattr(importlib.import_module(module), cls)()
    return profiler


def wrap_command(kind: str | None, command: list[str], out: Path) -> list[str]:
    """A ``--command``'s argv, run under the profiler where that is how it profiles (memray)."""
    if kind != "memory":
        return command
    from workloads.profilers.memray import wrap_python_command

    return wrap_python_command(command, out)


def start_profile(kind: str | None, out: Path, target: Target) -> Profiler | dict[str, Any] | None:
    """Start ``kind``'s profiler for a trial: the driver, or the summary section saying why not.

    Never raises for a profiler that cannot run: the trial goes on without a
    profile, and the one line why is printed on stderr and kept in the summary.
    """
    if kind is None:
        return None
    profiler = get_profiler(kind)
    try:
        profiler.start(out, target)
    except ProfilerUnavailable as exc:
        return _unavailable(profiler, str(exc))
    return profiler


def finish_profile(started: Profiler | dict[str, Any] | None) -> dict[str, Any] | None:
    """Stop a profiler from ``start_profile``; its summary section (or why there is none)."""
    if started is None or isinstance(started, dict):
        return started
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
