"""Small workloads with a known memory shape: demos of the agent and its test subjects.

Each one makes a single memory behaviour obvious — steady, leaking, a brief
spike, idle, memory-bandwidth bound — so the agent's verdicts can be checked
against the truth, and a user can see what a leak or a spike looks like in a
report before meeting one in their own code::

    python -m workloads.run --workload memory-leak --param mb_per_s=50 --duration 5 --out /tmp/leak
"""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

from workloads.base import UnitCounter, Workload, WorkloadInputError, run_threads

MIB = 1024 * 1024


def _touched_block(nbytes: int) -> Any:
    """A block whose every page is resident (np.ones writes each page; np.empty would not)."""
    import numpy as np

    return np.ones(max(nbytes // 8, 1), dtype=np.float64)


class _Synthetic(Workload):
    """Parameter parsing shared by the synthetic workloads: typed defaults, no unknown keys."""

    defaults: ClassVar[dict[str, float]] = {}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            known = ", ".join(sorted(self.defaults)) or "none"
            raise WorkloadInputError(
                f"unknown parameter {unknown[0]!r} for workload {self.name!r} (known: {known})"
            )
        self.p: dict[str, float] = {}
        for key, default in self.defaults.items():
            raw = params.get(key, default)
            try:
                value = float(raw)
            except (TypeError, ValueError):
                raise WorkloadInputError(
                    f"parameter {key}={raw!r} for workload {self.name!r} is not a number"
                ) from None
            if value < 0 or value != value:
                raise WorkloadInputError(f"parameter {key}={raw!r} must be ≥ 0")
            self.p[key] = value

    def describe(self) -> dict[str, Any]:
        return dict(self.p)

    def prepare(self) -> None:
        pass


class SleepWorkload(_Synthetic):
    """Idle workers: one unit per ``unit_ms`` of sleep. Measures the agent, not the work."""

    name = "sleep"
    unit = "nap"
    defaults: ClassVar[dict[str, float]] = {"unit_ms": 10.0}

    def run(self, workers: int, stop: threading.Event, counter: UnitCounter) -> None:
        pause = self.p["unit_ms"] / 1000

        def worker() -> None:
            while not stop.wait(pause):
                counter.add()

        run_threads(workers, lambda _k: worker())


class MemorySteadyWorkload(_Synthetic):
    """A fixed block allocated once; workers keep reading it. RSS flat: the "ok" verdict.

    ``load_mb`` > 0 also needs that much while loading (``prepare()``: a block touched
    and freed, as parsing an input file does): the whole-lifetime peak is then the load's.
    """

    name = "memory-steady"
    unit = "pass"
    defaults: ClassVar[dict[str, float]] = {"mb": 64.0, "unit_ms": 5.0, "load_mb": 0.0}

    def prepare(self) -> None:
        if self.p["load_mb"] > 0:
            loading = _touched_block(int(self.p["load_mb"] * MIB))
            del loading
        self.block = _touched_block(int(self.p["mb"] * MIB))

    def run(self, workers: int, stop: threading.Event, counter: UnitCounter) -> None:
        pause = self.p["unit_ms"] / 1000
        chunk = self.block[: MIB // 8]

        def worker() -> None:
            while not stop.is_set():
                float(chunk.sum())
                counter.add()
                stop.wait(pause)

        run_threads(workers, lambda _k: worker())


class MemoryLeakWorkload(_Synthetic):
    """Grows steadily at ``mb_per_s`` (all workers together), never freeing, up to ``max_mb``."""

    name = "memory-leak"
    unit = "chunk"
    defaults: ClassVar[dict[str, float]] = {"mb_per_s": 40.0, "chunk_mb": 1.0, "max_mb": 1024.0}

    def prepare(self) -> None:
        if self.p["mb_per_s"] <= 0 or self.p["chunk_mb"] <= 0:
            raise WorkloadInputError("memory-leak needs mb_per_s > 0 and chunk_mb > 0")
        self.leaked: list[Any] = []
        self._lock = threading.Lock()

    def run(self, workers: int, stop: threading.Event, counter: UnitCounter) -> None:
        chunk = int(self.p["chunk_mb"] * MIB)
        cap = int(self.p["max_mb"] * MIB)
        period = self.p["chunk_mb"] / self.p["mb_per_s"] * workers  # per worker
        start = time.perf_counter()

        def worker(k: int) -> None:
            n = 0
            # Staggered fixed schedule: the combined rate stays mb_per_s however long a chunk takes.
            while not stop.wait(max(0.0, start + (n + k / workers) * period - time.perf_counter())):
                n += 1
                with self._lock:
                    if len(self.leaked) * chunk >= cap:
                        continue
                    self.leaked.append(_touched_block(chunk))
                counter.add()

        run_threads(workers, worker)


class MemorySpikeWorkload(_Synthetic):
    """Flat, except one ``mb`` block allocated at ``at_s`` and freed after ``hold_ms``.

    With hold_ms=0 the block lives only as long as touching it takes (tens of ms):
    a sampler at a few Hz usually misses it, the kernel's high-water mark never does.
    """

    name = "memory-spike"
    unit = "nap"
    defaults: ClassVar[dict[str, float]] = {"mb": 256.0, "at_s": 1.0, "hold_ms": 0.0}

    def run(self, workers: int, stop: threading.Event, counter: UnitCounter) -> None:
        def spiker() -> None:
            if stop.wait(self.p["at_s"]):
                return
            block = _touched_block(int(self.p["mb"] * MIB))
            time.sleep(self.p["hold_ms"] / 1000)
            del block
            counter.add()

        def worker(k: int) -> None:
            if k == 0:
                spiker()
            while not stop.wait(0.01):
                counter.add()

        run_threads(workers, worker)


class MemCopyWorkload(_Synthetic):
    """Memory-bandwidth bound: each unit copies ``mb`` MiB between two per-worker buffers.

    numpy releases the GIL during the copy, so it scales with workers like the
    cube kernel does; the agent-overhead benchmark falls back to it.
    """

    name = "memcopy"
    unit = "copy"
    defaults: ClassVar[dict[str, float]] = {"mb": 8.0}

    def run(self, workers: int, stop: threading.Event, counter: UnitCounter) -> None:
        import numpy as np

        n = max(int(self.p["mb"] * MIB) // 8, 1)

        def worker() -> None:
            src, dst = np.ones(n), np.empty(n)
            while not stop.is_set():
                np.copyto(dst, src)
                counter.add()

        run_threads(workers, lambda _k: worker())
