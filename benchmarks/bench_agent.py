"""The profiling agent's cost and accuracy, measured side by side in one run.

Overhead: the same trial (the cube workload, all cores busy) with the agent off
(``--sample-hz 0``: only the kernel peak is read), at 10 Hz and at 100 Hz, and
under ``mprof run --include-children`` (memory_profiler, 10 Hz), in interleaved
rounds. The figure is the median over rounds of throughput(config) /
throughput(off) from the same round, so a neighbour's load hits both sides of a
ratio alike. The agent's own CPU seconds (from its summary) are printed too:
they are the direct cost, free of throughput noise.

Accuracy: the agent's peak vs GNU time's "Maximum resident set size" (the
kernel's ru_maxrss, from wait4) for the same trial, for the cube trial, a
workload with a spike shorter than the sampling interval, and a command.

    python benchmarks/bench_agent.py            # ~3 minutes on 2 cores
    python benchmarks/bench_agent.py --rounds 3 --duration 2   # quicker, noisier
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

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


def overhead(args: argparse.Namespace, tmp: Path) -> None:
    base = workload_args(args)
    mprof = shutil.which("mprof")
    configs: dict[str, tuple[list[str], list[str] | None]] = {
        "off": (["--sample-hz", "0"], None),
        "agent 10 Hz": (["--sample-hz", "10"], None),
        "agent 100 Hz": (["--sample-hz", "100"], None),
    }
    if mprof:
        dat = tmp / "mprofile.dat"
        configs["mprof --include-children 10 Hz"] = (
            ["--sample-hz", "0"],
            [mprof, "run", "--include-children", "-T", "0.1", "-o", str(dat)],
        )
    trial(tmp / "warm", base)  # inputs generated/cached and page cache warm before timing
    rates: dict[str, list[float]] = {k: [] for k in configs}
    agent_cpu: dict[str, list[float]] = {k: [] for k in configs}
    names = list(configs)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate who goes first
        for name in order:
            extra, prefix = configs[name]
            s, _ = trial(tmp / "o", [*base, *extra], prefix)
            rates[name].append(s["units_per_s"])
            if prefix is None and s["agent"]["samples"] > 2:  # mprof's own cost is not known
                agent_cpu[name].append(s["agent"]["cpu_seconds"] / s["seconds"])
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{n}={rates[n][-1]:.0f}/s" for n in names), file=sys.stderr, flush=True)  # fmt: skip
    rows = []
    for name in names:
        ratios = [a / b for a, b in zip(rates[name], rates["off"], strict=True)]
        rows.append(
            [
                name,
                median(rates[name]),
                median(ratios),
                100 * (1 - median(ratios)),
                f"{min(ratios):.3f}..{max(ratios):.3f}",
                100 * median(agent_cpu[name]) if agent_cpu[name] else "n/a",
            ]
        )
    print_table(
        ["config", "units/s (median)", "ratio to off", "overhead %", "ratio range",
         "agent CPU % of a core"],
        rows,
        title=f"Agent overhead: {' '.join(base)}, {args.rounds} interleaved rounds "
        "(median of paired ratios)",
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
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--duration", type=float, default=3.0)
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
