"""A fixed-work job (one complete run per trial, no units reported) is measured in runs/h.

Its time to complete is what a trial measures, so its throughput is 3600 / seconds runs per
hour and its cost the price of those seconds: every figure of the report, ``compare``,
``runs``, ``report --json`` and the plots follows from it, and none shows a zero where a
time was measured. The stores here are written through the store's own API from runner
summaries of the shape a job without units leaves (``job_kind`` "fixed_work", 0 units,
0 units/s), and one comes from a real ``--dry-run --command`` sweep of a job that splits
a fixed amount of CPU work across ``{workers}`` processes.
"""

from __future__ import annotations

import json
import math
import statistics
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rich.console import Console

from orchestrator.analysis.model import KNEE_GAIN
from orchestrator.catalog.machines import MachineType
from orchestrator.plan.planner import TrialPlan
from orchestrator.results import compare, plots, report
from orchestrator.results.report.measure import RUNS, UNITS, trial_rate
from orchestrator.results.runs import read_run
from orchestrator.results.store import RunStore, trial_row
from tests.fixtures.in_process import cloudprof


def machine(name: str, price: float) -> MachineType:
    return MachineType(provider="gcp", name=name, family=name.split("-")[0], vcpus=8,
                       memory_gib=8.0, region="us-central1", price_on_demand=price,
                       price_spot=price / 4, price_source="test", price_date="2024-06-01")


FAST = machine("c2-standard-8", 0.40)  # finishes sooner, costs more an hour
CHEAP = machine("e2-standard-8", 0.10)
# seconds to complete per worker count, one per repeat: FAST stops gaining after 2 workers
FAST_TIMES = {1: [40.0, 42.0, 38.0], 2: [21.0, 20.0, 22.0], 4: [20.5, 19.5, 20.0]}
CHEAP_TIMES = {1: [60.0, 61.0, 59.0], 2: [32.0, 31.0, 33.0], 4: [31.5, 31.0, 32.0]}


def job_summary(seconds: float | None, units_per_s: float | None = None) -> dict:
    """A runner summary as a --command job leaves it: no units (fixed work) unless given."""
    fixed = units_per_s is None
    return {
        "schema": "cloudprof.trial/1", "status": "ok", "error": None,
        "unit": None if fixed else "row", "units": 0 if fixed else int(units_per_s * seconds),
        "seconds": seconds, "units_per_s": 0.0 if fixed else units_per_s,
        "job_kind": "fixed_work" if fixed else "throughput",
        "peak_rss_bytes": 200 << 20, "cpu_utilisation": 0.5, "cpu_seconds": seconds,
        "host": {"hostname": "h", "cores_logical": 8, "memory_bytes": 32 << 30},
    }  # fmt: skip


def job_store(path: Path, times: dict[MachineType, dict[int, list[float]]],
              units_per_s: float | None = None) -> Path:
    """A store of a --command job: one trial per (machine, workers, repeat), ran on itself."""
    spec = {"workload": "command", "command": "python fit.py {workers}"}
    store = RunStore.create(path, {"sweep_id": path.name, "spec": spec, "plan": {},
                                   "status": "done"})
    for m, by_workers in times.items():
        for workers, repeats in by_workers.items():
            for repeat, seconds in enumerate(repeats):
                trial = TrialPlan(f"{m.name}-w{workers}-r{repeat}", m.name, workers, repeat, [])
                store.record_trial(trial_row(job_summary(seconds, units_per_s), m, trial=trial,
                                             sweep_id=path.name, ran_on=m.name,
                                             provider="gcp"), None)
    return path


@pytest.fixture
def fixed(tmp_path: Path) -> Path:
    return job_store(tmp_path / "fixed", {FAST: FAST_TIMES, CHEAP: CHEAP_TIMES})


def price_of(name: str) -> float:
    return {FAST.name: 0.40, CHEAP.name: 0.10}[name]


def times_of(name: str) -> dict[int, list[float]]:
    return {FAST.name: FAST_TIMES, CHEAP.name: CHEAP_TIMES}[name]


# ------------------------------------------------------------------ the model


