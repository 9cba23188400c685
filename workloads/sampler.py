"""The profiling agent's sampler, which runs in a process of its own.

Why a process and not a thread: a sampling thread inside the profiled Python
process must take the GIL for every sample, and at 100 Hz the workers waiting
for it between their numpy calls cost about twice the sampler's own CPU in
throughput (docs/benchmarks.md measured both side by side). From its own process the
sampler reads ``/proc/PID`` — which needs nothing from the profiled process —
and the profiled process never runs a line of profiling code.

The cheap paths stay cheap: every sample is a ``pread`` of /proc/PID/stat and
/proc/PID/io on descriptors opened once (see ``procfs``); the process's CPU time
comes from its CPU clock (nanoseconds, not 10 ms ticks) when it is one process.
The expensive reads (per-process VmHWM, GPU, USS/PSS from smaps_rollup) run on
a slow tick at most once a second — USS/PSS less often when reading them would
cost more than 0.2% of a core (it scales with RSS). A command's tree is searched
for new children five times a second (a few small reads).

The sampler process runs under SCHED_BATCH (``lower_priority``): waking, it
never preempts a worker. It keeps how late each sample came and counts the
slots it missed, and says so in its result: a low-priority sampler on a busy
host samples less often than asked, and the report must not claim the rate.

``Sampler`` is the sampling logic; ``Agent`` (agent.py) drives it, in this
process for the zero-rate baseline and otherwise in a process of its own, which runs
``workloads.sampler_process.main`` (``python -S -c``: agent.py's ``SAMPLER_MAIN``, started
without ``site``). The two talk over the child's stdin/stdout in lines:

    parent → child   go <t0>              start sampling; t0 on the shared monotonic clock
                     stop                 take a last sample, send the result, exit
    child → parent   ready                readers open, GPU probed
                     begun                the first sample is taken (latest RSS is set)
                     breach <rss>         the memory budget was crossed (first time only;
                                          can precede "begun", whose first sample may cross it)
                     result <n>           then n bytes: the ``SamplerResult`` (``marshal``)

The unit counter and the latest RSS cross through ``shared.SharedInt``, so
neither side wakes the other to exchange them.
"""

from __future__ import annotations

import marshal
import os
import time
from array import array

from workloads import procfs
from workloads.shared import SharedInt

# CPU % divides the CPU time read by the time it was read at (``tc``): a sampler preempted
# between the two reads counts its wait as time the process did not run in one interval and
# as time it did in the next (150 %+ for one busy thread on a loaded host). A pair whose reads
# took longer than this is read again (a CPU clock read is a microsecond's syscall).
PAIR_WINDOW_S = 0.0005


def cpu_read_at(read_cpu: Callable[[], float], clock: Callable[[], float] = time.perf_counter,
                tries: int = 3) -> tuple[float, float]:  # fmt: skip
    """``(cpu, tc)`` read back to back: ``read_cpu()`` and the clock right after it, again
    while the two took longer than ``PAIR_WINDOW_S`` (at most ``tries`` reads)."""
    for _ in range(tries):
        start = clock()
        cpu = read_cpu()
        at = clock()
        if at - start <= PAIR_WINDOW_S:
            break
    return cpu, at

# This module and sampler_process are all the sampler process imports, and its start is paid
# before every trial's t = 0: it runs without ``site`` (``python -S``, see agent.py) and
# imports no more than it uses. So no dataclasses (inspect, ast, dis: ~15 ms), json or
# pickle (re, ...), typing or contextlib: its config and result are plain classes that cross
# the pipe with ``marshal`` (builtin; the same interpreter on both sides), and its type
# names are for checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# The sampler's CPU policy. "batch" (SCHED_BATCH) and "idle" (SCHED_IDLE) never preempt
# a running worker when the sampler wakes: on a saturated host it waits for the next
# scheduler tick (≤ 4 ms at HZ=250) or a free core; "idle" also has the least weight, so it
# may wait longer. "normal" wakes at once. The lateness is measured and reported either way.
SCHED_POLICIES = ("batch", "idle", "normal")
NO_PYNVML = "no GPU metrics: nvidia-ml-py is not installed (pip install 'cloudprof[gpu]')"
SMAPS_DUTY = 0.002  # USS/PSS reads may use at most 0.2% of one core


DEFAULT_SCHED = "batch"


