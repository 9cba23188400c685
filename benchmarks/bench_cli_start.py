"""What a cloudprof command costs before it does anything, library set beside library set.

    python benchmarks/bench_cli_start.py                                  # this environment
    python benchmarks/bench_cli_start.py --path /tmp/typer28 --path ""    # two library sets

Each command runs as ``python -m orchestrator.cli ARGS`` in a fresh process with its
bytecode cached. ``--path DIR`` puts DIR ahead of the installed packages (e.g. a
``pip install --target DIR typer==0.28.0``), so one environment compares two versions
of a dependency; ``""`` is the environment as installed. The sets alternate run by
run (a neighbour's load hits each alike); the table shows the median and min–max wall.

- ``--help``: the top-level help (Typer and Rich only);
- ``sweep --help``: one command's help, every option described;
- ``sweep -m no-such-machine --dry-run``: argument parsing and the spec's validation,
  then a one-line error: what every sweep pays before its first step, nothing paid.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from _common import ROOT, machine_line, median, print_table

COMMANDS = (
    ["--help"],
    ["sweep", "--help"],
    ["sweep", "-m", "no-such-machine", "--dry-run"],
)


def run_once(path: str, args: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, str(ROOT)) if p),
           "COLUMNS": "100"}  # fmt: skip
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env,
                   capture_output=True, check=False)  # fmt: skip
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--path", action="append", default=None,
                    help="a directory ahead of the installed packages (repeatable; \"\": none)")
    ap.add_argument("--repeats", type=int, default=15, help="runs per command and set")
    args = ap.parse_args()
    paths = args.path if args.path is not None else [""]
    print(f"machine: {machine_line()}")
    for path in paths:  # compile and cache each set's bytecode before timing
        for command in COMMANDS:
            run_once(path, command)
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for i, command in enumerate(COMMANDS):
            for path in paths:
                times.setdefault((path, i), []).append(run_once(path, command))
    rows = []
    for i, command in enumerate(COMMANDS):
        for path in paths:
            values = times[(path, i)]
            rows.append([" ".join(command), path or "(as installed)", median(values),
                         f"{min(values):.3f}–{max(values):.3f}"])  # fmt: skip
    print_table(["command", "ahead on the path", "s (median)", "min–max"], rows,
                title=f"python -m orchestrator.cli, {args.repeats} runs each, interleaved")


if __name__ == "__main__":
    main()
