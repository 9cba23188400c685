"""CPU attribution with py-spy: where each thread's time goes, sampled from outside the process.

py-spy runs as a child of the trial runner and attaches to the trial (or
follows a ``--command`` and its children). What it costs decides how:

* ``--profile cpu`` (the default mode, ``nonblocking``): py-spy reads the
  job's memory without pausing it — about 3 % of throughput at py-spy's default
  100 Hz, measured side by side — and keeps the samples of running threads:
  the top functions, no split by class.
* ``--profile gil`` (mode ``native``): ``--idle --threads --native``, so every
  sample of every thread is kept with its native frames; py-spy must pause the
  job for each (about 20 % of throughput at 100 Hz). Each sample is then put in
  one of five classes from its stack alone (``classify``):

* ``python`` — the thread runs Python (the innermost frames are Python's,
  or interpreter internals that hold the GIL such as ``time.time``);
* ``native`` — it runs compiled code below a Python frame (numpy, BLAS...),
  usually with the GIL released;
* ``gil_wait`` — it waits for the GIL: below its last Python frame there is
  only ``take_gil``/``PyEval_RestoreThread`` or, where CPython inlined those,
  only a libc condition wait;
* ``lock_wait`` — it waits to acquire a lock another thread holds, from the
  job's code (``with lock:``): contention, which between GIL-bound threads is
  mostly a holder that lost the GIL inside its critical section, so it is not
  idle time;
* ``idle`` — it sleeps or blocks (``time.sleep``, I/O, a join, an
  ``Event``/``Condition``/``queue`` wait, whose lock acquire is a wait for
  something to happen).

Without native frames (not asked for, or py-spy cannot unwind them on this
platform) the native/GIL split is not knowable and the summary says so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from workloads import protocol
from workloads.profilers.base import (
    Profiler,
    ProfilerUnavailable,
    Target,
    allow_descendants_to_trace,
    is_own,
    last_line,
)

PYSPY_DEFAULT_RATE_HZ = 100  # py-spy's own default
DEFAULT_RATE_HZ = PYSPY_DEFAULT_RATE_HZ
# How py-spy reads the target: "native" pauses it for every sample and unwinds native
# frames (the only way to split Python / native / GIL wait); "blocking" pauses it but
# reads Python frames only; "nonblocking" never pauses it (frames can be torn).
MODES = ("native", "blocking", "nonblocking")
# The default never pauses the job: side by side, --native at 100 Hz cost 22 % of cube's
# throughput, Python frames with pauses 12 %, --nonblocking 3 % (docs/benchmarks.md).
DEFAULT_MODE = "nonblocking"
SPEEDSCOPE_FILE = protocol.PYSPY_SPEEDSCOPE_FILE
FLAMEGRAPH_FILE = protocol.PYSPY_FLAMEGRAPH_FILE
STDERR_FILE = "py-spy.stderr.txt"  # stays on the host, next to the trial's files
OWN = "cloudprof-"  # prefix of the names of cloudprof's own threads, never the job's
CLASSES = ("python", "native", "gil_wait", "lock_wait", "idle")
TOP_FUNCTIONS = 10

_THREAD_NAME = re.compile(r'^Thread (?:0x)?(?P<tid>[0-9a-fA-F]+)(?: "(?P<name>.*)")?')
_GIL_FUNCS = ("take_gil", "PyEval_RestoreThread", "PyEval_AcquireThread", "PyGILState_Ensure",
              "PyEval_AcquireLock", "drop_gil")  # fmt: skip
_WAIT_TOKENS = frozenset(
    [
        "poll",
        "epoll",
        "select",
        "pselect",
        "futex",
        "acquire",
        "recv",
        "recvfrom",
        "recvmsg",
        "accept",
        "accept4",
        "read",
        "readv",
        "pread",
        "pread64",
        "join",
        "pause",
        "sigtimedwait",
        "connect",
        "sem",
        "lock",
        "flock",
        "msgrcv",
    ]
)  # a word of a blocking call's name; "…wait" and "…sleep" words count as well
_GIL_LIBC_WAITS = ("pthread_cond_", "pthread_mutex_lock", "__lll_lock", "futex", "0x")
# A Python lock's acquire as CPython implements it (3.8-3.13): below a Python frame it is a
# wait for a lock, and where that frame is not the standard library's waiting primitives
# (threading's Condition/Event/join, queue, concurrent.futures), it is contention.
_LOCK_ACQUIRE = ("lock_PyThread_acquire_lock", "rlock_acquire", "acquire_timed",
                 "PyThread_acquire_lock_timed", "_PyMutex_LockTimed", "lock_lock")
_COUNTER = ("add", os.path.join("workloads", "base.py"))  # workloads.base.UnitCounter.add
_WAITING_MODULES = ("threading.py", "queue.py", os.path.join("concurrent", "futures"),
                    "multiprocessing", "asyncio", "selectors.py", "subprocess.py")
_LIBC = ("libc.so", "libpthread", "[vdso]", "ld-linux", "libc-", "libsystem")


def find_pyspy() -> str | None:
    """$CLOUDPROF_PYSPY if set, else py-spy next to this interpreter (the venv's bin), else PATH."""
    chosen = os.environ.get("CLOUDPROF_PYSPY")
    if chosen is not None:
        return chosen if os.access(chosen, os.X_OK) else None
    here = Path(sys.executable).with_name("py-spy")
    if here.exists():
        return str(here)
    return shutil.which("py-spy")


def is_python_frame(frame: dict[str, Any]) -> bool:
    """py-spy names Python frames by their source file; native ones by their library."""
    file = str(frame.get("file") or "")
    return file.endswith((".py", ".pyx")) or file.startswith("<")


def _is_libc(frame: dict[str, Any]) -> bool:
    file = os.path.basename(str(frame.get("file") or ""))
    return file.startswith(_LIBC) or (str(frame.get("name", "")).startswith("0x") and not file)


def _blocks(name: str) -> bool:
    """A function name that says it blocks: ``epoll_wait``, ``time_sleep``, ``__libc_recv``."""
    words = [w for w in name.lower().split("_") if w]
    return any(w in _WAIT_TOKENS or w.endswith(("wait", "sleep")) for w in words)


def is_cloudprof_counter(stack: Sequence[dict[str, Any]]) -> bool:
    """A sample inside cloudprof's own per-unit counter (``UnitCounter.add``, its lock
    included), which a workload's threads call: cloudprof's time, not the job's."""
    return any(str(f.get("name", "")).endswith(_COUNTER[0])
               and str(f.get("file", "")).endswith(_COUNTER[1]) for f in stack)


def classify(stack: Sequence[dict[str, Any]]) -> str:
    """One sample's class from its frames, outermost first (see the module docstring)."""
    last_py = max((i for i, f in enumerate(stack) if is_python_frame(f)), default=-1)
    tail = stack[last_py + 1 :]
    if not tail:
        return "python"
    names = [str(f.get("name", "")) for f in tail]
    if any(name.startswith(_GIL_FUNCS) for name in names):
        return "gil_wait"
    if (
        last_py >= 0
        and all(_is_libc(f) for f in tail)
        and all(n.startswith(_GIL_LIBC_WAITS) for n in names)
    ):
        # CPython ≥ 3.9 inlines take_gil into the eval loop: a Python frame directly
        # over a libc condition wait is a thread waiting for the GIL.
        return "gil_wait"
    if any(name.startswith(_LOCK_ACQUIRE) for name in names) and last_py >= 0:
        file = str(stack[last_py].get("file") or "")
        if not any(part in file for part in _WAITING_MODULES):
            return "lock_wait"
    if any(_blocks(n) for n in names):
        return "idle"
    if all(_is_libc(f) or "libpython" in str(f.get("file", "")) for f in tail):
        return "python"  # the interpreter's own C code, GIL held
    return "native"


def _thread_of(profile_name: str) -> tuple[int | None, str]:
    m = _THREAD_NAME.match(profile_name)
    if not m:
        return None, ""
    tid_text = m.group("tid")
    try:
        tid = int(tid_text, 16) if profile_name.startswith("Thread 0x") else int(tid_text)
    except ValueError:
        tid = None
    return tid, m.group("name") or ""


def _site(frame: dict[str, Any]) -> str:
    return f"{os.path.basename(str(frame.get('file', '')))}:{frame.get('line', 0)}"


def _job_threads(profiles: list[dict[str, Any]], skip_tids: set[int],
                 skip_names: set[str]) -> list[tuple[object, dict[str, Any]]]:
    """The job's threads' profiles, each with its thread (its id, else its place): the
    threads cloudprof runs itself are left out by id or name."""
    # py-spy may write one thread twice (with and without its name, when it sampled the
    # thread before Python registered it): a thread is excluded if any of its names is.
    for profile in profiles:
        tid, name = _thread_of(str(profile.get("name", "")))
        if tid is not None and (name in skip_names or name.startswith(OWN)):
            skip_tids.add(tid)
    kept: list[tuple[object, dict[str, Any]]] = []
    for n, profile in enumerate(profiles):
        tid, name = _thread_of(str(profile.get("name", "")))
        if (tid is not None and tid in skip_tids) or name in skip_names or name.startswith(OWN):
            continue
        kept.append((tid if tid is not None else f"#{n}", profile))
    return kept


def summarize_speedscope(
    doc: dict[str, Any],
    *,
    exclude_tids: Iterable[int] = (),
    exclude_thread_names: Iterable[str] = (),
    native: bool = True,
    own_dirs: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Shares of samples per class and the top functions, from py-spy's speedscope JSON.

    Threads cloudprof runs itself (the runner's main thread, the driver thread
    that only joins the workers) are left out by id or name so the shares speak
    about the job. Shares are of *thread samples*: with 4 threads, one second
    of sampling at 100 Hz is 400 samples.

    ``own_dirs``: where the job's own files are. A top function there is marked
    ``own``, and ``own_functions`` charges each sample to the innermost frame of
    the job's own code on its stack (the line of the user's that led there, where
    the leaf is in a library), so the user's functions are named first.
    """
    frames = doc.get("shared", {}).get("frames", [])
    counts: Counter[str] = Counter()
    leaf_counts: Counter[tuple[str, str, str, bool]] = Counter()
    own_counts: Counter[tuple[str, str]] = Counter()
    counter_samples = 0
    threads = _job_threads(doc.get("profiles", []), set(exclude_tids), set(exclude_thread_names))
    for _thread, profile in threads:
        for sample in profile.get("samples", []):
            stack = [frames[i] for i in sample]
            if is_cloudprof_counter(stack):  # cloudprof's bookkeeping, not the job's time
                counter_samples += 1
                continue
            cls = classify(stack) if native else "running"  # not knowable without native
            counts[cls] += 1
            if cls == "idle":
                continue
            leaf = next((f for f in reversed(stack) if is_python_frame(f)), None)
            if leaf is not None:
                leaf_counts[(str(leaf.get("name", "")), _site(leaf), cls,
                             is_own(str(leaf.get("file", "")), own_dirs))] += 1
            mine = next((f for f in reversed(stack)
                         if is_python_frame(f) and is_own(str(f.get("file", "")), own_dirs)),
                        None)  # fmt: skip
            if mine is not None:
                own_counts[(str(mine.get("name", "")), _site(mine))] += 1
    total = sum(counts.values())
    shares = {c: round(counts[c] / total, 4) if total else 0.0 for c in CLASSES}
    top = [
        {"function": fn, "site": site, "class": cls, "samples": n,
         "share": round(n / total, 4) if total else 0.0, "own": own}
        for (fn, site, cls, own), n in leaf_counts.most_common(TOP_FUNCTIONS)
    ]  # fmt: skip
    out: dict[str, Any] = {
        "samples": total,
        # thread samples in cloudprof's own unit counter (a workload's counter.add), left out
        # of every share: measured, so the report can say what cloudprof's counting cost
        "cloudprof_samples": counter_samples,
        "threads": len({thread for thread, _profile in threads}),
        "shares": shares if native else None,
        "top_functions": top,
        "own_functions": [
            {"function": fn, "site": site, "samples": n,
             "share": round(n / total, 4) if total else 0.0}
            for (fn, site), n in own_counts.most_common(TOP_FUNCTIONS)
        ],
    }
    if not native:
        out["note"] = ("samples of running threads, without native frames: the split Python / "
                       "native / GIL wait needs --profile gil")
    return out


def flamegraph_svg(doc: dict[str, Any], title: str = "py-spy", width: int = 1200) -> str:
    """A static SVG flame graph (root at the bottom) of all threads' samples merged."""
    frames = doc.get("shared", {}).get("frames", [])
    root: dict[str, Any] = {"n": 0, "kids": {}}
    for profile in doc.get("profiles", []):
        for sample in profile.get("samples", []):
            node = root
            node["n"] += 1
            for i in sample:
                f = frames[i]
                key = f"{f.get('name', '?')} ({_site(f)})"
                node = node["kids"].setdefault(key, {"n": 0, "kids": {}})
                node["n"] += 1
    total = root["n"] or 1
    row, rects, depth_max = 16, [], 0

    def walk(node: dict[str, Any], x: float, depth: int) -> None:
        nonlocal depth_max
        for key, kid in sorted(node["kids"].items()):
            w = kid["n"] / total * width
            if w >= 0.5:
                depth_max = max(depth_max, depth)
                rects.append((x, depth, w, key, kid["n"]))
                walk(kid, x, depth + 1)
            x += w

    walk(root, 0.0, 0)
    height = (depth_max + 2) * row + 20
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace" font-size="11">',
        f'<text x="4" y="14">{_esc(title)} — {total} samples</text>',
    ]
    for x, depth, w, key, n in rects:
        y = height - (depth + 1) * row
        hue = 10 + (zlib.crc32(key.encode()) % 40)  # stable colours across runs
        label = _esc(key[: max(int(w / 7), 0)]) if w > 30 else ""
        parts.append(
            f"<g><title>{_esc(key)}: {n} samples ({n / total:.1%})</title>"
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 1}" '
            f'fill="hsl({hue},80%,60%)"/><text x="{x + 2:.1f}" y="{y + 11}">{label}</text></g>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _esc(text: str) -> str:
    from html import escape

    return escape(text, quote=True)