class SamplerConfig:
    """What to sample and how; crosses to the sampler process as ``encode()``'s one word."""

    def __init__(
        self, pid: int, tree: bool = False, relative: bool = False, sample_hz: float = 10.0,
        memory_budget: int | None = None, slow_interval_s: float = 1.0,
        children_interval_s: float = 1.0, gpu: bool = True, units_fd: int | None = None,
        rss_fd: int | None = None, sched: str = DEFAULT_SCHED, cgroup_stat: str | None = None,
    ) -> None:  # fmt: skip
        self.pid = pid
        self.tree = tree  # include the target's descendants (a command's process tree)
        self.relative = relative  # counters from the first sample on (a long-lived target)
        self.sample_hz = sample_hz
        self.memory_budget = memory_budget
        self.slow_interval_s = slow_interval_s
        self.children_interval_s = children_interval_s
        self.gpu = gpu
        self.units_fd = units_fd  # a SharedInt with the units done so far
        self.rss_fd = rss_fd  # a SharedInt the sampler keeps at the latest RSS
        self.sched = sched  # the sampler process's CPU policy: one of SCHED_POLICIES
        # the tree's memory cgroup's memory.stat (workloads.cgroup): its anon and mapped-file
        # pages, each charged once, for the held series; None: summed from /proc per process
        self.cgroup_stat = cgroup_stat

    def encode(self) -> str:
        """The config as one command-line word (marshal's bytes, in hex)."""
        return marshal.dumps(vars(self)).hex()

    @classmethod
    def decode(cls, word: str) -> SamplerConfig:
        return cls(**marshal.loads(bytes.fromhex(word)))


class SamplerResult:
    """What the sampler hands back at the end (rows in protocol.TIMESERIES_COLUMNS order);
    it crosses to the agent as ``to_bytes()`` and comes back by ``from_bytes()``."""

    def __init__(
        self, rows: list[tuple] | None = None, scheduled: int = 0, missed: int = 0,
        lag_ms: dict[str, float] | None = None, sched_policy: str | None = None,
        cpu_seconds: float = 0.0, startup_cpu_seconds: float = 0.0,
        proc_peaks: dict[int, int] | None = None, gpu_names: list[str] | None = None,
        gpu_note: str | None = None, budget_breach_t: float | None = None,
        budget_breach_rss_bytes: int | None = None, error: str | None = None,
        held_file_bytes: int = 0, held_file_sum_bytes: int = 0, held_anon_from: str | None = None,
        held_gap_bytes: int | None = None,
    ) -> None:  # fmt: skip
        self.rows: list[tuple] = [] if rows is None else rows
        self.scheduled = scheduled  # samples taken on the clock, not the ones at start and stop
        self.missed = missed  # samples due on the clock but skipped: the sampler woke too late
        self.lag_ms = lag_ms  # how late the scheduled samples came: p50, p99, max
        self.sched_policy = sched_policy  # what the sampler process got (``lower_priority``)
        self.cpu_seconds = cpu_seconds  # the sampling loop's own CPU
        self.startup_cpu_seconds = startup_cpu_seconds  # the sampler process's start
        self.proc_peaks: dict[int, int] = {} if proc_peaks is None else proc_peaks  # per process
        self.gpu_names = gpu_names
        self.gpu_note = gpu_note  # why there are no GPU metrics, in one line
        self.budget_breach_t = budget_breach_t
        self.budget_breach_rss_bytes = budget_breach_rss_bytes
        self.error = error
        # the held series' file part at its largest (file pages counted once), and the sum of
        # each process's own file pages at its largest (what counting them per process gives)
        self.held_file_bytes = held_file_bytes
        self.held_file_sum_bytes = held_file_sum_bytes
        self.held_anon_from = held_anon_from  # "cgroup memory.stat" | "statm sum" | None
        # the most the cgroup was charged besides what the tree held (page cache, kernel
        # memory) at any sample: its high-water mark less this bounds the held peak from below
        self.held_gap_bytes = held_gap_bytes

    def to_bytes(self) -> bytes:
        return marshal.dumps(vars(self))

    @classmethod
    def from_bytes(cls, data: bytes) -> SamplerResult:
        return cls(**marshal.loads(data))


