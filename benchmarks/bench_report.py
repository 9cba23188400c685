"""Writing a report: the text alone vs text and plots, on a real ~10-trial results store.

    python benchmarks/bench_report.py [--rounds 3]

The store comes from a real ``--dry-run`` sweep run first (one machine, worker
counts 1..16, two repeats: 10 trials with their time series). Then, in
interleaved rounds:

1. the text report (load the store, summarise, render report.md and
   report.html — what ``print_summary`` does before printing);
2. the whole ``write_report`` (the same plus the SVG figures).

Target: the whole report in a few seconds for ~10 trials. Medians of wall and
of CPU seconds: on a shared machine the CPU-seconds ratio is the fairer one.
Also the import cost of ``orchestrator.results.report`` against pandas', each in a fresh
interpreter, because the CLI imports the report module on every ``report``.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import machine_line, median, print_table, wall_and_cpu

from orchestrator.engine.sweep import run_sweep
from orchestrator.results import report
from orchestrator.spec.spec import SweepSpec


def make_store(out: Path) -> Path:
    from rich.console import Console

    spec = SweepSpec(
        machines=["n2-highcpu-16"],
        workers=[1, 2, 4, 8, 16],
        repeats=2,
        duration_s=0.5,
        workload_params={"frames": 8, "rows": 100, "cols": 200, "dim": 50},
        out=out,
        dry_run=True,
    )
    return run_sweep(spec, console=Console(file=io.StringIO()))


def text_report(run_dir: Path) -> None:
    built = report.build_report(report.load_run(run_dir))
    report.render_markdown(built)
    report.render_html(built)


def import_seconds(module: str, rounds: int) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    runs = [
        float(subprocess.check_output([sys.executable, "-c", code], text=True))
        for _ in range(rounds)
    ]
    return median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = make_store(Path(tmp))
        trials = len(report.load_run(run_dir).trials)
        report.write_report(run_dir)  # warm: pandas, pyarrow, numpy
        text, full = [], []
        for _ in range(args.rounds):
            text.append(wall_and_cpu(lambda: text_report(run_dir)))
            full.append(wall_and_cpu(lambda: report.write_report(run_dir)))
        plots = len(list((run_dir / report.PLOTS_DIR).glob("*.svg")))
    rows = [
        [label, median([w for w, _ in times]), median([c for _, c in times])]
        for label, times in (("text (md + html)", text), (f"write_report ({plots} SVGs)", full))
    ]
    print(machine_line())
    print_table([f"report of a {trials}-trial store", "wall s", "CPU s"], rows)
    print(f"plots cost {rows[1][2] / rows[0][2]:.1f}x the text alone (CPU seconds)")
    ours, pandas = import_seconds("orchestrator.results.report", 3), import_seconds("pandas", 3)
    print_table(
        ["import (fresh interpreter)", "seconds"],
        [["orchestrator.results.report", ours], ["pandas", pandas]],
    )
    print(f"importing orchestrator.results.report costs {ours / pandas:.2f}x importing pandas")


if __name__ == "__main__":
    main()
