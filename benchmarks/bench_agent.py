"""The profiling agent's cost and accuracy, measured side by side in one run.

Overhead: one process runs the cube workload on all cores; in pairs of adjacent
windows it runs without and with a profiler — the agent at 10 Hz and at 100 Hz,
the agent's sampler on a thread of the profiled process (its earlier design) at
100 Hz, and ``mprof run --include-children --attach`` (memory_profiler, 10 Hz). The
figure is the median over pairs of units/s(on) / units/s(off), so a neighbour's
load hits both sides of a ratio alike. Also printed:
the same ratio per CPU-second spent (workload + profiler; robust to CPU stolen
by neighbours) and the profiler's own CPU.

Accuracy: the agent's peak vs GNU time's "Maximum resident set size" (the
kernel's ru_maxrss, from wait4) for the same trial, for the cube trial, a
workload with a spike shorter than the sampling interval, and a command.

    python benchmarks/bench_agent.py            # ~3 minutes on 2 cores
    python benchmarks/bench_agent.py --rounds 3 --duration 2   # quicker, noisier
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from _common import ROOT, machine_line, median, print_table

RUN = [sys.executable, "-m", "workloads.run"]


def trial(out: Path, args: list[str], prefix: list[str] | None = None) -> tuple[dict, str]:
    """One runner invocation (optionally under a wrapper); its summary and stderr."""
    if out.exists():
        shutil.rmtree(out)
    proc = subprocess.run(
        [*(prefix or []), *RUN, "--out", str(out), "--quiet", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise SystemExit(f"trial failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return json.loads((out / "summary.json").read_text()), proc.stderr


def mprof_peak(dat: Path) -> int:
    """Max of mprof's samples: MEM lines (with --include-children, parent + children) in MiB."""
    peak = 0.0
    for line in dat.read_text().splitlines():
        if line.startswith("MEM "):
            peak = max(peak, float(line.split()[1]))
    return int(peak * 2**20)


def gnu_time_maxrss(stderr: str) -> int:
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
    if not m:
        raise SystemExit("no 'Maximum resident set size' in /usr/bin/time -v output")
    return int(m.group(1)) * 1024


def workload_args(args: argparse.Namespace) -> list[str]:
    from workloads.base import REGISTRY

    name = "cube" if "cube" in REGISTRY else "memcopy"
    return ["--workload", name, "--workers", str(args.workers), "--duration", str(args.duration)]


