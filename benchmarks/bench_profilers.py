"""What ``--profile`` costs: throughput with py-spy (several settings) and memray vs none.

Each round runs one trial per configuration of the same workload back to back
— no profiler, a placebo (the cpu driver's launch path with a "py-spy" that
only sleeps), py-spy in each mode/rate asked for (``--pyspy native@100`` is
``--native`` at 100 Hz, the setting before this benchmark; ``blocking`` reads
Python frames only; ``nonblocking`` never pauses the process), and
``--profile memory`` (memray with native traces) — in an order that rotates
every round, with ``--gap`` seconds between trials, so drift and a neighbour's
load hit every configuration alike. Many short rounds beat a few long ones on a
shared host. The figures per configuration are the median over rounds of
units/s(profiled) / units/s(unprofiled, same round), with the interquartile
range of those ratios, and the same ratio of units per CPU-second of the trial
process (robust to CPU stolen by neighbours, but blind to py-spy pausing the
process while it reads: the wall ratio is the one the goal is about).
Throughput is the runner's own (the timed window only: attaching py-spy and
writing memray's flame graph happen outside it).

    python benchmarks/bench_profilers.py                  # ~4 minutes on 2 cores
    python benchmarks/bench_profilers.py --rounds 4 --duration 2   # quicker, noisier
    python benchmarks/bench_profilers.py --pyspy native@100 --pyspy nonblocking@100 --no-memory
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, machine_line, median, print_table, unavailable

PLACEBO = "placebo (cpu launch path, no sampling)"
MEMORY = "memory (memray native)"
DEFAULT_PYSPY = ["native@100", "blocking@100", "nonblocking@100", "native@20"]


def configs(pyspy: list[str], memory: bool) -> dict[str, tuple[list[str], dict[str, str]]]:
    """name → (runner arguments, environment) for every configuration of one round."""
    out: dict[str, tuple[list[str], dict[str, str]]] = {"none": ([], {})}
    for spec in pyspy:
        mode, _, rate = spec.partition("@")
        out[f"cpu py-spy {mode} {rate or 100} Hz"] = (
            ["--profile", "cpu"],
            {"CLOUDPROF_PYSPY_MODE": mode, "CLOUDPROF_PYSPY_RATE": rate or "100"},
        )
    if memory:
        out[MEMORY] = (["--profile", "memory"], {})
    return out


def trial(out: Path, args: list[str], env: dict[str, str] | None = None) -> dict:
    if out.exists():
        shutil.rmtree(out)
    proc = subprocess.run(
        [sys.executable, "-m", "workloads.run", "--out", str(out), "--quiet", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"trial failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workload", default="cube")
    ap.add_argument("--gap", type=float, default=0.5, help="seconds between trials")
    ap.add_argument("--pyspy", action="append", help="MODE@RATE, repeatable (default: "
                    + ", ".join(DEFAULT_PYSPY) + ")")  # fmt: skip
    ap.add_argument("--no-memory", action="store_true", help="leave memray out")
    ap.add_argument("--no-placebo", action="store_true")
    args = ap.parse_args()
    import importlib.util

    if shutil.which("py-spy", path=str(Path(sys.executable).parent)) is None and \
            shutil.which("py-spy") is None:
        unavailable("py-spy is not installed here (pip install -e '.[dev]')")
    if not args.no_memory and importlib.util.find_spec("memray") is None:
        unavailable("memray is not installed here (pip install -e '.[dev]'), or pass "
                    "--no-memory")
    base = ["--workload", args.workload, "--workers", str(args.workers),
            "--duration", str(args.duration)]  # fmt: skip
    print(machine_line())
    confs = configs(args.pyspy or DEFAULT_PYSPY, not args.no_memory)
    names = list(confs)
    with tempfile.TemporaryDirectory(prefix="bench-profilers-") as tmp:
        # The placebo goes through the cpu driver's whole launch path (the runner waits for
        # the sampler to come up, then SIGINTs it) with a "py-spy" that only sleeps: what
        # differs from the cpu rows is the sampling itself.
        if not args.no_placebo:
            placebo = Path(tmp) / "py-spy-placebo"
            placebo.write_text("#!/bin/sh\nexec sleep 3600\n")
            placebo.chmod(0o755)
            confs[PLACEBO] = (["--profile", "cpu"], {"CLOUDPROF_PYSPY": str(placebo)})
            names.insert(1, PLACEBO)
        rates: dict[str, list[float]] = {n: [] for n in names}
        per_cpu: dict[str, list[float]] = {n: [] for n in names}  # units per CPU-s of the trial
        notes: dict[str, str] = {}
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                time.sleep(args.gap)
                extra, env = confs[name]
                s = trial(Path(tmp) / "t", [*base, *extra], env)
                prof = s.get("profile") or {}
                if extra and name != PLACEBO and prof.get("status") != "ok":
                    notes[name] = f"no profile: {prof.get('reason')}"
                rates[name].append(float(s["units_per_s"]))
                per_cpu[name].append(float(s["units"]) / max(float(s["cpu_seconds"]), 1e-9))
            print(f"round {r + 1}/{args.rounds}: "
                  + ", ".join(f"{n} {rates[n][-1]:,.1f}" for n in names), flush=True)  # fmt: skip
    rows = []
    for name in names:
        ratios = [on / off for on, off in zip(rates[name], rates["none"], strict=True) if off > 0]
        q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
        cpu_ratios = [a / b for a, b in zip(per_cpu[name], per_cpu["none"], strict=True)]
        rows.append([name, len(ratios), median(rates[name]), median(ratios),
                     100 * (1 - median(ratios)), f"{q[0]:.3f}..{q[2]:.3f}",
                     100 * (1 - median(cpu_ratios)), notes.get(name, "")])  # fmt: skip
    headers = ["config", "rounds", "units/s (median)", "ratio to none", "overhead %",
               "ratio IQR", "overhead per CPU-s %", "note"]  # fmt: skip
    title = (f"{args.workload}, {args.workers} workers, {args.duration:g} s trials, "
             f"gap {args.gap:g} s")
    print_table(headers, rows, title=title)


if __name__ == "__main__":
    main()
