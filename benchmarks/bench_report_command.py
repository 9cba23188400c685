"""`cloudprof report`, `report --json` and `compare` as a user runs them, checkout beside checkout.

    python benchmarks/bench_report_command.py --code /tmp/before --code .
    python benchmarks/bench_report_command.py --code . --store runs/<sweep-id> --repeats 9

Each command runs as ``python -m orchestrator ARGS`` in a fresh process with its
bytecode cached (one untimed run per checkout and command first), on a fresh copy of
the store (``report`` writes report.md, report.html and plots/ into it). The store
is a real one: ``cloudprof sweep -m n2-highcpu-80 --dry-run --workers 1,2 --repeats 3
--duration 1`` (6 trials with their time series), made with the first checkout before
anything is timed (or ``--store``). The checkouts alternate run by run, so a
neighbour's load hits each alike; the table shows the median and min–max wall of the
whole process (start, imports, the command, exit), and whether it imported pandas.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine_line, median, print_table

PROBE = ("import sys, runpy; sys.argv = ['cloudprof', *sys.argv[1:]]; "
         "code = 0\ntry:\n    runpy.run_module('orchestrator', run_name='__main__')\n"
         "except SystemExit as exc:\n    code = exc.code\n"
         "sys.stderr.write(f'\\npandas={\"pandas\" in sys.modules}\\n'); sys.exit(code)")


def make_store(code: str, tmp: Path) -> Path:
    out = tmp / "runs"
    subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "-m", "n2-highcpu-80",
                    "--dry-run", "--workers", "1,2", "--repeats", "3", "--duration", "1",
                    "--out", str(out)], env=env_for(code), check=True, capture_output=True)
    (run,) = out.iterdir()
    return run


def env_for(code: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(code).resolve()), "COLUMNS": "160"}


def run_once(code: str, args: list[str], store: Path, tmp: Path) -> tuple[float, bool]:
    """Wall seconds of one command on a fresh copy of ``store``; whether it imported pandas."""
    copy = tmp / "copy" / store.name
    shutil.rmtree(copy.parent, ignore_errors=True)
    shutil.copytree(store, copy, ignore=shutil.ignore_patterns("report.*", "plots"))
    argv = [a.replace("{run}", str(copy)) for a in args]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], env=env_for(code),
                          capture_output=True, text=True, cwd=tmp)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{code}: cloudprof {' '.join(argv)} failed: {proc.stderr[-2000:]}")
    return wall, "pandas=True" in proc.stderr


COMMANDS = (["report", "{run}"], ["report", "--json", "{run}"], ["compare", "{run}", "{run}"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--code", action="append", default=None, help="a checkout (repeatable)")
    ap.add_argument("--store", help="an existing run directory (default: make a 6-trial dry run)")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per command and checkout")
    args = ap.parse_args()
    codes = args.code or ["."]
    print(f"machine: {machine_line()}")
    with tempfile.TemporaryDirectory(prefix="bench-report-cmd-") as name:
        tmp = Path(name)
        start = time.perf_counter()
        store = Path(args.store) if args.store else make_store(codes[0], tmp)
        print(f"store: {store.name} ({time.perf_counter() - start:.1f} s to make)")
        for code in codes:  # bytecode cached, caches warm, before anything is timed
            for command in COMMANDS:
                run_once(code, command, store, tmp)
        times: dict[tuple[str, int], list[float]] = {}
        pandas: dict[tuple[str, int], bool] = {}
        for _ in range(args.repeats):
            for i, command in enumerate(COMMANDS):
                for code in codes:
                    wall, loaded = run_once(code, command, store, tmp)
                    times.setdefault((code, i), []).append(wall)
                    pandas[(code, i)] = pandas.get((code, i), False) or loaded
    rows = []
    for i, command in enumerate(COMMANDS):
        for code in codes:
            values = times[(code, i)]
            rows.append([" ".join(c if c != "{run}" else "RUN" for c in command), code,
                         median(values), f"{min(values):.3f}–{max(values):.3f}",
                         "yes" if pandas[(code, i)] else "no"])
    print_table(["cloudprof", "checkout", "wall s (median)", "min–max", "imports pandas"], rows,
                title=f"python -m orchestrator ARGS, {args.repeats} runs each, interleaved")


if __name__ == "__main__":
    main()