class _Mprof:
    """``mprof run --include-children --attach PID``: memory_profiler's sampler, 10 Hz."""

    def __init__(self, mprof: str, dat: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        cmd = [mprof, "run", "--include-children", "--attach", "-T", "0.1", "-o", str(dat),
               "--timeout", "600", str(os.getpid())]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # it samples right after saying it attached
            if "attaching" in line:
                break
        self.ps = psutil.Process(self.proc.pid)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class _ThreadSampler:
    """The agent's earlier design, kept for comparison: the same ``Sampler``, on a thread
    of the profiled process (which must then hand it the GIL for every sample)."""

    def __init__(self, hz: float) -> None:
        from workloads.sampler import Sampler, SamplerConfig

        cfg = SamplerConfig(pid=os.getpid(), relative=True, sample_hz=hz, gpu=False)
        self.sampler = Sampler(cfg)
        self.cpu = 0.0

    def start(self) -> _ThreadSampler:
        self.control, self.wake = os.pipe()
        self.t0 = time.perf_counter()
        self.sampler.begin(self.t0)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        from workloads.sampler import sample_until

        sample_until(self.sampler, self.control)
        self.cpu = time.thread_time()

    def stop(self) -> Any:
        os.write(self.wake, b"x")
        self.thread.join()
        wall = time.perf_counter() - self.t0
        os.close(self.control)
        os.close(self.wake)
        return argparse.Namespace(cpu_seconds=self.cpu, wall_s=wall)


class _Window:
    """Units/s and units per CPU-second of one window of the running workload."""

    def __init__(self, counter: Any, window: float, profiler: psutil.Process | None) -> None:
        """``profiler``: a profiler's own process, whose CPU counts as the profiling's."""

        def cpu() -> float:
            return sum(profiler.cpu_times()[:2]) if profiler is not None else 0.0

        u0, t0, c0, p0 = counter.value, time.perf_counter(), os.times(), cpu()
        time.sleep(window)
        u1, t1, c1, p1 = counter.value, time.perf_counter(), os.times(), cpu()
        cpu = (c1.user - c0.user) + (c1.system - c0.system) + (p1 - p0)
        self.rate = (u1 - u0) / (t1 - t0)
        self.per_cpu = (u1 - u0) / cpu if cpu > 0 else 0.0
        self.profiler_cpu = (p1 - p0) / (t1 - t0)


def overhead(args: argparse.Namespace, tmp: Path) -> None:
    """Windows of one long-running workload, with and without a profiler, in pairs.

    One process runs the workload throughout. Each measurement is a pair of
    adjacent windows — profiler off, profiler on, in alternating order — so both
    share whatever load the neighbours put on the machine, which separate trial
    processes did not (their throughput varied 10x on a shared 2-core VM). The
    agent pairs are short and many; mprof (``mprof run --include-children
    --attach``, started before its window) gets fewer, longer pairs because each
    start costs a Python start-up. A configuration's figure is the median of its
    pairs' ratios.
    """
    from workloads.agent import Agent
    from workloads.base import REGISTRY, UnitCounter, load_workload

    name = "cube" if "cube" in REGISTRY else "memcopy"
    workload = load_workload(name)()
    workload.prepare()
    stop, counter = threading.Event(), UnitCounter()
    runner = threading.Thread(target=workload.run, args=(args.workers, stop, counter))
    runner.start()
    time.sleep(1.0)  # caches, allocator and thread pool settle
    pairs: dict[str, list[tuple[_Window, _Window, float]]] = {}

    def pair(config: str, window: float, on_first: bool) -> None:
        agent: Any = None
        sampler: _Mprof | None = None
        other: psutil.Process | None = None  # the profiler's process, if it has its own
        own = 0.0
        windows: dict[bool, _Window] = {}
        for profiled in (on_first, not on_first):
            if profiled and config.startswith("agent"):
                agent = Agent(sample_hz=float(config.split()[1])).start()
                other = psutil.Process(agent.sampler_pid)
            elif profiled and config.startswith("thread"):
                agent = _ThreadSampler(float(config.split()[1])).start()
            elif profiled:
                sampler = _Mprof(mprof, tmp / "mprofile.dat")  # type: ignore[arg-type]
                other = sampler.ps
            time.sleep(0.05)
            windows[profiled] = _Window(counter, window, other if profiled else None)
            if agent is not None:
                rep = agent.stop()
                own = rep.cpu_seconds / rep.wall_s
                agent = None
            if sampler is not None:
                own = windows[True].profiler_cpu
                sampler.close()
                sampler = None
        pairs.setdefault(config, []).append((windows[False], windows[True], own))

    mprof = shutil.which("mprof")
    try:
        for r in range(args.rounds):
            for config in ("agent 10 Hz", "agent 100 Hz", "thread 100 Hz"):
                pair(config, args.window, on_first=r % 2 == 1)
        if mprof:
            for r in range(args.mprof_rounds):
                pair("mprof -C 10 Hz", args.mprof_window, on_first=r % 2 == 1)
    finally:
        stop.set()
        runner.join()
    rows = []
    for config, got in pairs.items():
        ratios = [on.rate / off.rate for off, on, _ in got]
        q = sorted(ratios)
        eff = [on.per_cpu / off.per_cpu for off, on, _ in got if off.per_cpu > 0]
        rows.append(
            [
                config,
                len(got),
                median([off.rate for off, _, _ in got]),
                median(ratios),
                100 * (1 - median(ratios)),
                f"{q[len(q) // 4]:.3f}..{q[3 * len(q) // 4]:.3f}",
                100 * (1 - median(eff)),
                100 * median([own for _, _, own in got]),
            ]
        )
    print_table(
        ["config", "pairs", "off units/s", "on/off ratio", "overhead %", "ratio IQR",
         "overhead per CPU-s %", "profiler CPU % of a core"],
        rows,
        title=f"Profiler overhead: {name} workload, {args.workers} workers; pairs of adjacent "
        f"windows ({args.window:g} s for the agent, {args.mprof_window:g} s for mprof), "
        "median of ratios",
    )  # fmt: skip


def accuracy(args: argparse.Namespace, tmp: Path) -> None:
    gtime = ["/usr/bin/time", "-v"]
    rows = []
    s, err = trial(tmp / "a", [*workload_args(args), "--sample-hz", "10"], gtime)
    ref = gnu_time_maxrss(err)
    rows.append(["cube trial: agent peak", s["peak_rss_bytes"], ref])
    rows.append(["cube trial: sampled max at 10 Hz", s["peak_rss_sampled_bytes"], ref])
    before = s["peak_rss_before_trial_bytes"]

    spike = ["--workload", "memory-spike", "--param", "mb=128", "--param", "at_s=0.3",
             "--duration", "1.6", "--sample-hz", "1"]  # fmt: skip
    s, err = trial(tmp / "b", spike, gtime)
    ref = gnu_time_maxrss(err)
    rows.append(["128 MiB spike between samples: agent peak", s["peak_rss_bytes"], ref])
    rows.append(["128 MiB spike: sampled max at 1 Hz", s["peak_rss_sampled_bytes"], ref])

    alloc = "import time; b = bytearray(300 * 2**20); time.sleep(1)"
    s, err = trial(tmp / "c", ["--sample-hz", "10", "--command", "--", sys.executable, "-c", alloc],
                   gtime)  # fmt: skip
    ref = gnu_time_maxrss(err)
    rows.append(["command (300 MiB child): agent peak", s["peak_rss_bytes"], ref])
    rows.append(["command: sampled max at 10 Hz", s["peak_rss_sampled_bytes"], ref])
    print_table(
        ["measurement", "peak MiB", "/usr/bin/time -v MiB", "error %"],
        [[n, p / 2**20, r / 2**20, 100 * (p - r) / r] for n, p, r in rows],
        title="Agent accuracy: peak RSS vs GNU time's maximum resident set size (same trial)",
    )
    # The agent resets the high-water mark when the trial starts, so GNU time (like any
    # parent's wait4) sees the peak from the trial on; what came before is in the summary.
    print(f"(cube: peak before the trial — imports and prepare() — was {before / 2**20:.1f} MiB; "
          "the reset hides it from /usr/bin/time, summary.json keeps it)")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=16, help="window pairs per agent rate")
    p.add_argument("--window", type=float, default=1.5, help="seconds per agent window")
    p.add_argument("--mprof-rounds", type=int, default=6)
    p.add_argument("--mprof-window", type=float, default=2.0)
    p.add_argument("--duration", type=float, default=3.0, help="seconds per accuracy trial")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--skip-accuracy", action="store_true")
    args, _unknown = p.parse_known_args()  # run_all.py passes its own arguments through
    print(machine_line())
    with tempfile.TemporaryDirectory(prefix="bench_agent_") as d:
        tmp = Path(d)
        if not args.skip_overhead:
            overhead(args, tmp)
        if not args.skip_accuracy:
            accuracy(args, tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