def test_the_store_holds_zero_units_and_the_summary_holds_runs_from_the_seconds(
        fixed: Path) -> None:
    from orchestrator.results.store import compact_parts

    compact_parts(fixed)  # the store's recorded parts, folded as any reader of the file does
    stored = pq.read_table(fixed / "trials.parquet").to_pylist()
    assert {r["units_per_s"] for r in stored} == {0.0}  # what the runner recorded
    run = report.load_run(fixed)
    assert run.measure is RUNS
    summary = report.summarise(run.trials)
    assert len(summary) == 6
    for r in summary.to_dict("records"):
        median_s = statistics.median(times_of(r["machine"])[r["workers"]])
        assert r["seconds_per_run"] == pytest.approx(median_s)
        assert r["units_per_s"] > 0 and RUNS.rate(r["units_per_s"]) == pytest.approx(
            3600 / median_s)
        # $ per run = price/h × seconds / 3600, the same seconds
        assert RUNS.cost(r["cost_per_million_units"]) == pytest.approx(
            price_of(r["machine"]) * median_s / 3600)
        t1 = statistics.median(times_of(r["machine"])[1])
        assert r["efficiency"] == pytest.approx(t1 / (r["workers"] * median_s))
        assert r["units_per_s_per_vcpu"] == pytest.approx(r["units_per_s"] / 8)
    # every measured trial has its rate: no zero where a time exists
    for r in run.trials.to_dict("records"):
        assert r["units_per_s"] == pytest.approx(1 / r["seconds"])


def test_best_rows_are_the_fastest_and_the_cheapest_measured_runs(fixed: Path) -> None:
    summary = report.summarise(report.load_run(fixed).trials)
    cheapest, fastest = report.best_rows(summary)
    summary = summary.to_dict("records")
    assert fastest is not None and cheapest is not None
    shortest = min(summary, key=lambda r: r["seconds_per_run"])
    assert (fastest["machine"], fastest["workers"]) == (shortest["machine"], shortest["workers"])
    assert (fastest["machine"], fastest["workers"]) == (FAST.name, 4)  # 20.0 s
    cost = {(r["machine"], r["workers"]): price_of(r["machine"]) * r["seconds_per_run"] / 3600
            for r in summary}
    assert (cheapest["machine"], cheapest["workers"]) == min(cost, key=cost.get)
    assert cheapest["machine"] == CHEAP.name
    # the Pareto front over (time, $ per run): no row both finishes sooner and costs less
    seconds = {(r["machine"], r["workers"]): r["seconds_per_run"] for r in summary}
    front = {(r["machine"], r["workers"]) for r in summary if r["pareto"]}
    for a in front:
        assert not any(seconds[b] < seconds[a] and cost[b] < cost[a] for b in seconds), a
    for b in set(seconds) - front:  # and every row off it is beaten on both
        assert any(seconds[a] <= seconds[b] and cost[a] <= cost[b] for a in front), b
    assert (FAST.name, 4) in front and min(cost, key=cost.get) in front


def test_the_knee_is_where_the_time_stops_falling(fixed: Path) -> None:
    run = report.load_run(fixed)
    summary = report.summarise(run.trials)
    knee_of = report.knees(summary, report.model.samples(run.trials))
    # 2 workers finish in about half the time of 1; 4 gain less than KNEE_GAIN on 2
    t = {w: statistics.median(reps) for w, reps in FAST_TIMES.items()}
    assert t[1] / t[2] > 1 + KNEE_GAIN > t[2] / t[4]
    for key in ((FAST.name, FAST.name), (CHEAP.name, CHEAP.name)):
        assert knee_of[key].reached and knee_of[key].workers == 2


# ------------------------------------------------------------------ what a user reads


def test_the_report_speaks_runs_per_hour_and_dollars_per_run(fixed: Path) -> None:
    console = Console(record=True, width=250)
    built = report.print_summary(fixed, console)
    text = console.export_text()
    assert built.measure is RUNS
    results = next(t for t in built.tables if t.title.startswith("Results per machine"))
    assert {"time/run", "runs/h", "$/run"} <= set(results.headers)
    assert "units/s" not in results.headers and "$/M units" not in results.headers
    rate_at = results.headers.index("runs/h")
    for row in results.rows:
        assert row.cells[rate_at] not in ("0", "0.00", report.DASH)
    assert "no price known" not in text
    cheap_s = statistics.median(CHEAP_TIMES[4])  # 31.5 s at $0.10/h: the least per run
    assert (f"Best by cost: {CHEAP.name} × 4 workers, "
            f"{report.fmt_usd(0.10 * cheap_s / 3600)} per run") in text
    assert f"Best by throughput: {FAST.name} × 4 workers, 180 runs/h (20.0 s per run)" in text
    assert f"Scaling stops for {FAST.name}: 2 workers" in text
    machines = next(t for t in built.tables if t.title.startswith("Per machine"))
    assert "best runs/h" in machines.headers
    usl = next(t for t in built.tables if t.title.startswith("Scaling model"))
    assert "X(N*) runs/h" in usl.headers
    # the USL fit of one run per time to complete: its peak is near the 20 s the runs took
    fit = built.usl_models[(FAST.name, FAST.name)].fit
    assert RUNS.rate(fit.x_star) == pytest.approx(3600 / 20.0, rel=0.1)
    assert 2 <= fit.n_star <= 4
    fast_row = next(r for r in usl.rows if r.cells[0] == FAST.name)
    assert fast_row.cells[4].startswith(report.fmt_rate(RUNS.rate(fit.x_star)))


