"""Cheap reads of Linux /proc for the profiling agent.

The agent samples up to 100 times a second, so the hot path must cost a few
microseconds: each process's ``stat`` and ``io`` files are opened once and read
with one ``pread`` per sample (no new file objects, no psutil.Process), and only
the fields we need are parsed. An open /proc fd stays bound to its process, so
a recycled pid can never be confused with the one we opened.

The expensive reads (``smaps_rollup`` for USS/PSS, ``status`` for VmHWM) are
plain functions that the agent calls at most once a second.
"""

from __future__ import annotations

import os
import time
from collections import namedtuple

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# Field positions in /proc/PID/stat counted after the ")" that closes comm
# (comm may contain spaces and parentheses, so we split after the last ")").
_FLAGS, _UTIME, _STIME, _THREADS, _STARTTIME, _RSS = 6, 11, 12, 17, 19, 21
# The kernel's per-task flag of a process inside exit(): set before its memory is torn
# down, so from then on its RSS falls to 0 while it is not yet a zombie.
PF_EXITING = 0x4


# rss_bytes: int, cpu_user_s: float, cpu_system_s: float, threads: int, read_bytes: int | None,
# write_bytes: int | None. collections' namedtuple, not typing's: the sampler process imports
# this module, and typing (with re) is ~10 ms of its start.
ProcSample = namedtuple(
    "ProcSample", "rss_bytes cpu_user_s cpu_system_s threads read_bytes write_bytes")


class ProcGone(Exception):
    """The process exited (or its /proc entry is no longer readable)."""


def has_procfs() -> bool:
    return os.path.exists("/proc/self/stat")


class ProcReader:
    """One process's /proc/PID/stat and /proc/PID/io, kept open between samples."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self._stat_fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        except OSError as exc:
            raise ProcGone(pid) from exc
        self._io_fd: int | None
        try:  # /proc/PID/io needs ptrace-read access; absent it, I/O columns are null
            self._io_fd = os.open(f"/proc/{pid}/io", os.O_RDONLY)
            os.pread(self._io_fd, 512, 0)
        except OSError:
            self._io_fd = None

    def read(self) -> ProcSample:
        return ProcSample(*self.read_tuple())

    def read_tuple(self) -> tuple[int, float, float, int, int | None, int | None]:
        """``read()`` as a plain tuple: the sampler's 100 Hz loop, where a named tuple's
        Python-level constructor showed in the CPU per sample."""
        try:
            raw = os.pread(self._stat_fd, 1024, 0)
        except OSError as exc:  # ESRCH once the process has been reaped
            raise ProcGone(self.pid) from exc
        if not raw:
            raise ProcGone(self.pid)
        # maxsplit: the fields after RSS (about thirty) are never turned into objects
        fields = raw[raw.rfind(b")") + 2 :].split(None, _RSS + 1)
        # Exited (not yet reaped), or exiting: nothing of the job resident any more. An
        # exiting process read as a sample showed as RSS 0 at the end of a trial whose job
        # the runner had just stopped, and turned a leak's last slope into a fall ("ok").
        if fields[0] in (b"Z", b"X") or int(fields[_FLAGS]) & PF_EXITING:
            raise ProcGone(self.pid)
        read_bytes = write_bytes = None
        if self._io_fd is not None:
            try:
                io = os.pread(self._io_fd, 512, 0).split(None, 12)
                # rchar: N wchar: N syscr: N syscw: N read_bytes: N write_bytes: N ...
                read_bytes, write_bytes = int(io[9]), int(io[11])
            except (OSError, IndexError, ValueError):
                pass
        return (
            int(fields[_RSS]) * PAGE_SIZE,
            int(fields[_UTIME]) / CLOCK_TICKS,
            int(fields[_STIME]) / CLOCK_TICKS,
            int(fields[_THREADS]),
            read_bytes,
            write_bytes,
        )

    def close(self) -> None:
        for fd in (self._stat_fd, self._io_fd):
            if fd is not None:
                try:  # noqa: SIM105 - no contextlib in the sampler process (sampler.py)
                    os.close(fd)
                except OSError:
                    pass
        self._io_fd = None


def _status_kb(pid: int | str, key: bytes) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def age(pid: int | str = "self") -> float | None:
    """Seconds since ``pid`` started, read on the clock its start is counted on.

    The kernel records a process's start (``starttime`` in /proc/PID/stat) in clock ticks
    of ``CLOCK_BOOTTIME``, so its age is that clock now minus the start. Not ``time.time()``
    minus (boot time + start), as psutil's ``create_time()`` has it: ``btime`` in /proc/stat
    is whole seconds of the realtime clock at boot, which puts the start off by a constant of
    up to 1 s plus any step of the clock since boot (48 ms on the machine it was found on).
    Resolution one tick (1/CLK_TCK, 10 ms): the kernel truncates the start to a tick, so the
    age it gives is at most one tick longer than the true one, never shorter. None where
    /proc or the clock cannot say. A trial forked from a warm runner knows its start exactly
    and does not ask (``workloads.run.FORKED_AT``).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        ticks = int(raw[raw.rfind(b")") + 2 :].split()[_STARTTIME])
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return max(0.0, now - ticks / CLOCK_TICKS)


