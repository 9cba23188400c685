"""What each fresh process of a trial costs before it does any work, checkout beside checkout.

    python benchmarks/bench_process_start.py                          # this checkout
    python benchmarks/bench_process_start.py --code /tmp/before --code .   # interleaved

A trial starts two Python processes of the data plane: the runner
(``python -m workloads.run``) and its sampler (``workloads.sampler``'s own process,
which the runner waits for before t = 0). Measured, each in fresh processes with
the checkout on PYTHONPATH and its bytecode cached (as an installed wheel's is on a VM):

- *interpreter*: ``python -c pass``, the floor every process pays (the same for every
  checkout: a check on the machine's noise);
- *runner imports*: ``python -c "import workloads.run"``, what the runner imports before
  it parses its arguments (a trial then imports its workload's own libraries);
- *sampler start*: ``Agent.spawn()``, from starting the sampler process to its "ready" line
  (its interpreter, imports, /proc readers and NVML probe), timed in the parent;
- *trial + put*: a whole trial of one 10 ms unit at 10 Hz (``--workload sleep --units 1``),
  then its results put in a file:// bucket, as a sweep does: through the runner's ``--put``
  where the checkout has it, else with ``python -m workloads.transfer put`` after it.
  The fixed cost of a trial's processes, whatever it measures.

Each is timed twice: wall, and the CPU time of the processes it started (the sampler's
own start-up CPU, which it reports itself, for *sampler start*). On a shared 2-core host
the wall of a 100 ms process swings by tens of ms with the neighbours' load; its CPU time
much less, so CPU is the column that resolves a few ms. The checkouts alternate round by
round, so a neighbour's load hits each alike; the table shows medians and quartiles over
every process, and each checkout's median per-round difference from the first one
(paired, which cancels what the rounds share).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _common import ROOT, machine_line, print_table

SPAWN_DRIVER = """
import json, sys, time
from workloads.agent import Agent
times = []
for _ in range(int(sys.argv[1])):
    agent = Agent(sample_hz=10)
    start = time.perf_counter()
    agent.spawn()
    wall = time.perf_counter() - start
    report = agent.start().stop()  # a trial of no length: the sampler reports and exits
    times.append((wall, report.startup_cpu_seconds))
print(json.dumps(times))
"""
Sample = tuple[float, float]  # (wall s, CPU s)


def _env(code: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": code}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # cached bytecode, as an installed wheel has
    return env


def _timed(*argvs: list[str], env: dict[str, str]) -> Sample:
    """Wall and CPU (user + system of the processes and their waited-for children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    for argv in argvs:
        subprocess.run(argv, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _trial_and_put(code: str, env: dict[str, str], tmp: Path) -> Sample:
    """One short trial and the put of its results (see the module's docstring)."""
    out, bucket = tmp / "trial", tmp / "bucket"
    tmp.mkdir(parents=True)
    manifest = tmp / "put.json"
    manifest.write_text(json.dumps([{"path": str(out / n), "url": (bucket / n).as_uri(),
                                     "optional": True}
                                    for n in ("summary.json", "timeseries.parquet")]))
    runner = [sys.executable, "-m", "workloads.run", "--workload", "sleep", "--units", "1",
              "--sample-hz", "10", "--quiet", "--out", str(out)]
    if "--put" in (Path(code) / "workloads" / "run.py").read_text():
        sample = _timed([*runner, "--put", str(manifest)], env=env)
    else:  # the engine's `transfer put` after the runner, as before --put
        put = [sys.executable, "-m", "workloads.transfer", "put", str(manifest)]
        sample = _timed(runner, put, env=env)
    assert (bucket / "summary.json").is_file()
    return sample


MEASURES = ("interpreter", "runner imports", "sampler start", "trial + put")


def one_round(code: str, per_round: int, measures: Sequence[str]) -> dict[str, list[Sample]]:
    """Each of ``measures`` ``per_round`` times for one checkout."""
    env = _env(code)
    out: dict[str, list[Sample]] = {}
    if "interpreter" in measures:
        out["interpreter"] = [_timed([sys.executable, "-c", "pass"], env=env)
                              for _ in range(per_round)]
    if "runner imports" in measures:
        out["runner imports"] = [_timed([sys.executable, "-c", "import workloads.run"], env=env)
                                 for _ in range(per_round)]
    if "sampler start" in measures:
        proc = subprocess.run([sys.executable, "-c", SPAWN_DRIVER, str(per_round)], env=env,
                              check=True, capture_output=True, text=True)
        out["sampler start"] = [tuple(s)
                                for s in json.loads(proc.stdout.strip().splitlines()[-1])]
    if "trial + put" in measures:
        with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
            out["trial + put"] = [_trial_and_put(code, env, Path(tmp) / str(i))
                                  for i in range(per_round)]
    return out


def _cells(rounds: list[dict[str, list[Sample]]], first: list[dict[str, list[Sample]]],
           measure: str, which: int, paired: bool) -> list[object]:
    """Median ms, quartiles and the paired difference from the first checkout."""
    values = [s[which] for r in rounds for s in r[measure]]
    q1, _, q3 = statistics.quantiles(values, n=4)
    diffs = [statistics.median(s[which] for s in mine[measure])
             - statistics.median(s[which] for s in base[measure])
             for mine, base in zip(rounds, first, strict=True)]
    return [1000 * statistics.median(values), f"{1000 * q1:.1f}–{1000 * q3:.1f}",
            f"{1000 * statistics.median(diffs):+.1f}" if paired else ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10, help="rounds (checkouts alternate)")
    ap.add_argument("--per-round", type=int, default=5, help="processes per measure and round")
    ap.add_argument("--code", action="append", default=None,
                    help="a checkout to measure (repeatable; default: this one)")
    ap.add_argument("--only", action="append", choices=MEASURES,
                    help="measure this only (repeatable; default: all)")
    args = ap.parse_args()
    measures = args.only or MEASURES
    print(f"machine: {machine_line()}")
    codes = [str(Path(c).resolve()) for c in (args.code or [str(ROOT)])]
    # ``python -c`` and ``-m`` put the working directory first on sys.path: from a checkout
    # they would import its workloads, whatever PYTHONPATH names. Run them from nowhere.
    os.chdir(tempfile.mkdtemp(prefix="bench-start-cwd-"))
    for code in codes:  # compile and cache each checkout's bytecode before timing
        one_round(code, 1, measures)
    rounds: dict[str, list[dict[str, list[Sample]]]] = {c: [] for c in codes}
    for _ in range(args.rounds):
        for code in codes:
            rounds[code].append(one_round(code, args.per_round, measures))
    rows = []
    for code in codes:
        for measure in rounds[code][0]:
            paired = code != codes[0]
            rows.append([code, measure,
                         *_cells(rounds[code], rounds[codes[0]], measure, 0, paired),
                         *_cells(rounds[code], rounds[codes[0]], measure, 1, paired)])
    print_table(["checkout", "process", "wall ms", "quartiles", "vs first", "CPU ms",
                 "quartiles", "vs first"], rows,
                title=f"fresh processes: {args.rounds} rounds x {args.per_round} each, "
                "checkouts interleaved (vs first: median of per-round differences)")
    print(f"machine after: {machine_line()}")


if __name__ == "__main__":
    main()
