"""The profiling agent's sampler, which runs in a process of its own.

Why a process and not a thread: a sampling thread inside the profiled Python
process must take the GIL for every sample, and at 100 Hz the workers waiting
for it between their numpy calls cost about twice the sampler's own CPU in
throughput (BENCHMARKS.md measured both side by side). From its own process the
sampler reads ``/proc/PID`` — which needs nothing from the profiled process —
and the profiled process never runs a line of profiling code.

The cheap paths stay cheap: every sample is a ``pread`` of /proc/PID/stat and
/proc/PID/io on descriptors opened once (see ``procfs``); the process's CPU time
comes from its CPU clock (nanoseconds, not 10 ms ticks) when it is one process.
The expensive reads (per-process VmHWM, GPU, USS/PSS from smaps_rollup) run on
a slow tick at most once a second — USS/PSS less often when reading them would
cost more than 0.2% of a core (it scales with RSS). A command's tree is searched
for new children five times a second (a few small reads).

``Sampler`` is the sampling logic; ``Agent`` (agent.py) drives it, in this
process for the zero-rate baseline and through ``python -m workloads.sampler``
otherwise. The two talk over the child's stdin/stdout in lines:

    parent → child   go <t0>              start sampling; t0 on the shared monotonic clock
                     stop                 take a last sample, send the result, exit
    child → parent   ready                readers open, GPU probed
                     begun                the first sample is taken (latest RSS is set)
                     breach <rss>         the memory budget was crossed (first time only;
                                          can precede "begun", whose first sample may cross it)
                     result <n>           then n bytes: the pickled ``SamplerResult``

The unit counter and the latest RSS cross through ``shared.SharedInt``, so
neither side wakes the other to exchange them.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import resource
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from workloads import procfs
from workloads.shared import SharedInt

NO_PYNVML = "no GPU metrics: nvidia-ml-py is not installed (pip install 'cloudprof[gpu]')"
SMAPS_DUTY = 0.002  # USS/PSS reads may use at most 0.2% of one core


@dataclass
class SamplerConfig:
    """What to sample and how; crosses to the sampler process as JSON."""

    pid: int
    tree: bool = False  # include the target's descendants (a command's process tree)
    relative: bool = False  # counters from the first sample on (a long-lived target)
    sample_hz: float = 10.0
    memory_budget: int | None = None
    slow_interval_s: float = 1.0
    children_interval_s: float = 1.0
    gpu: bool = True
    units_fd: int | None = None  # a SharedInt with the units done so far
    rss_fd: int | None = None  # a SharedInt the sampler keeps at the latest RSS


@dataclass
class SamplerResult:
    """What the sampler hands back at the end (rows in protocol.TIMESERIES_COLUMNS order)."""

    rows: list[tuple] = field(default_factory=list)
    scheduled: int = 0  # samples taken on the clock, not the ones at start and stop
    cpu_seconds: float = 0.0  # the sampling loop's own CPU
    startup_cpu_seconds: float = 0.0  # the sampler process's start, before the trial
    proc_peaks: dict[int, int] = field(default_factory=dict)  # per-process RSS peaks (tree)
    gpu_names: list[str] | None = None
    gpu_note: str | None = None  # why there are no GPU metrics, in one line
    budget_breach_t: float | None = None
    budget_breach_rss_bytes: int | None = None
    error: str | None = None


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
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


class Sampler:
    """Samples one process or a process tree; ``begin`` → ``sample``… → ``end``."""

    def __init__(
        self,
        cfg: SamplerConfig,
        *,
        units: Callable[[], int] | None = None,
        on_breach: Callable[[int], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.units = units
        if units is None and cfg.units_fd is not None:
            cell = SharedInt(cfg.units_fd)
            self.units = lambda: cell.value
        self.rss_cell = SharedInt(cfg.rss_fd) if cfg.rss_fd is not None else None
        self.on_breach = on_breach
        self.latest_rss = 0
        self.result = SamplerResult()
        self._gpu, self.result.gpu_note = _Gpu.open() if cfg.gpu else (None, None)
        if self._gpu is not None:
            self.result.gpu_names = self._gpu.names
        self._cpu_clock = None if cfg.tree else procfs.cpu_clock(cfg.pid)
        self._own_pid = os.getpid()
        self._readers: dict[int, procfs.ProcReader] = {}
        self._last: dict[int, procfs.ProcSample] = {}
        self._dead = [0.0, 0.0, 0, 0]  # user, system, read, write of exited processes
        self._joined_cpu = 0.0
        self._base: tuple[float, float, int, int] = (0.0, 0.0, 0, 0)
        self._prev_cpu: tuple[float, float] | None = None
        self._cpu_base = 0.0
        self._children = 0
        self._next_children = self._next_slow = self._next_smaps = 0.0
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
            self._base = (user, system, rd or 0, wr or 0)
        self._cpu_base = self._cpu_now(first) if self.cfg.relative else 0.0
        self._discover(now)
        self._slow_tick(now)
        self.sample(now, first)

    def end(self, now: float | None = None) -> SamplerResult:
        self.sample(now if now is not None else time.perf_counter())
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        if self._gpu is not None:
            self._gpu.close()
        return self.result

    def tick(self, now: float) -> bool:
        """One scheduled sample (with the slow work when due); False once the tree is gone."""
        if now >= self._next_children:
            self._discover(now)
        if now >= self._next_slow:
            self._slow_tick(now)
        self.sample(now)
        self.result.scheduled += 1
        return bool(self._readers)

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
        if joined:  # CPU it used before we saw it is real, but not this interval's
            self._joined_cpu += first.cpu_user_s + first.cpu_system_s

    def _discover(self, now: float) -> None:
        self._next_children = now + self.cfg.children_interval_s
        kids = [k for k in procfs.descendants(self.cfg.pid) if k != self._own_pid]
        self._children = len(kids)
        if self.cfg.tree:
            for pid in kids:
                self._add_process(pid, joined=True)

    def _read_tree(self) -> tuple[int, float, float, int, int | None, int | None] | None:
        """Sum of every tracked process; exited ones keep contributing their CPU and I/O."""
        rss = threads = 0
        user, system, rd, wr = self._dead
        io_seen = False
        peaks = self.result.proc_peaks
        for pid, reader in list(self._readers.items()):
            try:
                s = reader.read()
            except procfs.ProcGone:
                reader.close()
                del self._readers[pid]
                prev = self._last.pop(pid, None)
                if prev is not None:
                    gone = (prev.cpu_user_s, prev.cpu_system_s, prev.read_bytes or 0,
                            prev.write_bytes or 0)  # fmt: skip
                    self._dead = [a + b for a, b in zip(self._dead, gone, strict=True)]
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
        return rss, user, system, threads, rd if io_seen else None, wr if io_seen else None

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
        cpu_now = self._cpu_now(tree) - self._cpu_base
        user -= self._base[0]
        system -= self._base[1]
        if self._prev_cpu is None:
            cpu_pct = 0.0
        else:
            dt = now - self._prev_cpu[0]
            used = cpu_now - self._prev_cpu[1] - self._joined_cpu
            cpu_pct = 100.0 * used / dt if dt > 0 else 0.0
        self._joined_cpu = 0.0
        self._prev_cpu = (now, cpu_now)
        if rd is not None:
            rd -= self._base[2]
            wr -= self._base[3]
        uss, pss, children = None, None, None
        gpu_mem = gpu_util = gpu_proc_mem = gpu_proc_util = None
        if self._slow is not None:  # values from a slow tick land on the next sample only
            uss, pss, gpu = self._slow
            if gpu is not None:
                gpu_mem, gpu_util, gpu_proc_mem, gpu_proc_util = gpu
            children = self._children
            self._slow = None
        units = self.units() if self.units is not None else None
        self.latest_rss = rss
        if self.rss_cell is not None:
            self.rss_cell.value = rss
        self.result.rows.append(
            (
                round(now - self._t0, 6), rss, round(user, 3), round(system, 3),
                round(max(cpu_pct, 0.0), 2), threads, rd, wr, uss, pss, children, units,
                gpu_mem, gpu_util, gpu_proc_mem, gpu_proc_util,
            )
        )  # fmt: skip
        res = self.result
        budget = self.cfg.memory_budget
        if budget is not None and rss > budget and res.budget_breach_t is None:
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
            for pid in list(self._readers):
                up = procfs.read_uss_pss(pid)
                if up is not None:
                    got = True
                    uss += up[0]
                    pss += up[1]
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


# -- the sampler process ----------------------------------------------------------------------


def sample_until(sampler: Sampler, control: int) -> None:
    """Sample on the clock until the parent says stop (or goes away); never burst."""
    interval = 1.0 / sampler.cfg.sample_hz
    next_t = sampler._t0 + interval
    while True:
        # select() on the control pipe: one syscall per wake-up, and it returns at once
        # when the parent writes "stop" (or dies, which closes the pipe).
        if select.select([control], [], [], max(0.0, next_t - time.perf_counter()))[0]:
            return
        now = time.perf_counter()
        if not sampler.tick(now):  # the whole tree has exited
            return
        next_t += interval
        if next_t < now:  # fell behind (machine busy): skip, never burst
            next_t = now + interval


def _read_line(fd: int) -> bytes:
    """One line, a byte at a time: what follows it stays in the pipe for ``select`` to see."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return line