def read_hwm(pid: int | str = "self") -> int | None:
    """The kernel's resident-set high-water mark (VmHWM) in bytes, None if unavailable."""
    return _status_kb(pid, b"VmHWM:")


def reset_hwm(pid: int | str = "self") -> bool:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0: write "5" to clear_refs).

    Returns False where that is not possible (not Linux, an older kernel that
    rejects "5" with EINVAL, or no permission); the caller then falls back to
    ``ru_maxrss`` or the sampled series.
    """
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def read_uss_pss(pid: int | str) -> tuple[int, int] | None:
    """(USS, PSS) in bytes from smaps_rollup — walks every mapping, so call it rarely."""
    uss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith((b"Private_Clean:", b"Private_Dirty:", b"Private_Hugetlb:")):
                    uss += int(line.split()[1]) * 1024
                elif line.startswith(b"Pss:"):
                    pss = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return uss, pss


# Held memory (what a process cannot give back under a memory limit): from smaps_rollup,
# (anonymous, file + shmem pages as Pss, file + shmem pages as Rss), in bytes.
Rollup = namedtuple("Rollup", "uss pss anon pss_file rss_file")


def read_rollup(pid: int | str) -> Rollup | None:
    """USS, PSS and the held split of one process from smaps_rollup (a page-table walk: call
    it rarely). ``rss_file`` is Rss − Anonymous: the file and shmem pages it maps, each whole;
    ``pss_file`` the same pages each divided by the number of processes mapping it (Pss_File
    + Pss_Shmem, kernel ≥ 5.7; older kernels give None for the process)."""
    fields: dict[bytes, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                key, _, rest = line.partition(b":")
                if key in _ROLLUP_KEYS:
                    fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if b"Pss_File" not in fields or b"Rss" not in fields:
        return None
    uss = sum(fields.get(k, 0) for k in (b"Private_Clean", b"Private_Dirty", b"Private_Hugetlb"))
    anon = fields.get(b"Anonymous", 0)
    return Rollup(uss, fields.get(b"Pss", 0), anon,
                  fields[b"Pss_File"] + fields.get(b"Pss_Shmem", 0),
                  max(fields[b"Rss"] - anon, 0))


_ROLLUP_KEYS = frozenset((b"Rss", b"Pss", b"Pss_File", b"Pss_Shmem", b"Anonymous",
                          b"Private_Clean", b"Private_Dirty", b"Private_Hugetlb"))


def read_anon(fd: int) -> int | None:
    """Anonymous resident bytes of a process from its open /proc/PID/statm (resident − shared
    pages: the kernel's RssAnon), one ``pread``; None once it is gone."""
    try:
        fields = os.pread(fd, 128, 0).split()
        return (int(fields[1]) - int(fields[2])) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return None


def _kernel_lists_children() -> bool:
    return os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def descendants(pid: int) -> list[int]:
    """Pids of every live descendant of ``pid`` (children, grandchildren, ...).

    Uses /proc/PID/task/TID/children (one small read per thread) and falls back
    to psutil's scan of /proc when the kernel lacks CONFIG_PROC_CHILDREN.
    """
    if not _kernel_lists_children():
        import psutil

        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    out: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue
            out.extend(kids)
            stack.extend(kids)
    return out


def cpu_clock(pid: int) -> int | None:
    """The clock id of ``pid``'s CPU time (what ``clock_getcpuclockid`` returns), or None.

    It gives another process's user + system time in nanoseconds, where
    /proc/PID/stat counts 10 ms ticks — too coarse for CPU % over a 10 ms interval.
    """
    clock = ((~pid) << 3) | 2  # the kernel's MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    try:
        time.clock_gettime(clock)
    except (OSError, OverflowError, AttributeError):
        return None
    return clock
