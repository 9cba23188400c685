"""The generic workload interface and its registry.

A workload prepares its inputs once, then runs with N worker threads until told
to stop, counting the units it finished. The trial runner owns timing, the
profiling agent and the result files, so a user's own workload
(``--workload mypkg.mod:MyWorkload``) gets all of that by implementing three
methods.
"""

from __future__ import annotations

import abc
import importlib
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from workloads.shared import SharedInt

# name -> "module:Class"; imported only when used.
REGISTRY: dict[str, str] = {
    "cube": "workloads.cube:CubeWorkload",
    # small workloads with a known memory shape (demos and the agent's test subjects)
    "sleep": "workloads.synthetic:SleepWorkload",
    "memory-steady": "workloads.synthetic:MemorySteadyWorkload",
    "memory-leak": "workloads.synthetic:MemoryLeakWorkload",
    "memory-spike": "workloads.synthetic:MemorySpikeWorkload",
    "memcopy": "workloads.synthetic:MemCopyWorkload",
}


class WorkloadInputError(ValueError):
    """Bad inputs (corrupt/missing file, wrong shapes, bad parameter): a one-line message."""


class UnitCounter:
    """Units done so far, shared by the worker threads, the runner and the agent's sampler.

    The count lives in shared memory (``SharedInt``) so that the sampler process
    records it with every sample without asking this process for it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cell = SharedInt()

    def add(self, n: int = 1) -> None:
        with self._lock:
            self.cell.value += n

    @property
    def value(self) -> int:
        return self.cell.value


class Workload(abc.ABC):
    name: ClassVar[str] = "workload"
    unit: ClassVar[str] = "unit"
    # Modules prepare() imports whatever its parameters: a warm runner (workloads.warm)
    # imports them once per host, so that its forked trials hold what a fresh runner would
    # hold by the end of prepare(), and no more.
    preload: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **params: Any) -> None:
        """``params`` arrive as strings from the command line; convert and validate them."""
        self.params = params

    @abc.abstractmethod
    def prepare(self) -> None:
        """Load or generate inputs once, before timing starts."""

    @abc.abstractmethod
    def run(self, workers: int, stop: threading.Event, counter: UnitCounter) -> None:
        """Run ``workers`` threads until ``stop`` is set, adding finished units to ``counter``."""

    def describe(self) -> dict[str, Any]:
        """The resolved parameters, recorded in summary.json."""
        return {}

    def bytes_per_unit(self) -> int | None:
        """The bytes one unit must at least move through memory, once prepared; None when
        the workload has no such floor. A plain copy of that many bytes, timed on the same
        host (``workloads.bound``), is the speed limit the report measures units against."""
        return None


def load_workload(name: str) -> type[Workload]:
    """A registered name (``cube``) or ``module:Class`` for a user's own workload."""
    target = REGISTRY.get(name, name)
    module, sep, attr = target.partition(":")
    if not sep:
        known = ", ".join(sorted(REGISTRY))
        raise WorkloadInputError(f"unknown workload {name!r}: use one of {known} or module:Class")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise WorkloadInputError(f"cannot load workload {name!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Workload)):
        raise WorkloadInputError(f"{name!r} is not a workloads.base.Workload subclass")
    return cls


def run_threads(
    workers: int,
    target: Callable[[int], None],
    *,
    stop: threading.Event | None = None,
    name: str = "worker",
) -> None:
    """Run ``target(k)`` on ``workers`` threads and re-raise the first error in the caller.

    Workloads run their threads through this so that a failing worker stops the
    others (via ``stop``) and surfaces as the trial's error instead of dying silently.
    Every thread is started before any begins its work: ``Thread.start()`` waits
    for the new thread to get the GIL, and with busy workers already holding it each
    start took ~60 ms — a "160 workers" trial ran most of its time with far fewer.
    """
    errors: list[BaseException] = []
    go = threading.Event()

    def guarded(k: int) -> None:
        go.wait()
        try:
            target(k)
        except BaseException as exc:
            errors.append(exc)
            if stop is not None:
                stop.set()

    threads = [
        threading.Thread(target=guarded, args=(k,), name=f"{name}-{k}", daemon=True)
        for k in range(workers)
    ]
    try:
        for t in threads:
            t.start()
    except BaseException:  # e.g. "can't start new thread": stop the ones that did start
        if stop is not None:
            stop.set()
        raise
    finally:
        go.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