def test_report_json_carries_the_measure_and_figures_in_it(fixed: Path) -> None:
    doc = report.report_document(report.load_run(fixed))
    json.dumps(doc, allow_nan=False)
    assert doc["measure"]["name"] == "runs/h" and doc["measure"]["kind"] == "fixed-work"
    assert doc["measure"]["cost_name"] == "$/run"
    for row in doc["results"]:
        median_s = statistics.median(times_of(row["machine"])[row["workers"]])
        assert row["seconds_per_run"] == pytest.approx(median_s)
        assert row["runs_per_hour"] == pytest.approx(3600 / median_s)
        assert row["cost_per_run"] == pytest.approx(price_of(row["machine"]) * median_s / 3600)
        assert row["units_per_s"] > 0
    best = doc["best"]["by_throughput"]
    assert (best["machine"], best["workers"]) == (FAST.name, 4)
    assert best["runs_per_hour"] == pytest.approx(180.0)
    assert doc["best"]["by_cost"]["cost_per_run"] == pytest.approx(0.10 * 31.5 / 3600)
    fast = next(m for m in doc["machines"] if m["machine"] == FAST.name)
    assert fast["knee_workers"] == 2 and fast["best_runs_per_hour"] == pytest.approx(180.0)


def test_a_job_with_units_keeps_units_per_second(tmp_path: Path) -> None:
    run_dir = job_store(tmp_path / "units", {FAST: {1: [2.0], 2: [2.0]}}, units_per_s=500.0)
    run = report.load_run(run_dir)
    assert run.measure is UNITS
    doc = report.report_document(run)
    assert doc["measure"]["name"] == "units/s" and doc["measure"]["kind"] == "units"
    assert all("runs_per_hour" not in row for row in doc["results"])
    assert {row["units_per_s"] for row in doc["results"]} == {500.0}
    built = report.build_report(run)
    assert "units/s" in built.tables[0].headers and "time/run" not in built.tables[0].headers


def test_compare_shows_runs_per_hour_and_the_ratio_of_two_fixed_work_runs(
        tmp_path: Path) -> None:
    before = job_store(tmp_path / "before", {FAST: FAST_TIMES})
    halved = {w: [s / 2 for s in reps] for w, reps in FAST_TIMES.items()}
    after = job_store(tmp_path / "after", {FAST: halved})
    console = Console(record=True, width=250)
    heads = compare.compare_runs([before, after], console)
    text = console.export_text()
    line = next(x for x in text.splitlines() if "best runs/h " in x and "vCPU" not in x)
    assert "180 (20.0 s/run)" in line and "360 (10.0 s/run)" in line and "×2.00" in line
    cost_line = next(x for x in text.splitlines() if "best $ per run" in x)
    assert "×0.50" in cost_line
    assert heads[0].best_units_per_s.value == pytest.approx(1 / 20.0)
    doc = compare.compare_document(heads, [before, after])
    assert doc["runs"][0]["measure"]["name"] == "runs/h"
    metric = doc["runs"][1]["metrics"]["best_units_per_s"]
    assert metric["in_measure"] == pytest.approx(360.0) and metric["ratio_to_first"] == 2.0
    # a run measured in units is shown in its own measure, with no ratio to runs
    units = job_store(tmp_path / "units", {FAST: {1: [2.0], 2: [2.0]}}, units_per_s=500.0)
    console = Console(record=True, width=250)
    compare.compare_runs([before, units], console)
    line = next(x for x in console.export_text().splitlines()
                if "best runs/h " in x and "vCPU" not in x)
    assert "500 units/s — c2-standard-8 × 1" in line and "differs" in line


def test_runs_lists_a_fixed_work_jobs_best_by_its_time(fixed: Path) -> None:
    best = read_run(fixed).best
    assert best is not None
    assert (best.machine, best.workers, best.measure) == (FAST.name, 4, "runs/h")
    assert best.seconds_per_run == 20.0 and best.rate == pytest.approx(180.0)
    assert best.units_per_s == pytest.approx(1 / 20.0)


