"""The one small interface every profiler driver implements, and what they share."""

from __future__ import annotations

import contextlib
import ctypes
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

PR_SET_PTRACER = 0x59616D61  # Yama's prctl: "this process may be traced by that one"


class ProfilerUnavailable(Exception):
    """The profiler cannot run here (not installed, ptrace forbidden...): one line why."""


@dataclass
class Target:
    """What to profile: a process, and the threads of it that are cloudprof's, not the job's."""

    pid: int
    in_process: bool  # the target is this very process (a workload, not a --command)
    subprocesses: bool = False  # also follow the target's children (--command jobs)
    exclude_tids: set[int] = field(default_factory=set)
    exclude_thread_names: set[str] = field(default_factory=set)
    # Where the job's own code lives: the runner's working directory when the trial starts,
    # which is the job's shipped copy (--chdir). Attribution names frames there first.
    own_dirs: tuple[str, ...] = field(default_factory=lambda: (os.getcwd(),))


# Installed code inside a job's directory is still a library: setup's pip target (see
# workloads.job.SITE_DIR), a virtual environment's site-packages.
_LIBRARY_PARTS = ("site-packages", "dist-packages", ".cloudprof-site")


def is_own(path: str, own_dirs: tuple[str, ...]) -> bool:
    """Whether a frame's file is the job's own code: under one of ``own_dirs`` (or a relative
    path, which Python resolves against the working directory), not an installed library."""
    if not path or path.startswith("<"):
        return False
    parts = path.replace("\\", "/").split("/")
    if any(part in _LIBRARY_PARTS for part in parts):
        return False
    if not os.path.isabs(path):
        return True
    path = os.path.normpath(path)
    return any(path == d or path.startswith(d.rstrip(os.sep) + os.sep)
               for d in (os.path.normpath(o) for o in own_dirs if o))


class Profiler(ABC):
    """Start before the timed part of a trial, stop after; ``stop`` returns summary's ``profile``.

    Files a driver writes go into ``out`` (the trial's result directory) and are
    named in the returned dict's ``files`` so the orchestrator collects them.
    """

    kind: ClassVar[str]
    tool: ClassVar[str]
    # Set by ``start`` where recording must begin in the caller's frame: a C-level callable
    # (no Python frame of its own) that ``profilers.start_*`` calls right after ``start``.
    activate: Callable[[], Any] | None = None

    @abstractmethod
    def start(self, out: Path, target: Target) -> None:
        """Begin recording; raise ProfilerUnavailable (one line) if it cannot."""

    @abstractmethod
    def stop(self) -> dict[str, Any]:
        """End recording, write the files and return the summary section."""

    def steady_state_begins(self) -> None:
        """The timed part starts now (a driver started before ``prepare()`` marks it here)."""
        return None


def allow_descendants_to_trace() -> None:
    """Let this process's children (the sampler) ptrace it under Yama scope 1, without root.

    ``PR_SET_PTRACER`` names a tracer *and its descendants*; naming ourselves
    lets the py-spy we start attach to us. A kernel without Yama rejects the call
    and needs nothing, so a failure is ignored.
    """
    allow_tracing_by(os.getpid())()


def allow_tracing_by(tracer_pid: int) -> Callable[[], None]:
    """A ``preexec_fn`` for a ``--command``: let ``tracer_pid``'s descendants (py-spy) trace it.

    The command is py-spy's sibling, not its child, so Yama scope 1 would refuse
    the attach; the declaration is made in the child before exec and outlives it.
    """

    def declare() -> None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(PR_SET_PTRACER, tracer_pid, 0, 0, 0)

    return declare


def last_line(text: str) -> str:
    """The last non-empty line of a tool's stderr, for a one-line reason."""
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
