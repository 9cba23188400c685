"""The sweep process's own work at the end and per trial: the report, and recording trials.

    python benchmarks/bench_report.py                         # how both scale (synthetic stores)
    python benchmarks/bench_report.py --quick                 # the same, fewer rounds
    python benchmarks/bench_report.py --code ../before --code .   # two checkouts, interleaved
    python benchmarks/bench_report.py --code . --store runs/<sweep-id> --rounds 7
    python benchmarks/bench_report.py --code ../before --code . --synthetic 200x10000 --inner 1

**How they scale** (the default): synthetic stores of 1, 20 and 200 machines and 10,
1,000 and 10,000 trials (each machine's trials spread over worker counts 1, 2, 4, 8,
16 and 32 with repeats, rates drawn around a USL curve with 5 % noise; no time
series), written before anything is timed. Per store, in rounds, on a fresh copy:
``report_run`` (summary to a console in memory, report.md, report.html, plots) with
no kept fits (the first report of a run) and again with the fits the first kept
(``fits.json``: every later report). Then ``record_trial`` into a store whose table
already holds 10, 1,000 or 10,000 rows: the median of 20 records per round. Figures:
the median over rounds of wall seconds, with the min–max over rounds, and of CPU
seconds (this process, all threads; on a shared host the fairer one).

**Two checkouts** (``--code``, optionally ``--store``): the figures below for each.
With ``--synthetic MxT`` the store is a synthetic one of that size (as above) and each
round times, per fresh copy, the first report and the next (kept fits), no records.

Both run in the sweep's own process, on the critical path: ``report_run`` once at
the end of a sweep (``_finish``: the printed summary, report.md, report.html and
plots/*.svg), ``RunStore.record_trial`` once per trial (its time series copied in,
trials.parquet rewritten with the derived columns).

The store is a real one: ``cloudprof sweep -m n2-highcpu-80 --dry-run --workers 1,2
--repeats 3 --duration 1`` (6 trials with their time series), run once before
anything is timed (or ``--store``, an existing run). Then, in rounds, each
checkout in a fresh process of its own (the checkouts alternate round by round,
so a neighbour's load hits each alike), which imports what it needs and warms up
with one untimed report and record, then times ``--inner`` times, alternating:

- *report_run*: on a fresh copy of the store (without its report files), the
  summary printed to a 160-column console in memory;
- *record_trial x N*: the store's N trial rows recorded one by one, each with its
  time series, into a new store (created before the clock starts), through one
  ``RunStore`` (as the engine does).

A round's figure is the median of its ``--inner`` calls. Figures: per checkout,
the median over rounds of wall seconds and of CPU seconds (this process, all
threads: on a shared machine the fairer one), with the min–max over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, machine_line, median, print_table, wall_and_cpu

METRICS = ("report_run", "record_trial x N")
SYNTHETIC_METRICS = ("first report_run", "report_run, kept fits")


def make_store(out: Path) -> Path:
    """A 6-trial dry-run store, made by this checkout's CLI before anything is timed."""
    argv = [sys.executable, "-m", "orchestrator", "sweep", "-m", "n2-highcpu-80", "--dry-run",
            "--workers", "1,2", "--repeats", "3", "--duration", "1", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
    (run_dir,) = [p for p in out.iterdir() if (p / "sweep.json").is_file()]
    return run_dir


def child(args: argparse.Namespace) -> None:
    """One round of one checkout, in this process: JSON of wall and CPU seconds on stdout."""
    import io
    import math
    import shutil

    sys.path.insert(0, args.code[0])  # the checkout under test, ahead of this script's own
    from rich.console import Console

    from orchestrator.results.publish import report_run
    from orchestrator.results.report import REPORT_HTML, REPORT_MD
    from orchestrator.results.store import ALL_COLUMNS, RunStore, read_trials_file

    store = Path(args.store)
    rows = [
        {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
        for r in read_trials_file(store / "trials.parquet").to_dict("records")
    ]
    rows = [{c: r.get(c) for c in ALL_COLUMNS} for r in rows]

    def fresh_copy(name: str) -> Path:
        run_dir = Path(args.tmp) / name
        # hosts/ holds the local "VM"'s staged inputs (~800 MiB), which no report reads
        shutil.copytree(store, run_dir, ignore=lambda d, _: ["hosts"] if Path(d) == store else [])
        for stale in (REPORT_MD, REPORT_HTML):
            (run_dir / stale).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "plots", ignore_errors=True)
        return run_dir

    def new_store(name: str) -> RunStore:
        return RunStore.create(Path(args.tmp) / name, {"sweep_id": "bench", "spec": {},
                                                       "plan": {}})

    def record_all(target: RunStore) -> None:
        for row in rows:
            target.record_trial(dict(row), store / "timeseries" / f"{row['trial_id']}.parquet")

    def report(run_dir: Path) -> None:
        report_run(run_dir, Console(file=io.StringIO(), width=160))

    report(fresh_copy("warm-report"))  # imports: pandas, pyarrow, rich, the report modules
    if args.synthetic:
        print(json.dumps(_synthetic_rounds(args.inner, fresh_copy, report)))
        return
    record_all(new_store("warm-record"))
    timed: dict[str, list[tuple[float, float]]] = {m: [] for m in METRICS}
    for i in range(args.inner):  # alternating; each on its own fresh copy or new store
        copy, target = fresh_copy(f"report-{i}"), new_store(f"record-{i}")
        timed["report_run"].append(wall_and_cpu(lambda copy=copy: report(copy)))
        timed["record_trial x N"].append(wall_and_cpu(lambda target=target: record_all(target)))
    out: dict[str, Any] = {m: [median([w for w, _ in v]), median([c for _, c in v])]
                           for m, v in timed.items()}
    print(json.dumps({**out, "records": len(rows)}))


def _synthetic_rounds(inner: int, fresh_copy: Any, report: Any) -> dict[str, Any]:
    """``inner`` pairs on fresh copies: the first report (no fit kept: the process's
    fits cleared), then the next one (the store's fits.json, the process's cleared)."""
    from orchestrator.analysis import model

    timed: dict[str, list[tuple[float, float]]] = {m: [] for m in SYNTHETIC_METRICS}
    for i in range(inner):
        copy = fresh_copy(f"report-{i}")
        for metric in SYNTHETIC_METRICS:
            model._FITS.clear()
            timed[metric].append(wall_and_cpu(lambda copy=copy: report(copy)))
    out: dict[str, Any] = {m: [median([w for w, _ in v]), median([c for _, c in v])]
                           for m, v in timed.items()}
    return {**out, "records": 0}


def one_round(args: argparse.Namespace, code: str, store: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        argv = [sys.executable, __file__, "--child", "--code", code, "--store", str(store),
                "--tmp", tmp, "--inner", str(args.inner),
                *(["--synthetic", args.synthetic] if args.synthetic else [])]
        env = {**os.environ, "PYTHONPATH": code}
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            sys.exit(f"a round of {code} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def synthetic_rows(machines: int, trials: int, seed: int = 0) -> list[dict[str, Any]]:
    """``trials`` rows over ``machines`` machines, as a sweep records them (``trial_row``)."""
    import numpy as np

    from orchestrator.analysis.model import usl
    from orchestrator.catalog.machines import MachineType
    from orchestrator.plan.planner import TrialPlan
    from orchestrator.results.store import trial_row

    rng = np.random.default_rng(seed)
    counts = (1, 2, 4, 8, 16, 32)
    rows = []
    for i in range(trials):
        m, k = i % machines, i // machines
        workers, repeat = counts[k % len(counts)], k // len(counts)
        machine = MachineType(provider="gcp", name=f"bench-{m:03d}", family="bench", vcpus=64,
                              memory_gib=64.0, region="us-central1",
                              price_on_demand=1.0 + m / 100, price_spot=None,
                              price_source="bench", price_date="2026-01-01")
        rate = float(usl(workers, 100.0 + m, 0.03 + m % 5 / 100, 2e-4 * (1 + m % 3)))
        rate *= 1 + 0.05 * rng.standard_normal()
        summary = {"status": "ok", "unit": "cube", "units": int(rate * 2), "seconds": 2.0,
                   "units_per_s": rate, "peak_rss_bytes": (100 + workers) << 20,
                   "cpu_utilisation": 0.5, "leak": {"verdict": "ok", "slope_mb_per_s": 0.0},
                   "host": {"hostname": "h", "cores_logical": 64, "memory_bytes": 64 << 30},
                   "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:02Z"}
        plan = TrialPlan(f"bench-{m:03d}-w{workers}-r{repeat}", machine.name, workers, repeat, [])
        rows.append(trial_row(summary, machine, trial=plan, sweep_id="bench", ran_on=machine.name,
                              provider="gcp"))
    return rows


def synthetic_store(run_dir: Path, rows: list[dict[str, Any]]) -> Path:
    """A store holding ``rows``, its table written at once (as compacting its parts does)."""
    import pyarrow as pa

    from orchestrator.results.store import RunStore
    from orchestrator.results.trials_table import _merged

    store = RunStore.create(run_dir, {"sweep_id": "bench", "status": "done", "spec": {},
                                      "plan": {}})
    store._write_table(_merged(pa.table({}), rows))
    return run_dir


def _spread(values: list[float]) -> list[Any]:
    return [median(values), f"{min(values):.3g}–{max(values):.3g}", len(values)]


def _wall_cpu(timed: list[tuple[float, float]]) -> list[Any]:
    """Median wall seconds, their min–max, median CPU seconds (this process, all threads:
    on a shared, loaded host the wall time is mostly waiting for a core)."""
    return [*_spread([w for w, _ in timed])[:2], median([c for _, c in timed])]


def scale(args: argparse.Namespace) -> None:
    """The report's time and a record's cost against the store's size (see the docstring)."""
    import io
    import shutil

    from rich.console import Console

    from orchestrator.analysis import model
    from orchestrator.results.publish import report_run
    from orchestrator.results.store import RunStore

    rounds = 1 if args.quick else args.rounds
    grid = [(m, t) for t in (10, 1000, 10000) for m in (1, 20, 200) if t >= m]
    cold: dict[tuple[int, int], list[tuple[float, float]]] = {}
    warm: dict[tuple[int, int], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-report-scale-") as tmp:
        base = Path(tmp)
        stores = {key: synthetic_store(base / f"m{key[0]}-t{key[1]}", synthetic_rows(*key))
                  for key in grid}
        report_run(shutil.copytree(stores[grid[0]], base / "warm-up"),
                   Console(file=io.StringIO(), width=160))  # imports, once
        for r in range(rounds):
            for key, store in stores.items():
                copy = Path(shutil.copytree(store, base / f"round{r}-m{key[0]}-t{key[1]}"))
                for times in (cold, warm):
                    model._FITS.clear()  # as in a new process: no fit but the store's
                    times.setdefault(key, []).append(wall_and_cpu(
                        lambda copy=copy: report_run(copy, Console(file=io.StringIO(),
                                                                   width=160))))
                shutil.rmtree(copy)
            print(f"  round {r + 1}/{rounds} done", flush=True)
        rows = [[m, t, *_wall_cpu(cold[(m, t)]), *_wall_cpu(warm[(m, t)])] for m, t in grid]
        print_table(["machines", "trials", "first report s (median)", "min–max", "CPU s",
                     "with kept fits s", "min–max", "CPU s"], rows,
                    title=f"report_run on synthetic stores: median of {rounds} rounds")
        record_rows = []
        for size in (10, 1000, 10000):
            store = RunStore.open(synthetic_store(base / f"record-{size}",
                                                  synthetic_rows(20, size)))
            extra = synthetic_rows(20, size + 20 * max(rounds, 1), seed=1)[size:]
            per_round = []
            for r in range(rounds):
                times = []
                for row in extra[r * 20:(r + 1) * 20]:
                    start = time.perf_counter()
                    store.record_trial(row, None)
                    times.append(time.perf_counter() - start)
                per_round.append(median(times) * 1000)
            record_rows.append([size, *_spread(per_round)[:2]])
        print_table(["rows in the table", "record_trial ms (median)", "min–max"], record_rows,
                    title=f"record_trial: median of 20 records per round, {rounds} rounds")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="rounds (median, min-max)")
    ap.add_argument("--quick", action="store_true", help="1 round")
    ap.add_argument("--inner", type=int, default=5,
                    help="with --code: timed calls per round, in its process (their median)")
    ap.add_argument("--store", help="with --code: an existing run directory (default: make a "
                    "6-trial dry run)")
    ap.add_argument(
        "--code", action="append", default=None,
        help="compare checkouts: one whose orchestrator/ is timed (repeatable: the checkouts "
        "alternate round by round)",
    )  # fmt: skip
    ap.add_argument("--synthetic", metavar="MxT",
                    help="with --code: a synthetic store of M machines and T trials (200x10000) "
                    "instead of a dry run; times the first report and one with kept fits")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.code:
        compare(args)
        return
    print(f"machine: {machine_line()}")
    scale(args)


def compare(args: argparse.Namespace) -> None:
    print(f"machine: {machine_line()}")
    codes = [str(Path(c).resolve()) for c in (args.code or [str(ROOT)])]
    with tempfile.TemporaryDirectory(prefix="bench-report-store-") as tmp:
        if args.store:
            store = Path(args.store).resolve()
        elif args.synthetic:
            machines, trials = (int(n) for n in args.synthetic.lower().split("x"))
            store = synthetic_store(Path(tmp) / "synthetic", synthetic_rows(machines, trials))
            print(f"store: synthetic, {machines} machines and {trials} trials")
        else:
            started = time.perf_counter()
            store = make_store(Path(tmp))
            print(f"store: a 6-trial dry run, made in {time.perf_counter() - started:.1f} s "
                  "before anything is timed")
        results: dict[str, list[dict[str, Any]]] = {c: [] for c in codes}
        for i in range(args.rounds):
            for code in codes:  # interleaved: a neighbour's load hits every checkout alike
                got = one_round(args, code, store)
                results[code].append(got)
                print(f"  round {i + 1} ({code}): " + ", ".join(
                    f"{m} {got[m][0]:.3f} s" for m in got if m != "records"), flush=True)
    metrics = SYNTHETIC_METRICS if args.synthetic else METRICS
    for code in codes:
        rows = []
        n = results[code][0]["records"]
        for metric in metrics:
            wall = [r[metric][0] for r in results[code]]
            cpu = [r[metric][1] for r in results[code]]
            rows.append([metric.replace("N", str(n)), median(wall),
                         f"{min(wall):.3f}–{max(wall):.3f}", median(cpu),
                         f"{min(cpu):.3f}–{max(cpu):.3f}"])
        print_table(["in the sweep process", "wall s (median)", "min–max", "CPU s (median)",
                     "min–max"], rows,
                    title=f"{code}: medians of {args.rounds} rounds, each in a fresh process")
    if len(codes) == 2:
        a, b = codes
        for metric in metrics:
            ratio = [x[metric][1] / y[metric][1]
                     for x, y in zip(results[b], results[a], strict=True)]
            print(f"{metric}: {b} takes {median(ratio):.2f}x the CPU seconds of {a} "
                  f"(round by round, min–max {min(ratio):.2f}–{max(ratio):.2f}x)")


if __name__ == "__main__":
    main()
