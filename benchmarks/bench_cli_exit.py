"""What a ``cloudprof`` process pays after its work is done: the interpreter's shutdown.

    python benchmarks/bench_cli_exit.py                               # this checkout
    python benchmarks/bench_cli_exit.py --code /tmp/before --code .   # side by side

A command that has loaded pandas, pyarrow and the report (the end of every sweep,
``cloudprof report``) leaves ~10^5 objects for the interpreter's collections at
shutdown to walk. Each round runs ``cloudprof report RUN`` once per checkout,
interleaved, on the same small store (made first by a real ``--dry-run`` sweep: 2
trials), through the console script's own entry point (``orchestrator.cli.main()``
with ``sys.argv``), and times two things: the process's whole wall, and its *exit*:
from the moment ``main()`` returned (the command's work done, its exit code known) to
the moment the parent saw the process end. The exit is measured within each process,
so a neighbour's load blurs it far less than the wall. Medians with min–max.
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


_WRAPPER = """
import sys, time
from orchestrator import cli
sys.argv = ["cloudprof", "report", sys.argv[1]]
code = cli.main()
sys.stderr.write(f"\\nreturned-at {time.time()!r}\\n")
sys.exit(code)
"""


def one_report(code: str, run_dir: Path) -> tuple[float, float]:
    """(wall, exit) seconds of ``cloudprof report RUN`` run from ``code`` as a fresh process."""
    env = {**os.environ, "PYTHONPATH": code}
    start = time.perf_counter()
    # ``-c`` puts the working directory first on sys.path: run in the store, where no
    # checkout's orchestrator/ can shadow the one PYTHONPATH names.
    proc = subprocess.run([sys.executable, "-c", _WRAPPER, str(run_dir)], cwd=run_dir,
                          capture_output=True, text=True, env=env, check=False)
    ended = time.time()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"cloudprof report failed with {code} (exit {proc.returncode}): "
                 f"{proc.stderr[-2000:]}")
    returned = float(proc.stderr.rsplit("returned-at ", 1)[1].split()[0])
    return wall, ended - returned


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
        exits: dict[str, list[float]] = {c: [] for c in codes}
        for _ in range(args.rounds):
            for code in codes:
                wall, exit_s = one_report(code, run_dir)
                walls[code].append(wall)
                exits[code].append(exit_s)
    rows = [[code, median(exits[code]), f"{min(exits[code]):.3f}–{max(exits[code]):.3f}",
             median(walls[code]), f"{min(walls[code]):.3f}–{max(walls[code]):.3f}"]
            for code in codes]
    print_table(["checkout", "exit s (median)", "min–max", "wall s (median)", "min–max"],
                rows, title=f"cloudprof report RUN (2 trials), {args.rounds} interleaved rounds")


if __name__ == "__main__":
    main()
