"""What a ``cloudprof`` process pays after its work is done: the interpreter's shutdown.

    python benchmarks/bench_cli_exit.py                          # this checkout
    python benchmarks/bench_cli_exit.py --code /tmp/before --code .   # side by side

A command that has loaded pandas, pyarrow and the report (the end of every sweep,
``cloudprof report``) leaves ~10^5 objects for the interpreter's collections at
shutdown to walk. Each round runs ``python -m orchestrator.cli report RUN`` once per
checkout, interleaved (a neighbour's load hits every checkout alike), on the same
small store (made first by a real ``--dry-run`` sweep: 2 trials). The work each
process does is the same in every checkout; what differs between two checkouts' walls
is how they end. Medians with min–max of ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, machine_line, median, print_table


def make_store(out: Path) -> Path:
    """A real dry-run store of 2 short trials on small inputs."""
    from rich.console import Console

    from orchestrator.engine.sweep import run_sweep
    from orchestrator.spec.spec import SweepSpec

    spec = SweepSpec(machines=["n2-highcpu-8"], workers=[1, 2], repeats=1, duration_s=0.5,
                     workload_params={"frames": "4", "rows": "40", "cols": "40", "dim": "8"},
                     out=out, dry_run=True)
    run_dir = run_sweep(spec, console=Console(file=open(os.devnull, "w")))  # noqa: SIM115
    assert run_dir is not None
    return run_dir


def one_report(code: str, run_dir: Path) -> float:
    """Wall seconds of ``cloudprof report RUN`` run from ``code``, as a fresh process."""
    env = {**os.environ, "PYTHONPATH": code}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "report", str(run_dir)],
                          capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"cloudprof report failed with {code} (exit {proc.returncode}): "
                 f"{proc.stderr[-2000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--code", action="append", default=None,
                    help="a checkout to run the command from (repeatable; default: this one)")
    args = ap.parse_args()
    print(f"machine: {machine_line()}")
    codes = [str(Path(c).resolve()) for c in (args.code or [str(ROOT)])]
    with tempfile.TemporaryDirectory(prefix="bench-cli-exit-") as tmp:
        os.environ.setdefault("CLOUDPROF_CACHE", str(Path(tmp) / "cache"))
        run_dir = make_store(Path(tmp) / "runs")
        for code in codes:
            one_report(code, run_dir)  # bytecode compiled, page cache warm
        walls: dict[str, list[float]] = {c: [] for c in codes}
        for _ in range(args.rounds):
            for code in codes:
                walls[code].append(one_report(code, run_dir))
    rows = [[code, median(w), f"{min(w):.3f}–{max(w):.3f}"] for code, w in walls.items()]
    if len(codes) > 1:
        base = median(walls[codes[0]])
        for row, code in zip(rows, codes, strict=True):
            row.append(f"{median(walls[code]) - base:+.3f}")
    print_table(["checkout", "s (median)", "min–max"] + (["vs first"] if len(codes) > 1 else []),
                rows, title=f"cloudprof report RUN (2 trials), {args.rounds} interleaved rounds")


if __name__ == "__main__":
    main()
