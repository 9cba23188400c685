"""The sampler's own process: its main loop, its CPU policy and its line protocol with the
agent (``workloads.sampler`` describes both; ``Sampler`` there is the sampling logic).

``python -S -c`` runs :func:`main` here (``workloads.agent.SAMPLER_MAIN``), and a warm
runner calls it in the sampler it forks: the lines below are all a sampler process runs
besides ``Sampler`` itself.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import sys
import time

from workloads import procfs
from workloads.sampler import Sampler, SamplerConfig, cpu_read_at

TYPE_CHECKING = False  # typing is not imported at run time (see workloads.sampler)
if TYPE_CHECKING:
    from typing import Any

# -- the sampler process ----------------------------------------------------------------------


def lower_priority(policy: str) -> str:
    """Give this process the CPU policy ``policy`` (SCHED_POLICIES); returns what it got.

    Why: on a host whose cores the workers saturate, a sampler that preempts one
    on every wake-up stalls it mid-work — and if that worker holds the GIL, the
    other workers with it. Under SCHED_BATCH or SCHED_IDLE a waking sampler
    never preempts; it runs at the next scheduler tick or on a free core. Where
    the policy cannot be set, nice 19 is the next best ("nice 19").
    """
    if policy == "normal":
        return "normal"
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE if policy == "idle" else os.SCHED_BATCH,
                              os.sched_param(0))  # fmt: skip
        return policy
    except (AttributeError, OSError):
        try:
            os.nice(19)
        except OSError:
            return "normal"
        return "nice 19"


def sample_until(sampler: Sampler, control: int, *, lean: bool = True) -> None:
    """Sample on the clock until the parent says stop (or goes away); never burst.

    Each wake-up's lateness is kept (``Sampler.lags``); a sample whose slot has
    passed is skipped and counted (``result.missed``), and the clock stays on its
    grid. One process (the common case) takes the lean loop, which wakes into
    cold caches 100 times a second and so touches as little as it can; a tree,
    or anything unusual in the lean loop, takes the general one (``lean=False``:
    always, for ``benchmarks/bench_sampler_tick.py`` to compare the two).
    """
    interval = 1.0 / sampler.cfg.sample_hz
    next_t: float | None = sampler._t0 + interval
    if (lean and not sampler.cfg.tree and sampler._cpu_clock is not None
            and len(sampler._readers) == 1):
        next_t = _one_process_until(sampler, control, next_t, interval)
    watch, nothing = [control], []
    while next_t is not None:
        # select() on the control pipe: one syscall per wake-up, and it returns at once
        # when the parent writes "stop" (or dies, which closes the pipe).
        if select.select(watch, nothing, nothing, max(0.0, next_t - time.perf_counter()))[0]:
            return
        now = time.perf_counter()
        sampler.lags.append(now - next_t)
        if not sampler.tick(now):  # the whole tree has exited
            return
        next_t = _next_slot(sampler, next_t, interval, now)


def _next_slot(sampler: Sampler, next_t: float, interval: float, now: float) -> float:
    """The next slot on the grid after ``now``; slots already passed are counted as missed."""
    next_t += interval
    if next_t <= now:  # fell behind (machine busy): skip, never burst
        skipped = int((now - next_t) // interval) + 1
        sampler.result.missed += skipped
        next_t += skipped * interval
    return next_t


def _one_process_until(sampler: Sampler, control: int, next_t: float,
                       interval: float) -> float | None:  # fmt: skip
    """``Sampler.tick`` for one process, unrolled into one function body.

    Why unrolled: at 100 Hz every wake-up finds cold caches, and there each
    Python call (a method, a named tuple's constructor) costs microseconds; here
    the calls of ``tick`` → ``sample`` → ``_Series.add`` … are inlined
    (``benchmarks/bench_sampler_tick.py`` measures this loop against the general
    one). The stores mirror ``_Series.add`` and ``Sampler._after``: change them
    together.

    Returns None when the parent says stop, else the slot for the general loop
    to go on from (the process is exiting: ``tick`` records that as it should).
    """
    watch, nothing = [control], []
    wait, clock, cpu_clock = select.select, time.perf_counter, time.clock_gettime
    lags, series, res = sampler.lags, sampler._series, sampler.result
    col_t, col_rss, col_user, col_sys = series.t, series.rss, series.user, series.system
    col_cpu, col_tc, col_thr, col_rd, col_wr, col_units = (
        series.cpu, series.tc, series.threads, series.rd, series.wr, series.units)
    read = next(iter(sampler._readers.values())).read_tuple
    clk, cpu_base = sampler._cpu_clock, sampler._cpu_base

    def read_cpu() -> float:
        return cpu_clock(clk)

    units_cell, units, rss_cell = sampler._units_cell, sampler.units, sampler._rss_cell
    b_user, b_sys, b_rd, b_wr = sampler._base
    budget = sampler.cfg.memory_budget if res.budget_breach_t is None else None
    taken = 0
    try:
        while True:
            if wait(watch, nothing, nothing, max(0.0, next_t - clock()))[0]:
                return None
            now = clock()
            if now >= sampler._next_due:
                sampler.tick_due(now)
            try:
                rss, user, system, threads, rd, wr = read()
                cpu, tc = cpu_read_at(read_cpu, clock)
                cpu -= cpu_base
            except (procfs.ProcGone, OSError):
                return next_t
            lags.append(now - next_t)
            i = series.n
            if i == series.capacity:
                series.grow()
            col_t[i] = now
            col_rss[i] = rss
            col_user[i] = user - b_user
            col_sys[i] = system - b_sys
            col_cpu[i] = cpu
            col_tc[i] = tc
            col_thr[i] = threads
            col_rd[i] = -1 if rd is None else rd - b_rd
            col_wr[i] = -1 if wr is None else wr - b_wr
            col_units[i] = (units_cell.value if units_cell is not None
                            else units() if units is not None else -1)  # fmt: skip
            series.n = i + 1
            if sampler._slow is not None:
                sampler._attach_slow(i)
            sampler.latest_rss = rss
            if rss_cell is not None:
                rss_cell.value = rss
            if budget is not None and rss > budget:
                sampler._breach(now, rss)
                budget = None
            taken += 1
            next_t += interval
            if next_t <= now:  # fell behind: as _next_slot
                next_t = _next_slot(sampler, next_t - interval, interval, now)
    finally:
        res.scheduled += taken


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
    cfg = SamplerConfig.decode((argv or sys.argv[1:])[0])
    out, control = sys.stdout.buffer, sys.stdin.fileno()
    sampler = Sampler(cfg, on_breach=lambda rss: _send(out, f"breach {rss}"))
    _send(out, "ready")
    line = _read_line(control).split()
    if not line or line[0] != b"go":
        return 0  # the parent went away (or gave up) before the trial began
    sampler.result.startup_cpu_seconds = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    # After the start-up, which then runs at full priority (the parent waits for it).
    sampler.result.sched_policy = lower_priority(cfg.sched)
    cpu0 = time.thread_time()
    try:
        sampler.begin(float(line[1]))
        _send(out, "begun")
        sample_until(sampler, control)
    except Exception as exc:  # never take the trial down; say what happened
        sampler.result.error = f"sampler stopped: {type(exc).__name__}: {exc}"
    result = sampler.end()
    result.cpu_seconds = time.thread_time() - cpu0
    payload = result.to_bytes()
    try:  # noqa: SIM105 - no contextlib in the sampler process (see the imports)
        _send(out, f"result {len(payload)}", payload)
    except BrokenPipeError:  # the parent went away: nobody to give the result to
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