class _Gpu:
    """NVML through pynvml (``pip install 'cloudprof[gpu]'``), imported lazily.

    ``open()`` returns the reader, or None and one line saying why there is none.
    Each read gives the whole device's memory and utilisation and, where NVML
    lists per-process use (not in every container: NVML may see host pids only),
    the memory and SM utilisation of the trial's own processes.
    """

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self.nvml = nvml
        self.handles = handles
        self.names = []
        self._seen_us = 0  # the last process-utilisation sample already read
        for h in handles:
            name = nvml.nvmlDeviceGetName(h)
            self.names.append(name.decode() if isinstance(name, bytes) else str(name))

    @classmethod
    def open(cls) -> tuple[_Gpu | None, str | None]:
        try:
            import pynvml  # type: ignore[import-not-found]
        except ImportError:
            return None, NO_PYNVML
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            if count == 0:
                return None, "no GPU metrics: NVML sees no GPU"
            return cls(pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]), None
        except Exception as exc:  # no driver, no device: GPU is simply absent
            return None, f"no GPU metrics: NVML cannot start ({' '.join(str(exc).split())})"

    def sample(self, pids: set[int]) -> tuple[int, float, int | None, float | None] | None:
        """Device memory used (bytes, all devices), mean utilisation (0..100), and the
        memory and SM utilisation of ``pids`` (None where NVML does not list them)."""
        try:
            mem = sum(int(self.nvml.nvmlDeviceGetMemoryInfo(h).used) for h in self.handles)
            util = [float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self.handles]
        except Exception:
            return None
        return mem, sum(util) / len(util), self._proc_mem(pids), self._proc_util(pids)

    def _proc_mem(self, pids: set[int]) -> int | None:
        total, seen = 0, False
        for h in self.handles:
            for call in ("nvmlDeviceGetComputeRunningProcesses",
                         "nvmlDeviceGetGraphicsRunningProcesses"):  # fmt: skip
                try:
                    procs = getattr(self.nvml, call)(h)
                except Exception:  # older driver or stand-in without the call
                    continue
                for p in procs:
                    if int(p.pid) in pids:
                        seen = True
                        total += int(p.usedGpuMemory or 0)
        return total if seen else None

    def _proc_util(self, pids: set[int]) -> float | None:
        best: float | None = None
        newest = self._seen_us
        for h in self.handles:
            try:
                samples = self.nvml.nvmlDeviceGetProcessUtilization(h, self._seen_us)
            except Exception:  # no new samples (NVML says "not found"), or not supported
                continue
            for smp in samples:
                newest = max(newest, int(smp.timeStamp))
                if int(smp.pid) in pids:
                    best = (best or 0.0) + float(smp.smUtil)
        self._seen_us = newest
        return best

    def close(self) -> None:
        try:  # noqa: SIM105 - no contextlib in the sampler process (see the imports)
            self.nvml.nvmlShutdown()
        except Exception:  # the device went away: nothing left to shut down
            pass