def test_the_figures_draw_runs_per_hour_and_dollars_per_run(fixed: Path) -> None:
    run = report.load_run(fixed)
    summary = report.summarise(run.trials)
    fig = plots.throughput_figure(summary, run.trials, measure=run.measure)
    layers = {layer.get("description"): layer["encoding"] for layer in fig.to_dict()["layer"]}
    assert layers["median"]["y"]["title"] == "runs/h (median)"
    drawn = [float(y) for c in fig.layer if c.description in ("median", "repeats")
             for y in c.data["value"] if math.isfinite(float(y))]
    assert drawn and max(drawn) == pytest.approx(180.0, rel=0.2)  # runs/h, not runs/s
    cost = plots.cost_figure(summary, measure=run.measure)
    points = {layer.get("description"): layer["encoding"] for layer in cost.to_dict()["layer"]}
    assert points["points"]["x"]["title"] == "runs/h (median)"
    assert points["points"]["y"]["title"] == "USD per run"


# ------------------------------------------------------------------ a real sweep

WORK = textwrap.dedent('''\
    """A fixed amount of CPU work split across the given number of processes; no units."""
    import sys
    from multiprocessing import Pool


    def burn(n: int) -> int:
        total = 0
        for i in range(n):
            total += i * i
        return total


    if __name__ == "__main__":
        workers = int(sys.argv[1])
        with Pool(workers) as pool:
            pool.map(burn, [12_000_000 // workers] * workers)
''')


@pytest.mark.slow
def test_a_dry_run_sweep_of_a_fixed_work_job_reports_runs_from_its_measured_times(
        tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "work.py").write_text(WORK)
    env = {"CLOUDPROF_CACHE": str(tmp_path / "cache")}  # each command in this process
    result = cloudprof(
        "sweep", "--machine", "n2-highcpu-2", "--dry-run", "--workers", "1,2", "--repeats", "3",
        "--workdir", str(project), "--command", "python work.py {workers}",
        "--out", str(tmp_path / "runs"), cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert "no price known" not in result.stdout and "runs/h" in result.stdout
    stored = pq.read_table(run_dir / "trials.parquet").to_pylist()
    assert {r["job_kind"] for r in stored} == {"fixed_work"}
    price = stored[0]["price_per_hour"]
    assert price > 0
    seconds = {w: statistics.median(r["seconds"] for r in stored
                                    if r["workers"] == w and r["status"] == "ok")
               for w in (1, 2)}
    done = cloudprof("report", "--json", str(run_dir), cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["measure"]["name"] == "runs/h"
    for row in doc["results"]:
        s = seconds[row["workers"]]
        assert row["units_per_s"] > 0 and row["seconds_per_run"] == pytest.approx(s)
        assert row["runs_per_hour"] == pytest.approx(3600 / s)
        assert row["cost_per_run"] == pytest.approx(price * s / 3600)
    fastest = min(seconds, key=seconds.get)
    assert doc["best"]["by_throughput"]["workers"] == fastest
    assert doc["best"]["by_cost"]["workers"] == fastest  # one price: the fastest is cheapest
    (machine,) = doc["machines"]
    if seconds[1] / seconds[2] > 1 + KNEE_GAIN:  # 2 workers clearly sooner on this host
        assert machine["knee_workers"] != 1
        assert "scaling stops at 1 worker" not in result.stdout.lower()
    listed = cloudprof("runs", "--json", "--out", str(tmp_path / "runs"), cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)
    assert entry["best"]["measure"] == "runs/h" and entry["best"]["workers"] == fastest
    assert entry["best"]["rate"] == pytest.approx(3600 / seconds[fastest])


def test_the_strategies_rank_a_fixed_work_trial_by_its_time_not_its_stored_zero(
        fixed: Path) -> None:
    """--adaptive and --search read trials.parquet rows as stored (0 units/s for a fixed-work
    run); trial_rate is what they compare: 1 / seconds, and units/s for a job with units."""
    for row in pq.read_table(fixed / "trials.parquet").to_pylist():
        assert row["units_per_s"] == 0.0
        assert trial_rate(row) == pytest.approx(1 / row["seconds"])
    assert trial_rate({"job_kind": "units", "units_per_s": 12.5, "seconds": 4.0}) == 12.5
    assert math.isnan(trial_rate({"job_kind": "fixed_work", "units_per_s": 0.0, "seconds": 0}))
