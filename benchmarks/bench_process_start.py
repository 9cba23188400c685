"""What each fresh process of a trial costs before it does any work, checkout beside checkout.

    python benchmarks/bench_process_start.py                          # this checkout
    python benchmarks/bench_process_start.py --code /tmp/before --code .   # interleaved

A trial starts two Python processes of the data plane: the runner
(``python -m workloads.run``) and its sampler (``python -m workloads.sampler``,
which the runner waits for before t = 0). Measured, each in fresh processes with
the checkout on PYTHONPATH and its bytecode cached (as an installed wheel's is on a VM):

- *interpreter*: ``python -c pass``, the floor every process pays (the same for every
  checkout: a check on the machine's noise);
- *runner imports*: ``python -c "import workloads.run"``, what the runner imports before
  it parses its arguments (a trial then imports its workload's own libraries);
- *sampler start*: ``Agent.spawn()``, from starting the sampler process to its "ready" line
  (its interpreter, imports, /proc readers and NVML probe), timed in the parent.

The checkouts alternate round by round, so a neighbour's load hits each alike; the
table shows the median and quartiles over every round, and each checkout's median
per-round difference from the first one (paired, which cancels what the rounds share).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
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
    times.append(time.perf_counter() - start)
    agent.start().stop()  # a trial of no length: the sampler sends its result and exits
print(json.dumps(times))
"""


def _env(code: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": code}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # cached bytecode, as an installed wheel has
    return env


def _wall(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def one_round(code: str, per_round: int) -> dict[str, list[float]]:
    """Each measurement ``per_round`` times for one checkout."""
    env = _env(code)
    out: dict[str, list[float]] = {
        "interpreter": [_wall([sys.executable, "-c", "pass"], env) for _ in range(per_round)],
        "runner imports": [_wall([sys.executable, "-c", "import workloads.run"], env)
                           for _ in range(per_round)],
    }  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", SPAWN_DRIVER, str(per_round)], env=env,
                          check=True, capture_output=True, text=True)
    out["sampler start"] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10, help="rounds (checkouts alternate)")
    ap.add_argument("--per-round", type=int, default=5, help="processes per measure and round")
    ap.add_argument("--code", action="append", default=None,
                    help="a checkout to measure (repeatable; default: this one)")
    args = ap.parse_args()
    print(f"machine: {machine_line()}")
    codes = [str(Path(c).resolve()) for c in (args.code or [str(ROOT)])]
    for code in codes:  # compile and cache each checkout's bytecode before timing
        one_round(code, 1)
    rounds: dict[str, list[dict[str, list[float]]]] = {c: [] for c in codes}
    for _ in range(args.rounds):
        for code in codes:
            rounds[code].append(one_round(code, args.per_round))
    measures = list(rounds[codes[0]][0])
    rows = []
    for code in codes:
        for measure in measures:
            values = [v for r in rounds[code] for v in r[measure]]
            q1, _, q3 = statistics.quantiles(values, n=4)
            diffs = [statistics.median(mine[measure]) - statistics.median(first[measure])
                     for mine, first in zip(rounds[code], rounds[codes[0]], strict=True)]
            rows.append([code, measure, 1000 * statistics.median(values),
                         f"{1000 * q1:.1f}–{1000 * q3:.1f}",
                         "" if code == codes[0] else f"{1000 * statistics.median(diffs):+.1f}"])
    print_table(["checkout", "process", "ms (median)", "quartiles", "vs first (paired)"], rows,
                title=f"fresh processes: {args.rounds} rounds x {args.per_round} each, "
                "checkouts interleaved")


if __name__ == "__main__":
    main()
