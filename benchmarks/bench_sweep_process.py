"""The ``cloudprof sweep`` process's own critical path in a local dry run, around its trials.

    python benchmarks/bench_sweep_process.py                              # this checkout
    python benchmarks/bench_sweep_process.py --code /tmp/before --code .  # side by side

``bench_sweep.py`` splits a dry run's wall by phase; most of it is the trial runners'
(their start-up, their load phase, their exit), which other work changes. This one
isolates what the sweep process itself puts on the critical path, where the host
runs no trial and waits for cloudprof:

- *before the first trial*: from the process's start to the first trial runner's
  launch (interpreter start, imports, planning, the store, staging the inputs);
- *between trials*: from one trial runner's end to the next one's launch, less the
  results upload (``transfer put``, timed apart: it is a process of its own);
- *after the last trial*: from the last runner's end to the process's exit (its upload
  excluded likewise; the record, the report, teardown and the interpreter's exit).

Each sweep is ``cloudprof sweep -m n2-highcpu-80 --dry-run --workers 1,2 --repeats 3``
run through the CLI's own entry point (``orchestrator.cli.main``) in a fresh process,
with the article's inputs (generated or found in the cache first, so no sweep pays
for that); the checkouts alternate sweep by sweep. Medians with min–max of
``--repeats`` sweeps per checkout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, add_input_args, input_spec, machine_line, median, print_table

COLUMNS = ("before the first trial", "between trials (sum)", "after the last trial")


def child(args: argparse.Namespace) -> None:
    """One sweep through the CLI entry point, its runner calls timed; JSON to ``--report``."""
    import atexit
    import threading

    sys.path.insert(0, args.code[0])
    from orchestrator.engine import sweep
    from orchestrator.engine.warm_runner import is_trial_command
    from orchestrator.providers import local

    calls: list[dict[str, Any]] = []
    lock = threading.Lock()
    # the trial runner's put step (a checkout from before the engine's rooms: the engine's)
    if hasattr(sweep, "_Engine"):
        putter: Any = sweep._Engine
    else:
        from orchestrator.engine.trial_runner import TrialRunner as putter
    real_run, real_upload = local.LocalExecutor.run, putter._upload_results

    def run(self: Any, argv: Any, **kw: Any) -> Any:
        start = time.time()
        try:
            return real_run(self, argv, **kw)
        finally:
            # a fresh runner, or a warm runner's client (which lives as long as its trial)
            kind = "trial" if is_trial_command(list(argv)) else "other"
            with lock:
                calls.append({"kind": kind, "start": start, "end": time.time()})

    def upload(self: Any, *a: Any, **kw: Any) -> Any:
        start = time.time()
        try:
            return real_upload(self, *a, **kw)
        finally:
            with lock:
                calls.append({"kind": "upload", "start": start, "end": time.time()})

    local.LocalExecutor.run = run  # type: ignore[method-assign]
    putter._upload_results = upload
    # Written from an exit handler: after the command, before the interpreter's shutdown.
    atexit.register(lambda: Path(args.report).write_text(json.dumps(calls)))
    from orchestrator import cli

    sys.argv = ["cloudprof", "sweep", "-m", "n2-highcpu-80", "--dry-run", "--workers",
                args.workers, "--repeats", str(args.trial_repeats), "--duration",
                str(args.duration), "--frames", str(args.frames), "--rows", str(args.rows),
                "--cols", str(args.cols), "--dim", str(args.dim), "--out", args.out]
    sys.exit(cli.main())


def path_of(calls: list[dict[str, Any]], started: float, ended: float) -> dict[str, float]:
    """The three stretches of the critical path from one sweep's timed calls."""
    trials = sorted((c for c in calls if c["kind"] == "trial"), key=lambda c: c["start"])
    uploads = sorted((c for c in calls if c["kind"] == "upload"), key=lambda c: c["start"])

    def upload_within(lo: float, hi: float) -> float:
        return sum(u["end"] - u["start"] for u in uploads if lo <= u["start"] < hi)

    between = sum(nxt["start"] - cur["end"] - upload_within(cur["end"], nxt["start"])
                  for cur, nxt in itertools.pairwise(trials))
    last = trials[-1]["end"]
    return {"before the first trial": trials[0]["start"] - started,
            "between trials (sum)": between,
            "after the last trial": ended - last - upload_within(last, ended)}


def one_sweep(args: argparse.Namespace, code: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-sweep-process-") as tmp:
        report = Path(tmp) / "calls.json"
        argv = [sys.executable, __file__, "--child", "--code", code, "--out",
                str(Path(tmp) / "runs"), "--report", str(report), "--duration",
                str(args.duration), "--workers", args.workers, "--trial-repeats",
                str(args.trial_repeats), "--frames", str(args.frames), "--rows", str(args.rows),
                "--cols", str(args.cols), "--dim", str(args.dim)]
        env = {**os.environ, "PYTHONPATH": code}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as an installed package: bytecode cached
        started = time.time()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        ended = time.time()
        if proc.returncode != 0:
            sys.exit(f"a sweep of {code} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        return path_of(json.loads(report.read_text()), started, ended)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="sweeps per checkout")
    ap.add_argument("--duration", type=float, default=1.0, help="seconds per trial")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--trial-repeats", type=int, default=3)
    add_input_args(ap)
    ap.add_argument("--code", action="append", default=None,
                    help="a checkout to run the sweeps (repeatable; default: this one)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--report", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    from workloads.inputs import ensure_inputs

    print(f"machine: {machine_line()}")
    ensure_inputs(input_spec(args), None)
    codes = [str(Path(c).resolve()) for c in (args.code or [str(ROOT)])]
    results: dict[str, list[dict[str, float]]] = {c: [] for c in codes}
    for i in range(args.repeats):
        for code in codes:
            path = one_sweep(args, code)
            results[code].append(path)
            print(f"  sweep {i + 1} ({code}): " + ", ".join(f"{k} {v:.2f} s"
                                                            for k, v in path.items()))
    rows = []
    for code in codes:
        totals = [sum(p.values()) for p in results[code]]
        rows.append([code, *(f"{median([p[k] for p in results[code]]):.2f} "
                             f"({min(p[k] for p in results[code]):.2f}–"
                             f"{max(p[k] for p in results[code]):.2f})" for k in COLUMNS),
                     f"{median(totals):.2f} ({min(totals):.2f}–{max(totals):.2f})"])
    trials = args.trial_repeats * len(args.workers.split(","))
    print_table(["checkout", *(f"{k}, s" for k in COLUMNS), "total, s"], rows,
                title=f"the sweep process's critical path around {trials} trials "
                f"(medians, min–max, of {args.repeats} sweeps)")


if __name__ == "__main__":
    main()