def settings(rate_hz: int | None = None, mode: str | None = None) -> tuple[int, str]:
    """(rate, mode): the arguments, else $CLOUDPROF_PYSPY_RATE / $CLOUDPROF_PYSPY_MODE, else
    the defaults. Bad values raise ProfilerUnavailable (one line; the trial runs unprofiled)."""
    rate_text = os.environ.get("CLOUDPROF_PYSPY_RATE") if rate_hz is None else str(rate_hz)
    mode = mode or os.environ.get("CLOUDPROF_PYSPY_MODE") or DEFAULT_MODE
    if mode not in MODES:
        raise ProfilerUnavailable(f"unknown py-spy mode {mode!r} (choose from {', '.join(MODES)})")
    try:
        rate = int(rate_text) if rate_text else DEFAULT_RATE_HZ
    except ValueError:
        rate = 0
    if not 1 <= rate <= 1000:
        raise ProfilerUnavailable(f"py-spy rate must be 1..1000 samples/s, not {rate_text!r}")
    return rate, mode


class PySpyProfiler(Profiler):
    """Sample the trial with ``py-spy record``; SIGINT makes it write its file and exit.

    ``--profile cpu``: $CLOUDPROF_PYSPY_MODE, else non-blocking (top functions only).
    """

    kind = "cpu"
    tool = "py-spy"

    def __init__(self, rate_hz: int | None = None, mode: str | None = None) -> None:
        self._asked = (rate_hz, mode)
        self.rate_hz, self.mode = DEFAULT_RATE_HZ, DEFAULT_MODE  # set from _asked by start()
        self.proc: subprocess.Popen[bytes] | None = None
        self.out: Path | None = None
        self.target: Target | None = None
        self.native = False
        self.started_at = 0.0

    def _launch(self, exe: str, native: bool) -> subprocess.Popen[bytes]:
        assert self.out is not None and self.target is not None
        (self.out / SPEEDSCOPE_FILE).unlink(missing_ok=True)  # the file says it finished
        argv = [exe, "record", "--pid", str(self.target.pid), "--format", "speedscope",
                "--threads", "--rate", str(self.rate_hz),
                "--output", str(self.out / SPEEDSCOPE_FILE)]  # fmt: skip
        if native:  # idle samples are classed by their native frames; without, left out
            argv += ["--native", "--idle"]
        elif self.mode == "nonblocking":
            argv.append("--nonblocking")
        if self.target.subprocesses:
            argv.append("--subprocesses")
        # stderr to a file, not a pipe: a chatty py-spy must never block on a full pipe
        # (in blocking mode it would hold the trial paused).
        with open(self.out / STDERR_FILE, "wb") as err:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=err)  # fmt: skip

    def _stderr(self) -> str:
        assert self.out is not None
        try:
            return last_line((self.out / STDERR_FILE).read_text(errors="replace"))
        except OSError:
            return "no output"

    def start(self, out: Path, target: Target) -> None:
        self.rate_hz, self.mode = settings(*self._asked)
        self.native = self.mode == "native"
        exe = find_pyspy()
        if exe is None:
            raise ProfilerUnavailable("py-spy is not installed (pip install py-spy)")
        self.out, self.target = out, target
        out.mkdir(parents=True, exist_ok=True)
        if target.in_process:
            allow_descendants_to_trace()
        reason = ""
        # py-spy cannot unwind native frames everywhere: then Python frames only
        for native in (True, False) if self.native else (False,):
            proc = self._launch(exe, native)
            deadline = time.monotonic() + 0.5
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            # py-spy also ends here when the job does (a job shorter than this wait): its
            # file written and exit 0 are a whole profile, not a failure to sample.
            if proc.poll() is None or (proc.returncode == 0
                                       and (out / SPEEDSCOPE_FILE).is_file()):
                self.proc, self.native, self.started_at = proc, native, time.monotonic()
                return
            reason = self._stderr()
        raise ProfilerUnavailable(f"py-spy cannot sample pid {target.pid}: {reason}")

    def stop(self) -> dict[str, Any]:
        assert self.proc is not None and self.out is not None and self.target is not None
        seconds = time.monotonic() - self.started_at
        failed = self.proc.poll() not in (None, 0)  # ended by itself: start's wait was short
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        path = self.out / SPEEDSCOPE_FILE
        if not path.exists() and failed:  # as start says it, on a host too loaded to see it
            raise ProfilerUnavailable(f"py-spy cannot sample pid {self.target.pid}: "
                                      f"{self._stderr()}")
        if not path.exists():
            raise ProfilerUnavailable(f"py-spy wrote no profile: {self._stderr()}")
        doc = json.loads(path.read_text(encoding="utf-8"))
        summary = summarize_speedscope(
            doc, exclude_tids=self.target.exclude_tids,
            exclude_thread_names=self.target.exclude_thread_names, native=self.native,
            own_dirs=self.target.own_dirs,
        )  # fmt: skip
        svg = self.out / FLAMEGRAPH_FILE
        svg.write_text(flamegraph_svg(doc, title=f"py-spy, pid {self.target.pid}"), "utf-8")
        summary.update(
            kind=self.kind, tool=self.tool, rate_hz=self.rate_hz, native_frames=self.native,
            mode=self.mode,
            seconds=round(seconds, 3), files=[SPEEDSCOPE_FILE, FLAMEGRAPH_FILE],
        )  # fmt: skip
        return summary


class NativePySpyProfiler(PySpyProfiler):
    """``--profile gil``: native frames (py-spy pauses the job per sample), for the shares."""

    def __init__(self, rate_hz: int | None = None) -> None:
        super().__init__(rate_hz, "native")
