"""What a local host's trial costs besides its load phase and its clock, trial after trial.

    python benchmarks/bench_trial_cycle.py                            # this checkout
    python benchmarks/bench_trial_cycle.py --code /tmp/before --code .  # interleaved

``bench_sweep.py`` times whole sweeps, whose noise (the cube's ``prepare()`` alone
varies by a second on a shared 2-core host) hides a few milliseconds per trial. This
one runs only the trial path of a local dry run, many times: a warm runner
(``python -m workloads.warm serve``, as the engine launches it), then ``--trials``
trials one after another through the local host's executor (``LocalExecutor.run``
with the command ``WarmRunner.argv`` gives: the client's command line), each with its
runner's ``--put`` into a ``file://`` bucket, as a sweep's are. Between two trials
the sweep process records the last one; here that is ``--record-ms`` of CPU work
in the calling process (default 25 ms: ``sweep_timeline.py``'s "end→record" plus
"record" are 0.03-0.09 s), so that what the runner does after its result is
written can overlap it, as in a sweep.

The workload is the cube on the article's inputs (783 MiB of Parquet, generated or
found in the cache before anything is timed; ``--frames`` etc. as in the other
benchmarks), ``--duration`` seconds a trial at 10 Hz, as ``bench_sweep.py``'s
sweeps run it: its ``prepare()`` loads what a trial's exit has to free. Printed per
checkout, two spans per trial (from ``summary.json``'s figures, to the millisecond):
the median over a run's trials (the first dropped), then the median and min-max of
``--repeats`` runs, the checkouts alternating run by run:

- *set-up before the clock*: the runner's ``load_s`` (from its fork) less its
  ``prepare_s``: mapping the server's pages, parsing, the host's facts, the
  result writer's warm-up;
- *around the runner*: ``LocalExecutor.run``'s span less ``load_s`` and the trial's
  wall (``started_at`` to ``finished_at``, which holds the sampler's start and
  stop): the request (a client process, where a checkout starts one), and after
  the trial its measurements, result files and put, and its exit — or, where the
  exit overlaps the record, the next trial's wait for what is left of it (the
  record itself is not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from _common import ROOT, add_input_args, input_spec, machine_line, median, print_table


def child(args: argparse.Namespace) -> None:
    """One run of ``--trials`` trials with the checkout on sys.path; JSON on stdout."""
    sys.path.insert(0, args.code[0])
    from orchestrator.engine.warm_runner import WarmRunner
    from orchestrator.providers.local import LocalExecutor

    root = Path(args.out)
    ex = LocalExecutor(root)
    warm = WarmRunner(ex, "cube", lambda line: print(line, file=sys.stderr))
    warm.launch()
    if not warm.wait_ready():
        sys.exit("the warm runner did not start")
    outside: list[float] = []
    setup: list[float] = []
    try:
        for i in range(args.trials):
            out = root / "trials" / str(i)
            manifest = root / f"put-{i}.json"
            manifest.write_text(json.dumps([
                {"path": str(out / name), "optional": True,
                 "url": (root / "bucket" / str(i) / name).as_uri()}
                for name in ("timeseries.parquet", "summary.json")]))  # fmt: skip
            argv = warm.argv(["--workload", "cube", *args.params,
                              "--workers", "1", "--duration", f"{args.duration:g}",
                              "--sample-hz", "10", "--quiet", "--put", str(manifest),
                              "--out", str(out)])  # fmt: skip
            start = time.perf_counter()
            result = ex.run(argv, timeout=600)
            spent = time.perf_counter() - start
            if result.exit_code != 0:
                sys.exit(f"trial {i} exited {result.exit_code}: {result.stdout_tail}")
            s = json.loads((out / "summary.json").read_text())
            wall = (datetime.fromisoformat(s["finished_at"])
                    - datetime.fromisoformat(s["started_at"])).total_seconds()  # fmt: skip
            record_until = time.perf_counter() + args.record_ms / 1000
            while time.perf_counter() < record_until:  # the sweep's record of the trial
                pass
            outside.append(spent - s["load_s"] - wall)
            setup.append(s["load_s"] - s["prepare_s"])
    finally:
        warm.stop(ex)
    # each trial's wait for the last one's exit falls in its own span: drop the first
    print(json.dumps({"outside_s": outside[1:], "setup_s": setup[1:]}))


def one_run(args: argparse.Namespace, code: str) -> tuple[float, float]:
    """Median seconds per trial of set-up before the clock and around the runner, in a
    fresh process."""
    with tempfile.TemporaryDirectory(prefix="bench-trial-cycle-") as tmp:
        argv = [sys.executable, __file__, "--child", "--code", code, "--out", tmp,
                "--trials", str(args.trials), "--duration", str(args.duration),
                "--record-ms", str(args.record_ms)]
        for param in args.params:
            argv += ["--runner-param", param]
        env = {**os.environ, "PYTHONPATH": code}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        sys.exit(f"a run of {code} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return median(data["setup_s"]), median(data["outside_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="runs per checkout (interleaved)")
    ap.add_argument("--trials", type=int, default=9, help="trials per run (the first dropped)")
    ap.add_argument("--duration", type=float, default=0.5, help="seconds per trial")
    add_input_args(ap)
    ap.add_argument("--record-ms", type=float, default=25.0,
                    help="CPU work between trials, standing for the sweep's record")
    ap.add_argument("--code", action="append", default=None,
                    help="a checkout to run (repeatable; default: this one)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--runner-param", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.params = [x for p in args.runner_param for x in ("--param", p)]
        child(args)
        return
    from workloads.inputs import ensure_inputs

    print(f"machine: {machine_line()}")
    directory = ensure_inputs(input_spec(args), None)  # before anything is timed
    args.params = [f"inputs={directory}", f"frames={args.frames}", f"rows={args.rows}",
                   f"cols={args.cols}", f"dim={args.dim}", f"seed={args.seed}"]
    codes = [str(Path(c).resolve()) for c in (args.code or [str(ROOT)])]
    runs: dict[str, list[tuple[float, float]]] = {c: [] for c in codes}
    for i in range(args.repeats):
        for code in codes:  # interleaved: a neighbour's load hits every checkout alike
            setup, around = one_run(args, code)
            runs[code].append((setup, around))
            print(f"  run {i + 1} ({code}): set-up {1000 * setup:.1f} ms, around "
                  f"{1000 * around:.1f} ms per trial", flush=True)

    def cell(values: list[float]) -> str:
        return f"{1000 * median(values):.1f} ({1000 * min(values):.1f}–{1000 * max(values):.1f})"

    rows = [[code, cell([r[0] for r in v]), cell([r[1] for r in v]),
             cell([r[0] + r[1] for r in v])] for code, v in runs.items()]  # fmt: skip
    print_table(["checkout", "set-up before the clock, ms", "around the runner, ms", "sum, ms"],
                rows, title=f"per trial, median (min–max) of {args.repeats} runs of "
                f"{args.trials - 1} cube trials of {args.duration:g} s (after the first), "
                f"{args.record_ms:g} ms of record between trials")


if __name__ == "__main__":
    main()