class _Series:
    """The time series as columns of machine numbers, allocated ahead and grown by doubling.

    Why not a list of row tuples: at 100 Hz the sampler wakes into cold caches
    every 10 ms, where every object it builds or touches costs; here a sample
    stores ten numbers by index and builds nothing (no 16-field tuple, no
    ``round`` calls, no growing list), and CPU %, rounding and the rows are made
    once, in ``rows()``. ``-1`` stands for "not measured" in the integer columns
    (I/O, units).
    """

    _KINDS = (("t", "d"), ("rss", "q"), ("user", "d"), ("system", "d"), ("cpu", "d"),
              ("tc", "d"), ("threads", "q"), ("rd", "q"), ("wr", "q"),
              ("units", "q"), ("held", "q"))  # fmt: skip

    def __init__(self, capacity: int = 1024) -> None:
        self.n = 0
        self.capacity = capacity
        for name, code in self._KINDS:
            setattr(self, name, array(code, bytes(8 * capacity)))
        self.slow: dict[int, tuple] = {}  # row → (uss, pss, children, gpu) from a slow tick
        self.joined: dict[int, float] = {}  # row → CPU of processes first seen just before it

    def add(self, t: float, rss: int, user: float, system: float, cpu: float, tc: float,
            threads: int, rd: int, wr: int, units: int) -> int:
        """Store one sample; returns its row. ``tc`` is when ``cpu`` was read (see ``rows``)."""
        i = self.n
        if i == self.capacity:
            self.grow()
        self.t[i] = t
        self.rss[i] = rss
        self.user[i] = user
        self.system[i] = system
        self.cpu[i] = cpu
        self.tc[i] = tc
        self.threads[i] = threads
        self.rd[i] = rd
        self.wr[i] = wr
        self.units[i] = units
        self.n = i + 1
        return i

    def grow(self) -> None:
        for name, code in self._KINDS:
            getattr(self, name).extend(array(code, bytes(8 * self.capacity)))
        self.capacity *= 2

    def rows(self, t0: float) -> list[tuple]:
        """Rows in protocol.TIMESERIES_COLUMNS order (CPU % over the interval before each).

        CPU % divides by the time between the CPU clock's reads (``tc``), not
        between wake-ups (``t``): a sampler preempted between the two would
        otherwise count the delay's CPU against the shorter interval (150 %+ for
        one busy thread on a loaded host).
        """
        out = []
        t, cpu, tc = self.t, self.cpu, self.tc
        for i in range(self.n):
            pct = 0.0
            if i:
                dt = tc[i] - tc[i - 1]
                used = cpu[i] - cpu[i - 1] - self.joined.get(i, 0.0)
                pct = 100.0 * used / dt if dt > 0 else 0.0
            uss, pss, children, gpu = self.slow.get(i, (None, None, None, None))
            rd, wr, units, held = self.rd[i], self.wr[i], self.units[i], self.held[i]
            out.append((
                round(t[i] - t0, 6), self.rss[i], round(self.user[i], 3),
                round(self.system[i], 3), round(max(pct, 0.0), 2), self.threads[i],
                rd if rd >= 0 else None, wr if wr >= 0 else None, uss, pss, children,
                units if units >= 0 else None, *(gpu or (None, None, None, None)),
                held if held > 0 else None,  # 0: not measured (a lone process's lean loop)
            ))  # fmt: skip
        return out


