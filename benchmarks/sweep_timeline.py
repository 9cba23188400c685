"""One local dry run as a timeline: when each engine step began and ended, and each trial's parts.

    python benchmarks/sweep_timeline.py                      # the 6 x 2 s sweep of bench_sweep.py
    python benchmarks/sweep_timeline.py --duration 1 --frames 8 --rows 200 --cols 200 --dim 50

Not a comparison (``bench_sweep.py`` is): one sweep, to see *where* its time
goes. The sweep runs as the command a user types, through the console script's
entry point, in a fresh process; the engine's steps are wrapped with a clock
(their behaviour unchanged). Printed: every step's start and end (seconds since
the process began, its thread), then per trial: from the engine's launch of the
runner to the trial's clock besides ``prepare()``, the trial's own wall
(``started_at`` to ``finished_at``) against its measured seconds, from its end
to the engine's record of it, and the record itself.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import ROOT, add_input_args, input_spec, machine_line

STEPS = (
    ("orchestrator.spec.config", None, "build_spec"),
    ("orchestrator.engine.sweep", None, "render_plan"),
    ("orchestrator.engine.sweep", None, "generate_inputs"),
    ("orchestrator.results.store", "RunStore", "create"),
    ("orchestrator.results.store", "RunStore", "ensure_trials_table"),
    ("orchestrator.engine.sweep", None, "_execute"),
    ("orchestrator.engine.staging", "Staging", "run_once"),
    ("orchestrator.engine.host_session", "HostSession", "provision"),
    ("orchestrator.engine.host_session", "HostSession", "connect"),
    ("orchestrator.engine.warm_runner", "WarmRunner", "launch"),
    ("orchestrator.engine.staging", None, "upload_inputs"),
    ("orchestrator.engine.host_session", "HostSession", "stage_inputs"),
    ("orchestrator.engine.machines", "Machines", "_import_pandas"),
    ("orchestrator.engine.warm_runner", "WarmRunner", "wait_ready"),
    ("orchestrator.engine.trial_runner", "TrialRunner", "run"),
    ("orchestrator.engine.trial_runner", "TrialRunner", "record"),
    ("orchestrator.engine.warm_runner", "WarmRunner", "stop"),
    ("orchestrator.engine.outcome", None, "finish"),
    ("orchestrator.results.publish", None, "report_run"),
)
TRIAL, RECORD = "run", "record"  # the trial runner's steps, timed per trial below


def child(args: argparse.Namespace, out: str) -> None:
    """The sweep, in this process, with the steps clocked; the events as JSON on stdout."""
    import importlib

    t0 = time.perf_counter()
    epoch0 = time.time() - (time.perf_counter() - t0)
    events: list[tuple[float, str, str, str]] = []

    def clocked(owner: Any, name: str) -> None:
        real = getattr(owner, name)

        def wrapper(*a: Any, **kw: Any) -> Any:
            thread = threading.current_thread().name
            events.append((time.perf_counter() - t0, thread, ">", name))
            try:
                return real(*a, **kw)
            finally:
                events.append((time.perf_counter() - t0, thread, "<", name))

        setattr(owner, name, wrapper)

    for module, cls, name in STEPS:
        mod = importlib.import_module(module)
        clocked(getattr(mod, cls) if cls else mod, name)
    events.append((time.perf_counter() - t0, "MainThread", "-", "imports done"))
    sys.argv = ["cloudprof", "sweep", "-m", "n2-highcpu-80", "--dry-run",
                "--workers", args.workers, "--repeats", str(args.trial_repeats),
                "--duration", str(args.duration), "--frames", str(args.frames),
                "--rows", str(args.rows), "--cols", str(args.cols), "--dim", str(args.dim),
                "--out", out]  # fmt: skip
    from orchestrator.cli import main as cloudprof

    with contextlib.redirect_stdout(io.StringIO()):
        code = cloudprof()
    events.append((time.perf_counter() - t0, "MainThread", "-", "sweep returned"))
    trials = [json.loads(p.read_text()) for p in Path(out).rglob("summary.json")
              if "trials" in p.parts]  # fmt: skip
    print(json.dumps({"code": code, "epoch0": epoch0, "events": events, "trials": [
        {k: t.get(k) for k in ("started_at", "finished_at", "load_s", "prepare_s", "seconds")}
        for t in trials]}))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per trial")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--trial-repeats", type=int, default=3, help="repeats per worker count")
    add_input_args(ap)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args, args.child)
        return
    from workloads.inputs import ensure_inputs

    print(f"machine: {machine_line()}")
    ensure_inputs(input_spec(args), None)  # generated before the sweep, never timed
    with tempfile.TemporaryDirectory(prefix="sweep-timeline-") as tmp:
        argv = [sys.executable, __file__, *sys.argv[1:], "--child", str(Path(tmp) / "runs")]
        started = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, check=False,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"the sweep failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"sweep process: {wall:.2f} s from its start to its exit\n")
    print("   at s  thread        step")
    for at, thread, edge, name in data["events"]:
        if name not in (TRIAL, RECORD):
            print(f"{at:7.3f}  {thread[:12]:12}  {edge} {name}")
    runs = [(at, edge) for at, _, edge, name in data["events"] if name == TRIAL]
    records = [(at, edge) for at, _, edge, name in data["events"] if name == RECORD]
    starts = [at for at, edge in runs if edge == ">"]
    rec_in = [at for at, edge in records if edge == ">"]
    rec_out = [at for at, edge in records if edge == "<"]
    trials = sorted(data["trials"], key=lambda t: t["started_at"])

    def since(stamp: str) -> float:
        return datetime.fromisoformat(stamp).timestamp() - data["epoch0"]

    print("\ntrial  launch→clock less prepare()  trial wall (seconds)  end→record  record")
    for i, t in enumerate(trials):
        clock, end = since(t["started_at"]), since(t["finished_at"])
        print(f"{i + 1:5}  {clock - starts[i] - t['prepare_s']:27.3f}  "
              f"{end - clock:10.3f} ({t['seconds']:.3f})  {rec_in[i] - end:10.3f}  "
              f"{rec_out[i] - rec_in[i]:6.3f}")
    print("(started_at and finished_at are to the millisecond)")


if __name__ == "__main__":
    main()
