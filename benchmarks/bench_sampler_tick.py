"""What one sample of the agent's sampler costs in CPU, and how much of it is the wake-up.

The sampler's cost is fixed per second (its rate × the cost of one sample), so
it weighs most on a host where the workload gets little CPU. This splits one
sample's CPU into: a bare timer wake-up (``select()`` with a timeout and no
work: the kernel's part), a sample taken in a hot loop (the Python and /proc
reads alone), and a sample on the clock at 100 Hz (both, with cold caches after
each sleep), in the lean one-process loop the sampler runs and in the general
loop (``Sampler.tick``, which a process tree takes); both include the
once-a-second work (USS/PSS, children) spread over the samples. Target: a
process running two busy numpy threads. Rounds are interleaved; medians with
the range over rounds.

    python benchmarks/bench_sampler_tick.py            # ~30 s
"""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import threading
import time

from _common import machine_line, median, print_table

BUSY = ("import numpy as np, threading\nb = np.ones(2**24)\ndef f():\n    while True: b.sum()\n"
        "[threading.Thread(target=f).start() for _ in range(2)]\nthreading.Event().wait()")


def bare_wakeups(n: int, interval: float) -> float:
    """CPU µs per wake-up of a select() loop on the clock, doing nothing else."""
    r, w = os.pipe()
    c0, nxt = time.thread_time(), time.perf_counter() + interval
    for _ in range(n):
        select.select([r], [], [], max(0.0, nxt - time.perf_counter()))
        nxt += interval
    os.close(r)
    os.close(w)
    return (time.thread_time() - c0) / n * 1e6


def hot_samples(pid: int, n: int) -> float:
    """CPU µs per sample taken back to back (no sleeping between)."""
    from workloads.sampler import Sampler, SamplerConfig

    s = Sampler(SamplerConfig(pid=pid, relative=True, sample_hz=100, gpu=False))
    s.begin(time.perf_counter())
    c0 = time.thread_time()
    for _ in range(n):
        s.tick(time.perf_counter())
    return (time.thread_time() - c0) / n * 1e6


def clocked_samples(pid: int, seconds: float, hz: float,
                    lean: bool = True) -> tuple[float, float]:  # fmt: skip
    """CPU µs per sample of the sampler's own loop (``sample_until``) at ``hz``: the lean
    one-process loop the sampler takes, or (``lean=False``) the general one; and of that,
    the once-a-second work (``Sampler.tick_due``: USS/PSS, children) per sample."""
    from workloads.sampler import Sampler, SamplerConfig
    from workloads.sampler_process import sample_until

    s = Sampler(SamplerConfig(pid=pid, relative=True, sample_hz=hz, gpu=False))
    slow = [0.0]
    due = s.tick_due

    def timed_due(now: float) -> None:
        c = time.thread_time()
        due(now)
        slow[0] += time.thread_time() - c

    s.tick_due = timed_due  # type: ignore[method-assign]
    r, w = os.pipe()
    threading.Timer(seconds, lambda: os.write(w, b"x")).start()
    s.begin(time.perf_counter())
    c0 = time.thread_time()
    sample_until(s, r, lean=lean)
    cpu = time.thread_time() - c0
    os.close(r)
    os.close(w)
    n = max(s.result.scheduled, 1)
    return cpu / n * 1e6, slow[0] / n * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=2.0, help="per clocked round")
    args, _unknown = p.parse_known_args()
    print(machine_line())
    target = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(1.5)
        got: dict[str, list[float]] = {"bare wake-up, 100 Hz": [], "sample, hot loop": [],
                                       "sample on the clock, 100 Hz": [],
                                       "of which the once-a-second work": [],
                                       "same, the general loop (tick)": []}
        for _ in range(args.rounds):
            got["bare wake-up, 100 Hz"].append(bare_wakeups(int(args.seconds * 100), 0.01))
            got["sample, hot loop"].append(hot_samples(target.pid, 2000))
            lean, slow = clocked_samples(target.pid, args.seconds, 100)
            got["sample on the clock, 100 Hz"].append(lean)
            got["of which the once-a-second work"].append(slow)
            got["same, the general loop (tick)"].append(
                clocked_samples(target.pid, args.seconds, 100, lean=False)[0])
    finally:
        target.kill()
        target.wait()
    print_table(
        ["what", "rounds", "CPU µs (median)", "range"],
        [[k, len(v), median(v), f"{min(v):.1f} .. {max(v):.1f}"] for k, v in got.items()],
        title="The sampler's CPU per sample (time.thread_time), target: 2 busy numpy threads",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
