"""Memory attribution at the high-water mark with memray (tracemalloc where memray is absent).

memray tracks every allocation of the trial process, native ones included
(``native_traces=True``), into a capture file; its reader then gives the
allocations still alive at the peak. Each is attributed to a *call site*: the
innermost frame of the job's own code (frames inside site-packages or the
standard library are skipped, so ``np.ones`` called at ``cube.py:120`` is
"``ones`` at cube.py:120"). ``memray flamegraph`` renders the HTML flame graph.

Where memray cannot be imported (no wheel for the platform), Python's own
tracemalloc is the fallback: Python allocations only, snapshot taken whenever
traced memory reaches a new high, and the summary labels it as such.

For a workload, tracking starts before ``prepare()`` (the runner starts this
kind first, see ``profilers.LIFETIME``): loading the inputs is often the peak,
and a peak reached there is attributed like any other.

``grown_sites`` are the call sites of the allocations made during the timed
part and still alive when the trial ends: what grew between the start and the
end of the steady state — for a trial flagged as a leak, the leak. memray's
temporal records say in which memory snapshot (every 10 ms) each allocation
was made, so what ``prepare()`` loaded and kept is not counted as growth.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from workloads import protocol
from workloads.profilers.base import Profiler, ProfilerUnavailable, Target, is_own, last_line

CAPTURE_FILE = "memray.bin"
FLAMEGRAPH_FILE = protocol.MEMRAY_FLAMEGRAPH_FILE
TOP_SITES = 10
WHOLE_PROCESS = "whole process (prepare() included)"
CENSUS_FILE = "cloudprof_heap.py"  # the heap census runs in the profiled process too
_LIBRARY_DIRS = tuple(
    p for p in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")} if p
)


def is_library(path: str) -> bool:
    """A frame in installed packages or the standard library (not the job's own code)."""
    if "site-packages" in path or "dist-packages" in path:
        return f"{os.sep}workloads{os.sep}" not in path  # cloudprof's workloads are the job
    return path.startswith(_LIBRARY_DIRS) or path.startswith("<")


def _site_frame(stack: Sequence[tuple[str, str, int]], own_dirs: tuple[str, ...]) -> int:
    """The index of the frame that names an allocation's site: the innermost of the job's own
    files (``own_dirs``), else the innermost outside libraries, else the innermost."""
    for i, (_fn, file, _line) in enumerate(stack):
        if own_dirs and is_own(file, own_dirs):
            return i
    for i, (_fn, file, _line) in enumerate(stack):
        if not is_library(file):
            return i
    return 0


_COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>")


def call_site(stack: Sequence[tuple[str, str, int]],
              own_dirs: tuple[str, ...] = ()) -> tuple[str, str, str]:
    """(function, file:line of the job's frame, the job's function) for a stack, innermost first.

    The function is the innermost Python function (``ones``); the site is the
    innermost frame of the job's own files (``own_dirs``), else outside libraries:
    where the job called it.
    """
    if not stack:
        return "<native>", "<unknown>", "<native>"
    at = _site_frame(stack, own_dirs)
    fn, file, line = stack[at]
    # before 3.12 a comprehension ran in a frame of its own: the job's function is the one
    # it is written in, as 3.12 names it (PEP 709 inlines them)
    while fn in _COMPREHENSIONS and at + 1 < len(stack) and stack[at + 1][1] == file:
        at += 1
        fn = stack[at][0]
    return stack[0][0], f"{os.path.basename(file)}:{line}", fn


def top_sites(
    allocations: Iterable[tuple[int, int, Sequence[tuple[str, str, int]]]], peak_bytes: int,
    own_dirs: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """Group (bytes, count, stack) at the peak by call site, largest first; ``own`` marks a
    site in the job's own files."""
    by_site: dict[tuple[str, str, str, bool], list[int]] = defaultdict(lambda: [0, 0])
    for size, count, stack in allocations:
        if any(file.endswith(CENSUS_FILE) for _fn, file, _line in stack):
            continue  # the heap census's own bookkeeping (profile.heap), not the job's
        own = bool(stack) and is_own(stack[_site_frame(stack, own_dirs)][1], own_dirs)
        acc = by_site[(*call_site(stack, own_dirs), own)]
        acc[0] += size
        acc[1] += count
    rows = sorted(by_site.items(), key=lambda kv: -kv[1][0])[:TOP_SITES]
    return [
        {"function": fn, "site": site, "caller": caller, "bytes": size, "allocations": count,
         "share_of_peak": round(size / peak_bytes, 4) if peak_bytes else None, "own": own}
        for (fn, site, caller, own), (size, count) in rows
    ]  # fmt: skip


def grown_since(reader: Any, since: float) -> list[tuple[int, int, Any]]:
    """(bytes, count, stack) allocated after ``since`` (epoch seconds) and never freed.

    An interval's ``allocated_before_snapshot`` is the index of the first memory
    snapshot taken after the allocation, so allocations made after the snapshots
    up to ``since`` have an index above their count.
    """
    since_ms = since * 1000.0
    first = sum(1 for snap in reader.get_memory_snapshots() if snap.time <= since_ms)
    grown = []
    for rec in reader.get_temporal_allocation_records(merge_threads=True):
        size = count = 0
        for iv in rec.intervals:
            if iv.deallocated_before_snapshot is None and iv.allocated_before_snapshot > first:
                size += int(iv.n_bytes)
                count += int(iv.n_allocations)
        if size:
            grown.append((size, count, rec.stack_trace()))
    return grown


def summarize_capture(path: Path, steady_from: float | None = None,
                      own_dirs: tuple[str, ...] = (),
                      children: Sequence[Path] = ()) -> dict[str, Any]:
    """The allocations alive at memray's high-water mark, grouped by call site.

    ``steady_from`` (epoch seconds) is when the timed part began, where tracking
    started earlier; without it, everything still alive at the end counts as grown.
    ``children``: the captures of a command's forked processes (``--follow-fork``),
    each read at its own high-water mark; their sites join the parent's and
    ``peak_bytes`` is then the sum of the processes' peaks, an upper bound of the
    tree's (the peaks need not coincide), with each process's in ``processes``.
    """
    import memray

    peak, allocs, grown, native = 0, [], [], False
    processes = []
    for n, capture in enumerate([path, *children]):
        try:
            reader = memray.FileReader(str(capture))
        except Exception:  # a child killed before its capture's header was written
            if n == 0:
                raise
            continue
        own_peak = int(reader.metadata.peak_memory)
        peak += own_peak
        processes.append({"pid": int(reader.metadata.pid), "peak_bytes": own_peak})
        native = native or bool(reader.metadata.has_native_traces)
        allocs += [
            (int(r.size), int(r.n_allocations), r.stack_trace())
            for r in reader.get_high_watermark_allocation_records(merge_threads=True)
        ]
        if steady_from is not None:
            grown += grown_since(reader, steady_from)
        else:
            grown += [
                (int(r.size), int(r.n_allocations), r.stack_trace())
                for r in reader.get_leaked_allocation_records(merge_threads=True)
            ]
    out = {
        "peak_bytes": peak,
        "attributed_bytes": sum(a[0] for a in allocs),
        "top_sites": top_sites(allocs, peak, own_dirs),
        "grown_bytes": sum(a[0] for a in grown),
        "grown_sites": top_sites(grown, peak, own_dirs),
        "native_traces": native,
    }
    if len(processes) > 1:
        out["processes"] = processes
    return out


def wrap_python_command(command: list[str], out: Path,
                        env: Mapping[str, str] | None = None) -> list[str]:
    """``python ARGS`` → ``python -m memray run --native ... ARGS`` where memray can run it.

    Only a command whose program is a Python interpreter with memray importable
    is wrapped (checked by running it once, with the environment the command gets:
    a job's ``python`` is the host's venv, first on its PATH); any other command
    runs unchanged and its trial says there is no memory profile.
    """
    if not command or not re.fullmatch(r"python[0-9.]*", os.path.basename(command[0])):
        return command
    try:
        probe_env = {k: v for k, v in (os.environ if env is None else env).items()
                     if k != "CLOUDPROF_HEAP_FILE"}  # the probe's own heap is nobody's census
        probe = subprocess.run([command[0], "-c", "import memray"], capture_output=True,
                               timeout=60, check=False, env=probe_env)
    except (OSError, subprocess.TimeoutExpired):
        return command
    if probe.returncode != 0:
        return command
    out.mkdir(parents=True, exist_ok=True)
    capture = str(out / CAPTURE_FILE)
    return [command[0], "-m", "memray", "run", "--native", "--follow-fork", "--force", "-q",
            "-o", capture, *command[1:]]  # fmt: skip


class MemrayProfiler(Profiler):
    """In-process memray Tracker around the timed part of a workload trial."""

    kind = "memory"
    tool = "memray"

    def __init__(self) -> None:
        self.tracker: Any = None
        self.fallback: TracemallocPeak | None = None
        self.out: Path | None = None
        self.command = False
        self.steady_from: float | None = None
        self.own_dirs: tuple[str, ...] = ()
        self.heap: Any = None  # the heap census thread of an in-process trial

    def steady_state_begins(self) -> None:
        self.steady_from = time.time()

    def start(self, out: Path, target: Target) -> None:
        self.out = out
        self.own_dirs = target.own_dirs
        out.mkdir(parents=True, exist_ok=True)
        if not target.in_process:  # a --command: memray runs it (wrap_python_command)
            self.command = True  # and the start-up hook takes each process's heap census
            return
        from workloads.profilers.heap import watch_in_process

        self.heap = watch_in_process()
        try:
            import memray
        except ImportError:
            self.fallback = TracemallocPeak()
            self.fallback.start()
            return
        capture = out / CAPTURE_FILE
        capture.unlink(missing_ok=True)
        self.tracker = memray.Tracker(str(capture), native_traces=True, memory_interval_ms=10)
        # Entered by the caller (profilers.start_*), not here: see start_lifetime_profile.
        self.activate = self.tracker.__enter__

    def stop(self) -> dict[str, Any]:
        summary = self._stop()
        from workloads.profilers.heap import read_heap

        assert self.out is not None
        heap = self.heap.stop() if self.heap is not None else read_heap(self.out)
        if heap is not None:
            summary["heap"] = heap
        return summary

    def _stop(self) -> dict[str, Any]:
        assert self.out is not None
        if self.fallback is not None:
            summary = self.fallback.stop()
            summary.update(kind=self.kind, tool="tracemalloc", files=[], covers=WHOLE_PROCESS)
            return summary
        capture = self.out / CAPTURE_FILE
        if self.command and not capture.is_file():
            raise ProfilerUnavailable(
                "memory profiles of --command jobs need a Python command (python ...) whose "
                "interpreter has memray installed"
            )
        if self.tracker is not None:
            self.tracker.__exit__(None, None, None)
        children = sorted(self.out.glob(f"{CAPTURE_FILE}.*")) if self.command else []
        summary = summarize_capture(capture, None if self.command else self.steady_from,
                                    self.own_dirs, children)
        summary["covers"] = "whole command" if self.command else WHOLE_PROCESS
        if summary.get("processes"):
            summary["covers"] += (f" and its {len(summary['processes']) - 1} forked "
                                  "processes, each at its own high-water mark")
        files = [CAPTURE_FILE]
        html = self.out / FLAMEGRAPH_FILE
        argv = [sys.executable, "-m", "memray", "flamegraph", "--force", "-o", str(html)]
        done = subprocess.run(
            [*argv, str(capture)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if done.returncode == 0 and html.exists():
            files.append(FLAMEGRAPH_FILE)
        else:
            summary["flamegraph_error"] = last_line(done.stderr or done.stdout)
        summary.update(kind=self.kind, tool=self.tool, at="high-water mark", files=files)
        return summary


class TracemallocPeak:
    """Fallback: Python allocations only, snapshot at each new high of traced memory."""

    POLL_S = 0.2

    def __init__(self) -> None:
        self.snapshot: Any = None
        self.best = 0
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        import tracemalloc

        tracemalloc.start(16)

        def poll() -> None:
            while not self.done.wait(self.POLL_S):
                self._maybe_snapshot()

        self.thread = threading.Thread(target=poll, name="cloudprof-tracemalloc", daemon=True)
        self.thread.start()

    def _maybe_snapshot(self) -> None:
        import tracemalloc

        current, _peak = tracemalloc.get_traced_memory()
        if current > self.best * 1.05:
            self.best = current
            self.snapshot = tracemalloc.take_snapshot()

    def stop(self) -> dict[str, Any]:
        import tracemalloc

        self.done.set()
        if self.thread is not None:
            self.thread.join()
        self._maybe_snapshot()
        _current, peak = tracemalloc.get_traced_memory()
        snap = self.snapshot
        tracemalloc.stop()
        allocs = []
        if snap is not None:
            for stat in snap.statistics("traceback"):
                stack = [(f"<line {fr.lineno}>", fr.filename, fr.lineno) for fr in
                         reversed(stat.traceback)]  # fmt: skip
                allocs.append((stat.size, stat.count, stack))
        return {
            "peak_bytes": peak,
            "attributed_bytes": sum(a[0] for a in allocs),
            "top_sites": top_sites(allocs, peak),
            "native_traces": False,
            "at": "largest traced total seen (polled every 0.2 s), Python allocations only",
            "note": "tracemalloc fallback: memray is not installed here",
        }