class Sampler:
    """Samples one process or a process tree; ``begin`` → ``tick``… → ``end``."""

    def __init__(
        self,
        cfg: SamplerConfig,
        *,
        units: Callable[[], int] | None = None,
        on_breach: Callable[[int], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.units = units
        self._units_cell: Any = None  # the shared counter's ctypes cell: read without a call
        self._cells: list[SharedInt] = []  # keeps the mappings alive
        if units is None and cfg.units_fd is not None:
            self._cells.append(SharedInt(cfg.units_fd))
            self._units_cell = self._cells[-1]._cell
        self._rss_cell: Any = None
        if cfg.rss_fd is not None:
            self._cells.append(SharedInt(cfg.rss_fd))
            self._rss_cell = self._cells[-1]._cell
        self.on_breach = on_breach
        self.latest_rss = 0
        self.result = SamplerResult()
        self._series = _Series()
        self.lags = array("d")  # seconds each scheduled sample came after its time
        self._gpu, self.result.gpu_note = _Gpu.open() if cfg.gpu else (None, None)
        if self._gpu is not None:
            self.result.gpu_names = self._gpu.names
        self._cpu_clock = None if cfg.tree else procfs.cpu_clock(cfg.pid)
        self._own_pid = os.getpid()
        self._readers: dict[int, procfs.ProcReader] = {}
        # the held series of a tree: statm per process (anon), or the cgroup's memory.stat
        self._statm: dict[int, int] = {}
        self._cg_stat: int | None = None
        self._cg_usage: int | None = None
        if cfg.tree and cfg.cgroup_stat:
            try:
                self._cg_stat = os.open(cfg.cgroup_stat, os.O_RDONLY)
                where = cfg.cgroup_stat.rpartition("/")[0]
                usage = where + "/memory.usage_in_bytes"  # v1; v2: memory.current
                self._cg_usage = os.open(usage if os.path.exists(usage)
                                         else where + "/memory.current", os.O_RDONLY)
            except OSError:
                self._cg_stat = self._cg_usage = None
        if cfg.tree:
            self.result.held_anon_from = ("cgroup memory.stat" if self._cg_stat is not None
                                          else "statm sum")
        self._file_once = 0  # file pages the tree maps, counted once, from the last slow tick
        self._last_gap: int | None = None  # the previous sample's cgroup gap (_held_now)
        self._last: dict[int, procfs.ProcSample] = {}
        self._dead = [0.0, 0.0, 0, 0]  # user, system, read, write of exited processes
        self._joined_cpu = 0.0
        self._base: tuple[float, float, int, int] = (0.0, 0.0, 0, 0)
        self._cpu_base = 0.0
        self._children = 0
        self._next_children = self._next_slow = self._next_smaps = 0.0
        self._next_due = 0.0  # the earlier of the two above: one comparison per tick
        # USS, PSS, GPU (device mem, util, the trial's mem, util) from the last slow tick,
        # not yet attached to a sample
        self._slow: tuple[int | None, int | None, tuple | None] | None = None
        self._t0 = 0.0
        self._add_process(cfg.pid)

    # -- the trial ---------------------------------------------------------------------------

    def begin(self, t0: float) -> None:
        """The first sample, at the trial's t = 0; counters start here when ``relative``."""
        self._t0 = t0
        now = time.perf_counter()
        first = self._read_tree()
        if first is not None and self.cfg.relative:
            _rss, user, system, _thr, rd, wr = first
            self._base = (user, system, max(rd, 0), max(wr, 0))
        self._cpu_base = self._cpu_now(first) if self.cfg.relative else 0.0
        self._discover(now)
        self._slow_tick(now)
        self.sample(now, first)

    def end(self, now: float | None = None) -> SamplerResult:
        self.sample(now if now is not None else time.perf_counter())
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        cg = [fd for fd in (self._cg_stat, self._cg_usage) if fd is not None]
        for fd in [*self._statm.values(), *cg]:
            try:  # noqa: SIM105 - no contextlib in the sampler process (see the imports)
                os.close(fd)
            except OSError:
                pass
        self._statm.clear()
        self._cg_stat = self._cg_usage = None
        if self._gpu is not None:
            self._gpu.close()
        ser = self._series
        if not self.cfg.tree and ser.n:  # the lean loop keeps no per-process peak: the series does
            peaks = self.result.proc_peaks
            peaks[self.cfg.pid] = max(peaks.get(self.cfg.pid, 0), max(ser.rss[: ser.n]))
        self.result.rows = ser.rows(self._t0)
        if self.lags:
            lags = sorted(self.lags)
            self.result.lag_ms = {
                "p50": round(1e3 * lags[len(lags) // 2], 3),
                "p99": round(1e3 * lags[min(len(lags) - 1, int(0.99 * len(lags)))], 3),
                "max": round(1e3 * lags[-1], 3),
            }
        return self.result

    def tick(self, now: float) -> bool:
        """One scheduled sample (with the slow work when due); False once the tree is gone."""
        if now >= self._next_due:
            self.tick_due(now)
        self.sample(now)
        self.result.scheduled += 1
        return bool(self._readers)

    def tick_due(self, now: float) -> None:
        """The work of a tick that is not every tick's: new children, the slow reads."""
        if now >= self._next_children:
            self._discover(now)
        if now >= self._next_slow:
            self._slow_tick(now)
        self._next_due = min(self._next_children, self._next_slow)

    # -- sampling ----------------------------------------------------------------------------

    def _add_process(self, pid: int, joined: bool = False) -> None:
        if pid in self._readers:
            return
        try:
            reader = procfs.ProcReader(pid)
            first = reader.read()
        except procfs.ProcGone:
            return
        self._readers[pid] = reader
        if self.cfg.tree and self._cg_stat is None:
            try:  # noqa: SIM105 - no contextlib in the sampler process (see the imports)
                self._statm[pid] = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
            except OSError:
                pass
        if joined:  # CPU it used before we saw it is real, but not this interval's
            self._joined_cpu += first.cpu_user_s + first.cpu_system_s

    def _discover(self, now: float) -> None:
        self._next_children = now + self.cfg.children_interval_s
        kids = [k for k in procfs.descendants(self.cfg.pid) if k != self._own_pid]
        self._children = len(kids)
        if self.cfg.tree:
            for pid in kids:
                self._add_process(pid, joined=True)

    def _read_tree(self) -> tuple[int, float, float, int, int, int] | None:
        """Sum of every tracked process; exited ones keep contributing their CPU and I/O.

        I/O is -1 where no process's /proc/PID/io is readable."""
        if len(self._readers) == 1 and not any(self._dead):
            return self._read_one()
        rss = threads = 0
        user, system, rd, wr = self._dead
        io_seen = False
        peaks = self.result.proc_peaks
        for pid, reader in list(self._readers.items()):
            try:
                s = reader.read()
            except procfs.ProcGone:
                gone = self._gone(pid)  # what it had used: in _dead from the next sample on
                user, system = user + gone[0], system + gone[1]
                rd, wr = rd + gone[2], wr + gone[3]
                continue
            self._last[pid] = s
            rss += s.rss_bytes
            user += s.cpu_user_s
            system += s.cpu_system_s
            threads += s.threads
            if s.read_bytes is not None:
                io_seen = True
                rd += s.read_bytes
                wr += s.write_bytes or 0
            if s.rss_bytes > peaks.get(pid, 0):
                peaks[pid] = s.rss_bytes
        if not self._readers:
            return None
        return rss, user, system, threads, rd if io_seen else -1, wr if io_seen else -1

    def _read_one(self) -> tuple[int, float, float, int, int, int] | None:
        """The common case, one process and none exited yet: no loop, no sums."""
        pid, reader = next(iter(self._readers.items()))
        try:
            s = reader.read()
        except procfs.ProcGone:
            self._gone(pid)
            return None
        self._last[pid] = s
        if s.rss_bytes > self.result.proc_peaks.get(pid, 0):
            self.result.proc_peaks[pid] = s.rss_bytes
        rd, wr = s.read_bytes, s.write_bytes
        return (s.rss_bytes, s.cpu_user_s, s.cpu_system_s, s.threads,
                -1 if rd is None else rd, -1 if wr is None else wr)  # fmt: skip

    def _gone(self, pid: int) -> tuple[float, float, int, int]:
        """A process exited: close its reader and keep its last CPU and I/O in the totals
        (``_dead``); returns them (user, system, read, write)."""
        self._readers.pop(pid).close()
        statm = self._statm.pop(pid, None)
        if statm is not None:
            os.close(statm)
        prev = self._last.pop(pid, None)
        if prev is None:
            return (0.0, 0.0, 0, 0)
        gone = (prev.cpu_user_s, prev.cpu_system_s, prev.read_bytes or 0, prev.write_bytes or 0)
        self._dead = [a + b for a, b in zip(self._dead, gone, strict=True)]
        return gone

    def _cpu_now(self, tree: tuple | None) -> float:
        """CPU seconds so far: the process's CPU clock (ns) when it is one process, else ticks."""
        if self._cpu_clock is not None:
            try:
                return time.clock_gettime(self._cpu_clock)
            except OSError:
                self._cpu_clock = None
        return (tree[1] + tree[2]) if tree is not None else 0.0

    def sample(self, now: float, tree: Any = None) -> None:
        tree = tree if tree is not None else self._read_tree()
        if tree is None:
            return
        rss, user, system, threads, rd, wr = tree
        base = self._base
        ser = self._series
        if self._units_cell is not None:
            units = self._units_cell.value
        else:
            units = self.units() if self.units is not None else -1
        cpu, tc = cpu_read_at(lambda: self._cpu_now(tree))
        i = ser.add(now, rss, user - base[0], system - base[1], cpu - self._cpu_base, tc, threads,
                    rd - base[2] if rd >= 0 else -1, wr - base[3] if wr >= 0 else -1, units)
        if self.cfg.tree:
            ser.held[i] = self._held_now()
        self._after(i, now, rss)

    def _held_now(self) -> int:
        """What the tree holds now: anonymous pages + the file pages it maps, counted once.

        Anonymous: the cgroup's own count (each page charged once, copy-on-write pages
        shared after a fork included once), else the sum of each process's RssAnon (such
        pages then count once per process that shares them: an overestimate). File pages:
        the larger of the last slow tick's estimate (``_slow_tick``) and the cgroup's mapped
        file pages now (exact for the pages this tree read in, blind to pages another cgroup
        had cached): each is a lower bound of the pages mapped, counted once.
        """
        if self._cg_stat is not None:
            try:
                anon, mapped = cgroup_held(os.pread(self._cg_stat, 8192, 0))
                if self._cg_usage is not None:
                    usage = int(os.pread(self._cg_usage, 64, 0))
                    # read again after the usage: a tree freeing memory between the reads
                    # would make usage less the first read's pages look like page cache
                    again = cgroup_held(os.pread(self._cg_stat, 8192, 0))
                    if sum(again) > anon + mapped:
                        anon, mapped = again
            except (OSError, ValueError):
                return 0
            held = anon + max(self._file_once, mapped)
            if self._cg_usage is not None:
                # Charged, not held: page cache, kernel memory. memory.stat can lag the usage
                # counter for a moment while the tree allocates fast (its figures are flushed
                # from per-CPU counters), which reads as a gap that is not there: a gap counts
                # once two samples in a row show it.
                gap = max(usage - anon - mapped, 0)
                res = self.result
                steady = 0 if self._last_gap is None else min(gap, self._last_gap)
                res.held_gap_bytes = max(res.held_gap_bytes or 0, steady)
                self._last_gap = gap
            return held
        anon = 0
        for fd in self._statm.values():
            got = procfs.read_anon(fd)
            if got is not None:
                anon += got
        return anon + self._file_once if anon else 0

    def _after(self, i: int, now: float, rss: int) -> None:
        """What follows storing sample ``i``: slow values, the shared RSS, the budget."""
        ser = self._series
        if self._joined_cpu:
            ser.joined[i] = self._joined_cpu
            self._joined_cpu = 0.0
        if self._slow is not None:
            self._attach_slow(i)
        self.latest_rss = rss
        if self._rss_cell is not None:
            self._rss_cell.value = rss
        budget = self.cfg.memory_budget
        if budget is not None and rss > budget and self.result.budget_breach_t is None:
            self._breach(now, rss)

    def _attach_slow(self, i: int) -> None:
        """Values from a slow tick land on the next sample (row ``i``) only."""
        assert self._slow is not None
        uss, pss, gpu = self._slow
        self._series.slow[i] = (uss, pss, self._children, gpu)
        self._slow = None

    def _breach(self, now: float, rss: int) -> None:
        res = self.result
        res.budget_breach_t = round(now - self._t0, 3)
        res.budget_breach_rss_bytes = rss
        if self.on_breach is not None:
            try:
                self.on_breach(rss)
            except Exception as exc:  # the sampler must outlive a failing callback
                res.error = f"on_breach failed: {exc}"

    def _slow_tick(self, now: float) -> None:
        """Once a second: per-process VmHWM, GPU, and USS/PSS when their budget allows."""
        self._next_slow = now + self.cfg.slow_interval_s
        uss = pss = 0
        got = False
        if now >= self._next_smaps:
            cost = time.thread_time()
            pss_file = largest_file = file_sum = 0
            for pid in list(self._readers):
                up = procfs.read_rollup(pid)
                if up is not None:
                    got = True
                    uss += up.uss
                    pss += up.pss
                    pss_file += up.pss_file
                    file_sum += up.rss_file
                    largest_file = max(largest_file, up.rss_file)
            if got:
                # File pages counted once lie between the largest process's own (each page
                # whole) and the sum over processes; the sum of Pss counts each page shared
                # only within the tree once, and a page shared with processes outside it in
                # part. The larger of the two lower bounds is the estimate.
                self._file_once = max(pss_file, largest_file)
                res = self.result
                res.held_file_bytes = max(res.held_file_bytes, self._file_once)
                res.held_file_sum_bytes = max(res.held_file_sum_bytes, file_sum)
            cost = time.thread_time() - cost
            # smaps_rollup walks every page table: ~5 ms for 500 MB resident, far more for
            # tens of GB. Space the reads so they never take more than SMAPS_DUTY of a core.
            self._next_smaps = now + max(self.cfg.slow_interval_s, cost / SMAPS_DUTY)
        if self.cfg.tree:
            peaks = self.result.proc_peaks
            for pid in list(self._readers):
                hwm = procfs.read_hwm(pid)
                if hwm is not None and hwm > peaks.get(pid, 0):
                    peaks[pid] = hwm
        gpu = self._gpu.sample(set(self._readers)) if self._gpu is not None else None
        self._slow = (uss if got else None, pss if got else None, gpu)


def cgroup_held(stat: bytes) -> tuple[int, int]:
    """(anonymous, mapped file) bytes from a memory cgroup's memory.stat: v1's total_rss and
    total_mapped_file (shmem included), v2's anon and the larger of file_mapped and shmem."""
    anon = mapped = shmem = 0
    for line in stat.split(b"\n"):
        key, _, value = line.partition(b" ")
        if key in (b"total_rss", b"anon"):
            anon = int(value)
        elif key in (b"total_mapped_file", b"file_mapped"):
            mapped = int(value)
        elif key == b"shmem":
            shmem = int(value)
    return anon, max(mapped, shmem)
