"""What the --command path costs: the cube job as a plain script vs the built-in workload.

Both sides run the same kernel (``workloads.cube``) on the same generated
inputs, one trial each in alternating order per round: the built-in workload
in the runner's process, and ``examples/cube_script/cube_job.py`` as a
``--command --job`` whose cubes it reports with ``cloudprof:units`` lines. The
script's rate is its "cubes" phase's (units over that phase's wall time), so
its start-up and input loading are left out as the built-in's ``prepare`` is.
The figures are the medians over rounds of rate(script) / rate(built-in), with
their spread: per second of wall time, and per CPU-second the cubes took (the
runner's process for the built-in, the script's tree in its "cubes" phase),
which holds up better when neighbours steal CPU.

    python benchmarks/bench_command_job.py                  # ~1 minute on 2 cores
    python benchmarks/bench_command_job.py --rounds 5 --duration 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, machine_line, median, print_table

RUN = [sys.executable, "-m", "workloads.run", "--quiet", "--sample-hz", "10"]
SIZE = {"frames": 20, "rows": 1000, "cols": 1000, "dim": 100}
SCRIPT_DIR = ROOT / "examples" / "cube_script"


def _trial(out: Path, args: list[str], env: dict[str, str]) -> dict:
    if out.exists():
        shutil.rmtree(out)
    proc = subprocess.run([*RUN, "--out", str(out), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    summary = json.loads((out / "summary.json").read_text())
    if proc.returncode != 0 or summary["status"] != "ok":
        raise SystemExit(f"trial failed ({proc.returncode}): {summary.get('error')}")
    return summary


def builtin_rate(tmp: Path, workers: int, duration: float,
                 env: dict[str, str]) -> tuple[float, float]:
    params = [x for k, v in SIZE.items() for x in ("--param", f"{k}={v}")]
    s = _trial(tmp / "builtin", ["--workload", "cube", *params, "--workers", str(workers),
                                 "--duration", f"{duration:g}"], env)
    return float(s["units_per_s"]), s["units"] / s["cpu_seconds"]


def script_rate(tmp: Path, workers: int, duration: float,
                env: dict[str, str]) -> tuple[float, float]:
    args = [f"--{k}={v}" for k, v in SIZE.items()]
    # Its start-up and prepare come first: give the cubes phase the same duration.
    s = _trial(tmp / "script", ["--command", "--job", "--chdir", str(SCRIPT_DIR),
                                "--workers", str(workers), "--duration", f"{duration + 3:g}",
                                "--", "python", "cube_job.py", *args], env)
    (cubes,) = [p for p in s["phases"] if p["name"] == "cubes"]
    return float(cubes["units_per_s"]), cubes["units"] / cubes["cpu_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--workers", type=int, default=1)
    args, _ = ap.parse_known_args()
    with tempfile.TemporaryDirectory(prefix="cloudprof-bench-job-") as tmp_dir:
        tmp = Path(tmp_dir)
        env = {**os.environ, "CLOUDPROF_CACHE": str(tmp / "cache"),
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                             if p)}
        builtin_rate(tmp, 1, 0.5, env)  # generate the inputs once, untimed
        rows, ratios, cpu_ratios = [], [], []
        for r in range(args.rounds):
            sides = [("builtin", builtin_rate), ("script", script_rate)]
            if r % 2:
                sides.reverse()  # alternate which side runs first
            rate = {name: fn(tmp, args.workers, args.duration, env) for name, fn in sides}
            ratios.append(rate["script"][0] / rate["builtin"][0])
            cpu_ratios.append(rate["script"][1] / rate["builtin"][1])
            rows.append([r + 1, f"{rate['builtin'][0]:,.0f}", f"{rate['script'][0]:,.0f}",
                         f"{ratios[-1]:.3f}", f"{rate['builtin'][1]:,.0f}",
                         f"{rate['script'][1]:,.0f}", f"{cpu_ratios[-1]:.3f}"])
    print(machine_line())
    print_table(["round", "built-in cubes/s", "script cubes/s", "script / built-in",
                 "built-in cubes/CPU-s", "script cubes/CPU-s", "script / built-in (CPU)"], rows,
                title=f"cube {SIZE}, {args.workers} worker(s), {args.duration:g} s per trial")
    for what, values in (("per wall second", ratios), ("per CPU-second", cpu_ratios)):
        print(f"script / built-in {what}: median {median(values):.3f} (min {min(values):.3f}, "
              f"max {max(values):.3f}, {len(values)} rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
