"""Shared by the benchmark scripts: a memory-bandwidth probe, timers and a table printer.

Every table a script prints with :func:`print_table` is also appended, as one JSON
line, to the file named by ``CLOUDPROF_BENCH_RESULTS`` when it is set: that is how
``benchmarks/run_all.py`` (``make bench``) collects the figures it writes into the
benchmarks page, each with the command that produced it. A script that cannot run
on this machine calls :func:`unavailable`, which the page shows instead of a figure.

Benchmarks state their figures as ratios measured side by side in one run, so
that a loaded or slower machine shifts both sides alike. The bandwidth probe
exists because the cube kernel's honest yardstick is this machine's memory
bandwidth, measured in the same run, not a number from a datasheet.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

# Benchmarks run as plain scripts (``python benchmarks/x.py``) from a checkout.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def memory_bandwidth(threads: int = 1, megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes moved per second (read + written) by ``threads`` threads copying with numpy.

    Copies a ``megabytes`` source into an equal destination — both far larger
    than any CPU cache — split into one slice per thread, and keeps the best of
    ``repeats`` (the least disturbed by other processes). Pages are touched first
    so page faults are not timed. numpy releases the GIL while copying, so
    threads really run in parallel.
    """
    import numpy as np

    n = megabytes * 2**20 // 8
    src = np.ones(n)
    dst = np.zeros(n)
    bounds = [(i * n // threads, (i + 1) * n // threads) for i in range(threads)]
    np.copyto(dst, src)  # touch every page of both
    best = float("inf")
    for _ in range(repeats):
        barrier = threading.Barrier(threads + 1)

        def copy(lo: int, hi: int, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            np.copyto(dst[lo:hi], src[lo:hi])
            barrier.wait()

        workers = [threading.Thread(target=copy, args=b) for b in bounds]
        for w in workers:
            w.start()
        barrier.wait()
        start = time.perf_counter()
        barrier.wait()
        best = min(best, time.perf_counter() - start)
        for w in workers:
            w.join()
    return 2 * src.nbytes / best


def timed(fn: Callable[[], Any], repeats: int = 1) -> list[float]:
    """Wall seconds of ``repeats`` calls of ``fn``."""
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def wall_and_cpu(fn: Callable[[], Any]) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds (all threads) of one call of ``fn``.

    CPU seconds are what to compare when other processes share the machine:
    being descheduled stretches wall time but not CPU time.
    """
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def machine_line() -> str:
    """One line describing where the figures were measured."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{model}, {os.cpu_count()} logical cores, Python {platform.python_version()}, "
        f"load average {load:.2f}"
    )


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> None:
    """A plain, aligned, Markdown-compatible table (numbers right-aligned)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 10 else f"{v:,.1f}"
        return str(v)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    numeric = [all(isinstance(r[i], int | float) for r in rows) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "| " + " | ".join(parts) + " |"

    record({"kind": "table", "title": title, "headers": list(headers),
            "rows": [[_plain(v) for v in row] for row in rows]})
    if title:
        print(f"\n{title}")
    print(line(headers))
    print(
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if n else ("-" * (w + 2))
            for w, n in zip(widths, numeric, strict=True)
        )
        + "|"
    )
    for row in cells:
        print(line(row))


def add_input_args(ap: Any) -> None:
    """The cube inputs' size flags, the same in every benchmark (the article's sizes by default)."""
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--cols", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)


def input_spec(args: Any) -> Any:
    """The InputSpec those flags describe."""
    from workloads.inputs import InputSpec

    return InputSpec(frames=args.frames, rows=args.rows, cols=args.cols, seed=args.seed)


RESULTS_ENV = "CLOUDPROF_BENCH_RESULTS"


def command_line() -> str:
    """The command that ran this script, as a reader would type it from the checkout."""
    script = Path(sys.argv[0]).resolve()
    try:
        shown = script.relative_to(ROOT)
    except ValueError:
        shown = Path(script.name)
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def _plain(value: Any) -> Any:
    """A table cell as JSON holds it (numpy scalars as Python numbers)."""
    if hasattr(value, "item"):
        return value.item()
    return value if isinstance(value, (int, float, str)) or value is None else str(value)


def record(result: dict[str, Any]) -> None:
    """Append ``result`` (with this script's command) to the results file, if one is set."""
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    line = json.dumps({"command": command_line(), **result}, allow_nan=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def note(text: str) -> None:
    """A sentence the page prints under this script's tables (what was measured, how)."""
    print(text)
    record({"kind": "note", "text": text})


def unavailable(reason: str) -> NoReturn:
    """This machine lacks what the script needs: say so (on the page too) and stop, exit 0."""
    print(f"not run: {reason}")
    record({"kind": "unavailable", "reason": reason})
    raise SystemExit(0)
