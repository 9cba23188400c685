"""The profiling agent's cost and accuracy, measured side by side in one run.

Overhead: one process runs the cube workload on all cores; in many short pairs
of adjacent windows it runs without and with the agent (10 Hz, 100 Hz; with
``--compare`` also the agent's sampler on a thread of the profiled process — its
earlier design — and ``mprof run --include-children --attach``). The figure is
CPU-time normalised: units per CPU-second of workload and profiler together,
on/off, as a ratio of sums over the pairs with a bootstrap 95 % interval — a
neighbour that takes a core away changes both sides' CPU, not the ratio, so it
resolves 1 % on a shared 2-core host where the plain throughput ratio (printed
beside it) does not. Beside each figure, the sample rate the agent achieved in
those windows: a deprioritised sampler (SCHED_BATCH, the default) may come late.

Accuracy: the agent's peak vs GNU time's "Maximum resident set size" (the
kernel's ru_maxrss, from wait4) for the same trial, for the cube trial, a
workload with a spike shorter than the sampling interval, and a command.

    python benchmarks/bench_agent.py                    # ~3 minutes on 2 cores
    python benchmarks/bench_agent.py --skip-accuracy    # the overhead only
    python benchmarks/bench_agent.py --skip-accuracy --rates 100/batch,100/idle,100/normal
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import ROOT, machine_line, print_table, unavailable

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


class _Window:
    """Units, wall time and CPU time of one window of the running workload.

    CPU is ``time.process_time()`` (this process: workload and any in-process
    profiler, in nanoseconds — ``os.times``' 10 ms ticks are ±1 % of a 0.5 s
    window) plus, when the profiler is a process of its own, that process's CPU
    in the same window, from its CPU clock (``procfs.cpu_clock``, nanoseconds).
    """

    def __init__(self, counter: Any, window: float, profiler_pid: int | None) -> None:
        from workloads.procfs import cpu_clock

        clock = cpu_clock(profiler_pid) if profiler_pid is not None else None

        def other() -> float:
            return time.clock_gettime(clock) if clock is not None else 0.0

        u0, t0, c0, p0 = counter.value, time.perf_counter(), time.process_time(), other()
        time.sleep(window)
        u1, t1, c1, p1 = counter.value, time.perf_counter(), time.process_time(), other()
        self.start, self.end = t0, t1  # on the monotonic clock the sampler stamps its rows with
        self.units, self.wall, self.profiler_cpu = u1 - u0, t1 - t0, p1 - p0
        self.own_cpu = c1 - c0  # the workload's process alone
        self.cpu = self.own_cpu + self.profiler_cpu


def ratio_of_sums(pairs: list[tuple[_Window, _Window]], per: str) -> float:
    """(Σ units on / Σ ``per`` on) ÷ (Σ units off / Σ ``per`` off): on/off efficiency."""
    on = sum(w.units for _, w in pairs) / sum(getattr(w, per) for _, w in pairs)
    off = sum(w.units for w, _ in pairs) / sum(getattr(w, per) for w, _ in pairs)
    return on / off


def bootstrap_ci(pairs: list[tuple[_Window, _Window]], per: str, resamples: int = 4000,
                 seed: int = 16) -> tuple[float, float]:
    """95 % percentile interval of :func:`ratio_of_sums`, resampling whole pairs."""
    import random

    rng = random.Random(seed)
    n = len(pairs)
    stats = sorted(ratio_of_sums([pairs[rng.randrange(n)] for _ in range(n)], per)
                   for _ in range(resamples))
    return stats[int(0.025 * resamples)], stats[int(0.975 * resamples) - 1]


def parse_configs(spec: str) -> list[tuple[float, str]]:
    """``10,100,100/normal`` → [(10, "batch"), (100, "batch"), (100, "normal")]: a rate and the
    sampler's CPU policy (``workloads.sampler.SCHED_POLICIES``; the agent's default without one)."""
    from workloads.sampler import DEFAULT_SCHED, SCHED_POLICIES

    out = []
    for item in spec.split(","):
        hz, _, policy = item.partition("/")
        policy = policy or DEFAULT_SCHED
        if policy not in SCHED_POLICIES:
            raise SystemExit(f"error: unknown policy {policy!r} (one of {SCHED_POLICIES})")
        out.append((float(hz), policy))
    return out


def achieved(rows: list[tuple], t0: float, windows: list[_Window]) -> tuple[float, float]:
    """Samples per second the sampler took inside ``windows`` (its rows' times on the shared
    monotonic clock), and the 99th percentile of the gaps between them in ms."""
    times = sorted(t0 + r[0] for r in rows)
    count, gaps = 0, []
    for w in windows:
        inside = [t for t in times if w.start <= t <= w.end]
        count += len(inside)
        gaps += [b - a for a, b in itertools.pairwise(inside)]
    gaps.sort()
    p99 = 1e3 * gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] if gaps else float("nan")
    return count / sum(w.wall for w in windows), p99


def overhead(args: argparse.Namespace) -> None:
    """Many short windows of one long-running workload, the agent paused or running, in pairs.

    One process runs the workload throughout, and one agent per rate is started
    once (its start-up is before any trial's t = 0 and reported on its own). A
    window with the agent *off* has its sampler process stopped (SIGSTOP: no
    wake-ups, no reads); *on*, continued (SIGCONT) — the agent as it ships, and
    toggling costs one signal instead of a Python start-up, so pairs can be
    short and many. A sampler continued after a pause runs its slow tick at once
    when one fell due: if anything that over-counts its cost. Each pair is two
    adjacent windows, off and on, the order alternating; rates are interleaved
    pair by pair, so the neighbours' load hits every configuration alike.

    The figure is **CPU-time normalised**: units per CPU-second of workload *and*
    sampler, so a neighbour that takes a core away changes both sides' CPU, not
    the ratio, while everything the agent costs (its own CPU, and the workload's
    CPU it slows) still lowers it. Overhead = 1 − (Σ units on / Σ CPU on) ÷
    (Σ units off / Σ CPU off) over the pairs, with a 95 % bootstrap interval
    (pairs resampled). The plain throughput ratio is printed beside it: on a
    shared host it is the noisy one.
    """
    from workloads.agent import Agent
    from workloads.base import REGISTRY, UnitCounter, load_workload

    name = "cube" if "cube" in REGISTRY else "memcopy"
    workload = load_workload(name)()
    workload.prepare()
    stop, counter = threading.Event(), UnitCounter()
    runner = threading.Thread(target=workload.run, args=(args.workers, stop, counter))
    runner.start()
    rates = parse_configs(args.rates)
    agents = {c: Agent(sample_hz=c[0], gpu=False, sched=c[1]).start() for c in rates}
    pids = {hz: agent.sampler_pid for hz, agent in agents.items()}
    for pid in pids.values():
        os.kill(pid, signal.SIGSTOP)
    time.sleep(1.0)  # caches, allocator and thread pool settle
    pairs: dict[tuple[float, str], list[tuple[_Window, _Window]]] = {c: [] for c in rates}
    try:
        for r in range(args.rounds):
            for hz in rates:
                windows: dict[bool, _Window] = {}
                for on in (r % 2 == 1, r % 2 == 0):
                    os.kill(pids[hz], signal.SIGCONT if on else signal.SIGSTOP)
                    time.sleep(args.settle)
                    windows[on] = _Window(counter, args.window, pids[hz] if on else None)
                    os.kill(pids[hz], signal.SIGSTOP)
                pairs[hz].append((windows[False], windows[True]))
        # The sampler's CPU at steady state: each running alone, unpaused, for a while
        # (a pause makes its once-a-second work fall due at the resume: over-counted above).
        steady: dict[tuple[float, str], float] = {}
        steady_w: dict[tuple[float, str], _Window] = {}
        for hz in rates:
            os.kill(pids[hz], signal.SIGCONT)
            time.sleep(1.0)
            w = steady_w[hz] = _Window(counter, args.steady, pids[hz])
            os.kill(pids[hz], signal.SIGSTOP)
            steady[hz] = w.profiler_cpu / w.wall
    finally:
        for pid in pids.values():
            os.kill(pid, signal.SIGCONT)
        reports = {hz: agent.stop() for hz, agent in agents.items()}
        stop.set()
        runner.join()
    cores = min(args.workers, os.cpu_count() or 1)
    rows = []
    for (hz, policy), got in pairs.items():
        rep = reports[hz, policy]
        t0 = agents[hz, policy].t0
        on_rate, _ = achieved(rep.rows, t0, [w for _, w in got])
        st_rate, st_gap = achieved(rep.rows, t0, [steady_w[hz, policy]])
        cpu_ratio = ratio_of_sums(got, "cpu")
        lo, hi = bootstrap_ci(got, "cpu")
        inter = ratio_of_sums(got, "own_cpu")  # units per the workload's own CPU-s, on/off
        ilo, ihi = bootstrap_ci(got, "own_cpu")
        wall_ratio = ratio_of_sums(got, "wall")
        wlo, whi = bootstrap_ci(got, "wall")
        on_wall = sum(w.wall for _, w in got)
        workload_cpu = sum(w.cpu for w, _ in got) / sum(w.wall for w, _ in got)  # of a core
        share = steady[hz, policy] / workload_cpu  # the sampler's steady CPU per workload CPU-s
        rows.append([
            f"agent {hz:g} Hz, {policy}", len(got),
            sum(w.units for w, _ in got) / sum(w.wall for w, _ in got),
            100 * (1 - cpu_ratio), _ci(lo, hi),
            100 * (1 - inter), _ci(ilo, ihi),
            100 * steady[hz, policy], 100 * sum(w.profiler_cpu for _, w in got) / on_wall,
            100 * workload_cpu,
            100 * (1 - inter + share), _ci(ilo, ihi, shift=share),
            100 * (1 - inter + steady[hz, policy] / cores),
            _ci(ilo, ihi, shift=steady[hz, policy] / cores),
            100 * (1 - wall_ratio), _ci(wlo, whi),
            f"{on_rate:.1f} ({100 * on_rate / hz:.0f} %)",
            f"{st_rate:.1f} ({100 * st_rate / hz:.0f} %)",
            round(st_gap, 2),
        ])  # fmt: skip
    print_table(
        ["config", "pairs", "off units/s", "A: overhead per CPU-s %", "A 95% CI",
         "B: interference %", "B 95% CI", "sampler CPU % of a core, steady",
         "(in paired windows)", "workload CPU % of a core", "C: B + steady sampler CPU %",
         "C 95% CI", f"D: C with {cores} cores for the workload %, estimate", "D 95% CI",
         "throughput overhead %", "95% CI", "achieved Hz, paired (of target)",
         "achieved Hz, steady", "steady gap p99 ms"],
        rows,
        title=f"Agent overhead: {name} workload, {args.workers} workers; {args.rounds} pairs of "
        f"adjacent {args.window:g} s windows per rate (sampler stopped / running, order "
        "alternating, rates interleaved), ratios of sums, bootstrap 95% intervals over pairs",
    )  # fmt: skip
    print("A = 1 - (units per CPU-s of workload + sampler, on) / (units per CPU-s, off): the "
          "sampler's CPU as measured in the paired windows, over-counted by a pause (its "
          "once-a-second work falls due at the resume).")
    print("B = the same with the workload's own CPU only: what the running sampler costs the "
          "workload's efficiency (reads of its /proc files, clock reads, caches).")
    print(f"C = B + the sampler's steady CPU ({args.steady:g} s unpaused) per CPU-s of "
          "workload: the agent as it runs in a trial. All relative to the CPU the workload "
          "got here: on a host shared with other work it gets less, and the sampler's fixed "
          "cost per second weighs more.")
    print(f"D = B + the sampler's steady CPU per {cores} cores: an ESTIMATE of C where the "
          f"workload has the {cores} cores to itself (a dedicated VM), from figures measured "
          "here; not measured.")
    print("Achieved Hz: the samples the sampler took per second inside the paired 'on' windows "
          f"(each starts {args.settle:g} s after the sampler is continued) and in the steady "
          "run, from the time series' own timestamps; the gap is between consecutive samples "
          "of the steady run (the interval is 1000/Hz ms).")


def _ci(lo: float, hi: float, shift: float = 0.0) -> str:
    """An on/off ratio's interval as an overhead interval in %, ``shift`` added (a fraction)."""
    return f"{100 * (1 - hi + shift):.2f} .. {100 * (1 - lo + shift):.2f}"


def accuracy(args: argparse.Namespace, tmp: Path) -> None:
    gtime = ["/usr/bin/time", "-v"]
    rows = []
    s, err = trial(tmp / "a", [*workload_args(args), "--sample-hz", "10"], gtime)
    ref = gnu_time_maxrss(err)
    rows.append(["cube trial: agent peak (whole lifetime)", s["peak_rss_bytes"], ref])
    rows.append(["cube trial: sampled max at 10 Hz", s["peak_rss_sampled_bytes"], ref])
    before, s_trial = s["peak_rss_before_trial_bytes"], s["peak_rss_trial_bytes"]

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
    # GNU time reports the largest ru_maxrss of the runner and its children; the sampler
    # is forked before the trial resets the runner's high-water mark and inherits it, so at
    # any --sample-hz > 0 GNU time sees the whole lifetime (the load phase included).
    print(f"(cube: the trial alone peaked at {s_trial / 2**20:.1f} MiB, the load phase — "
          f"imports, prepare() — at {before / 2**20:.1f} MiB)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=120, help="window pairs per agent rate")
    p.add_argument("--window", type=float, default=0.25, help="seconds per window")
    p.add_argument("--settle", type=float, default=0.02,
                   help="seconds between pausing/continuing the sampler and the window")
    p.add_argument("--rates", default="10,100,100/normal",
                   help="sampling rates, Hz, comma-separated, each optionally /POLICY: the "
                   "sampler's CPU policy (batch, idle, normal; default: the agent's, batch)")
    p.add_argument("--steady", type=float, default=5.0,
                   help="seconds of unpaused sampling per rate for its steady CPU")
    p.add_argument("--duration", type=float, default=3.0, help="seconds per accuracy trial")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                   help="workload threads (default: all cores, the worst case for the agent)")
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--skip-accuracy", action="store_true")
    args, _unknown = p.parse_known_args()  # run_all.py passes its own arguments through
    if not args.skip_accuracy and not Path("/usr/bin/time").is_file():
        unavailable("its accuracy check needs GNU time (/usr/bin/time: apt-get install "
                    "time), or pass --skip-accuracy")
    print(machine_line())
    with tempfile.TemporaryDirectory(prefix="bench_agent_") as d:
        tmp = Path(d)
        if not args.skip_overhead:
            overhead(args)
        if not args.skip_accuracy:
            accuracy(args, tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