def _send(out: Any, line: str, payload: bytes = b"") -> None:
    out.write(line.encode() + b"\n" + payload)
    out.flush()


def main(argv: list[str] | None = None) -> int:
    # Ctrl-C and a TERM to the runner's process group are the runner's to handle: it stops
    # the trial and then asks us for the result, so we must still be here to give it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    cfg = SamplerConfig(**json.loads((argv or sys.argv[1:])[0]))
    out, control = sys.stdout.buffer, sys.stdin.fileno()
    sampler = Sampler(cfg, on_breach=lambda rss: _send(out, f"breach {rss}"))
    _send(out, "ready")
    line = _read_line(control).split()
    if not line or line[0] != b"go":
        return 0  # the parent went away (or gave up) before the trial began
    sampler.result.startup_cpu_seconds = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    cpu0 = time.thread_time()
    try:
        sampler.begin(float(line[1]))
        _send(out, "begun")
        sample_until(sampler, control)
    except Exception as exc:  # never take the trial down; say what happened
        sampler.result.error = f"sampler stopped: {type(exc).__name__}: {exc}"
    result = sampler.end()
    result.cpu_seconds = time.thread_time() - cpu0
    payload = pickle.dumps(asdict(result))
    with contextlib.suppress(BrokenPipeError):
        _send(out, f"result {len(payload)}", payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
