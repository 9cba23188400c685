"""What is on the Python heap at a process's memory high-water mark: object types by size.

The memory-profiling article's muppy step, automated: memray says which call
site allocated the bytes alive at the peak; this says what they are (a
million ``dict``, one 800 MB ``ndarray``). A thread polls the process's
resident memory and, each time it has passed the last census's by 5 % or 1 MiB
and stopped rising for a moment, counts
the objects the garbage collector tracks plus the objects those refer to
(strings, bytes, arrays, which the collector does not track), by type, with
``sys.getsizeof`` (an array that owns its buffer counts it). Of the censuses
taken at new resident-memory highs, the one that found the most Python heap is
kept: resident memory can go on rising after the job freed its objects (the
allocator keeps freed pages, memray's own buffers grow), and a census there, of
an emptied heap, once replaced the one that saw the job's 32 MiB of objects.

Standard library only: this file runs inside a user's ``--command`` Python
(loaded by ``sitecustomize`` from this folder, first on its PYTHONPATH), which
need not have cloudprof installed; the runner imports it for in-process
workloads as ``workloads.profilers.hook.cloudprof_heap``.
"""

import gc
import json
import os
import sys
import threading
import time

CENSUS_GROWTH = 1.05  # a new census when resident memory is 5 % above the last one's,
CENSUS_STEP = 1 << 20  # or 1 MiB above it, whichever comes first (a small job's peak)
POLL_S = 0.1
MIN_GAP_S = 0.25  # a census walks every object while holding the GIL: not more often,
GAP_PER_CENSUS_S = 4  # and at least 4 x the last census's time apart (<= ~20 % of the run)
PLATEAU = 1.01  # and only once growth pauses (a peak is where growth stops);
BIG_GROWTH = 1.2  # 20 % above the last census: a census now, however recent the last
SETTLE_S = 1.0  # none in a process's first second: its imports, not the job's heap, and a
#                 census per freshly spawned pool worker slowed the very trial it profiles
TOP_TYPES = 10
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
FILE_ENV = "CLOUDPROF_HEAP_FILE"


def resident_bytes():
    """This process's resident set size now (Linux), or None where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return None


def census(top=TOP_TYPES):
    """The heap's object types by total size: the largest ``top``, and the totals."""
    seen = set()
    sizes = {}
    counts = {}

    def add(obj):
        key = id(obj)
        if key in seen:
            return
        seen.add(key)
        name = _type_name(type(obj))
        try:
            size = sys.getsizeof(obj)
        except Exception:  # a broken __sizeof__ in someone's extension type
            size = 0
        sizes[name] = sizes.get(name, 0) + size
        counts[name] = counts.get(name, 0) + 1

    # every tracked object, then what they refer to that the collector does not track
    # (strings, numbers, arrays, and containers it untracked, such as a dict of atoms),
    # followed through those untracked containers too, as muppy does
    todo = gc.get_objects()
    for obj in todo:
        add(obj)
    while todo:
        found = []
        for obj in todo:
            for ref in gc.get_referents(obj):
                if not gc.is_tracked(ref) and id(ref) not in seen:
                    add(ref)
                    found.append(ref)
        todo = found
    ranked = sorted(sizes, key=sizes.__getitem__, reverse=True)
    return {
        "objects": sum(counts.values()),
        "bytes": sum(sizes.values()),
        "top_types": [{"type": n, "count": counts[n], "bytes": sizes[n]} for n in ranked[:top]],
    }


def _type_name(kind):
    module = getattr(kind, "__module__", "builtins")
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


class HeapWatch:
    """Census at each new resident-memory high; ``result()`` is the one of them that found
    the most Python heap (see the module)."""

    def __init__(self, poll_s=POLL_S):
        self.poll_s = poll_s
        self.best = None  # (resident bytes, census, seconds into the watch)
        self.peak_rss = 0
        self.censuses = 0
        self.census_s = 0.0
        self.started = time.monotonic()
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name="cloudprof-heap", daemon=True)
        self.last_census = -MIN_GAP_S
        self.last_census_s = 0.0
        self.last_rss = 0
        self.census_rss = 0  # resident bytes at the last census: the next one's threshold

    def start(self):
        self.thread.start()
        return self

    def _loop(self):
        while not self.done.wait(self.poll_s):
            self.look()

    def look(self, force=False):
        rss = resident_bytes()
        if rss is None:
            return
        now = time.monotonic()
        with self.lock:
            rising, self.last_rss = rss > self.last_rss * PLATEAU, rss
            self.peak_rss = max(self.peak_rss, rss)
            last = self.census_rss
            gap = max(MIN_GAP_S, GAP_PER_CENSUS_S * self.last_census_s)
            step = min(last * CENSUS_GROWTH, last + CENSUS_STEP)
            soon = now - self.last_census < gap and rss < last * BIG_GROWTH
            young = now - self.started < SETTLE_S
            if not force and (rising or rss < step or soon or young):
                return
            if force and rss <= last:
                return
            t0 = time.monotonic()
            found = census()
            self.last_census_s = time.monotonic() - t0
            self.census_s += self.last_census_s
            self.censuses += 1
            self.last_census = now
            self.census_rss = rss
            if self.best is None or found["bytes"] >= self.best[1]["bytes"]:
                self.best = (rss, found, now - self.started)

    def stop(self):
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()
        self.look(force=True)
        return self.result()

    def result(self):
        with self.lock:
            if self.best is None:
                return None
            rss, found, at = self.best
            return dict(found, rss_bytes=rss, peak_rss_bytes=self.peak_rss, at_s=round(at, 3),
                        censuses=self.censuses, census_s=round(self.census_s, 3),
                        pid=os.getpid())


def install(path):
    """In a ``--command``'s process: watch, and write the census to ``path.<pid>`` as it
    changes and at exit (a job stopped by SIGTERM keeps the last one written).

    A process the job starts as a new interpreter (spawn, subprocess) loads the hook
    and has a census of its own; a forked one has no thread of its census and is left
    out: starting one in the child raced memray's own fork handling and broke its
    capture."""
    watch = HeapWatch()
    written = [None]

    def write():
        found = watch.result()
        if found is None or found is written[0]:
            return
        written[0] = found
        target = f"{path}.{os.getpid()}"
        tmp = f"{target}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(found, f)
            os.replace(tmp, target)
        except OSError:
            pass

    def loop():
        while not watch.done.wait(watch.poll_s):
            watch.look()
            write()

    import atexit

    watch.thread = threading.Thread(target=loop, name="cloudprof-heap", daemon=True)
    watch.thread.start()
    atexit.register(lambda: (watch.look(force=True), write()))
    return watch
