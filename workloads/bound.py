"""The speed limit of a unit of work on this host: a plain memory copy of the same bytes.

The "benchmark, simplify, optimise" article asks for each part's theoretical
maximum and the gap to it. A cube gathers ``frames × dim × dim`` float64 values
from frames resident in memory into a new array: whatever the strategy, it
cannot beat copying that many bytes. This times ``numpy.copyto`` of one unit's
bytes, read from a source several times the last-level cache so it comes from
memory, in 1 thread and in one thread per core (numpy releases the GIL while
it copies), once per host and unit size (cached beside the inputs), counted per
second of each copying thread's own CPU time (what a core does while it copies:
on a busy host the wall clock also counts the time a thread waited for a core),
and models the bound at ``w`` workers as ``min(w × one thread's rate, all cores'
rate)``: a roofline, one thread's copy speed rising to the memory bandwidth.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from workloads.atomic import atomic_write_text

SOURCE_BYTES = 256 << 20  # far above any last-level cache: every copy reads memory
SECONDS = 0.4  # per measurement; two measurements per host and unit size
CACHE_FILE = "copy_bounds.json"


def _copy_rate(unit_bytes: int, threads: int, seconds: float = SECONDS) -> float:
    """Copies of ``unit_bytes`` per second, summed over ``threads`` threads."""
    import numpy as np

    n = max(1, unit_bytes // 8)
    source = np.ones(max(SOURCE_BYTES // 8, 2 * n))
    slots = max(1, (source.size - n) // n)
    done = [0] * threads
    busy = [0.0] * threads  # each thread's own CPU seconds while it copied
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def work(k: int) -> None:
        target = np.empty(n)
        i = k
        start.wait()
        t0 = time.thread_time()
        while not stop.is_set():
            offset = (i % slots) * n
            np.copyto(target, source[offset:offset + n])
            done[k] += 1
            i += threads
        busy[k] = time.thread_time() - t0
    pool = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    # per CPU second, not per wall second: on a busy host a thread that waited for a core
    # copied nothing meanwhile, and the wall clock would read that as a slower memory
    return sum(d / b for d, b in zip(done, busy, strict=True) if d and b > 0)


def measure(unit_bytes: int, cores: int | None = None) -> dict[str, Any]:
    """The copy bound for one unit size on this host: its rate in 1 thread and in all."""
    cores = cores or os.cpu_count() or 1
    one = _copy_rate(unit_bytes, 1)
    every = _copy_rate(unit_bytes, cores) if cores > 1 else one
    return {"bytes_per_unit": unit_bytes, "units_per_s_1": one, "units_per_s_all": every,
            "threads_all": cores, "method": "numpy.copyto of one unit's bytes from a "
            f"{SOURCE_BYTES >> 20} MiB source, {SECONDS:g} s per thread count, per second "
            "of each thread's CPU time"}


def default_cache_dir() -> Path:
    """Per host, not per sweep: ``~/.cache/cloudprof``."""
    return Path.home() / ".cache" / "cloudprof"


def host_bound(unit_bytes: int, cache_dir: Path | None = None) -> dict[str, Any]:
    """``measure`` once per host and unit size: read from ``cache_dir`` when done before."""
    cache_dir = cache_dir or default_cache_dir()
    cores = os.cpu_count() or 1
    key = f"{unit_bytes}:{cores}"
    path = cache_dir / CACHE_FILE
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    if isinstance(known.get(key), dict):
        return {**known[key], "cached": True}
    found = measure(unit_bytes, cores)
    known[key] = found
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(known))
    except OSError:
        pass  # measured again next time
    return {**found, "cached": False}


def bound_at(bound: dict[str, Any], workers: int) -> float:
    """Units/s the copy allows at ``workers`` workers: one thread's rate times the
    workers, up to all cores' rate. Workers past the cores share them, so the bound is
    flat there even when the all-cores rate, timed per thread's CPU second, came out
    above the cores times one thread's rate."""
    one, every = float(bound["units_per_s_1"]), float(bound["units_per_s_all"])
    threads = int(bound.get("threads_all") or workers)
    return min(min(workers, threads) * one, max(every, one))
