"""``cloudprof runs``: the runs under --out, read from real stores (table and --json)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestrator import cli
from orchestrator.catalog.machines import MachineType
from orchestrator.plan.planner import TrialPlan, make_plan
from orchestrator.results.runs import fmt_age, list_runs
from orchestrator.results.store import RunStore, trial_row
from orchestrator.spec.spec import SweepSpec

MACHINE = MachineType(provider="gcp", name="n2-highcpu-8", family="n2", vcpus=8,
                      memory_gib=8.0, region="us-central1", price_on_demand=0.36,
                      price_spot=0.09, price_source="test", price_date="2024-06-01")


def summary(units_per_s: float, status: str = "ok") -> dict:
    return {
        "schema": "cloudprof.trial/1", "status": status, "error": None, "unit": "cube",
        "units": int(units_per_s * 2), "seconds": 2.0, "units_per_s": units_per_s,
        "peak_rss_bytes": 100 << 20, "cpu_utilisation": 0.5,
        "host": {"hostname": "h", "cores_logical": 2, "memory_bytes": 4 << 30},
    }


def make_run(out: Path, sweep_id: str, results: list[tuple[int, int, float, str]],
             created_at: str, status: str = "done") -> RunStore:
    """A store as a sweep leaves it: sweep.json with the plan, one row per (workers, repeat)."""
    spec = SweepSpec(machines=[MACHINE.name], workers=[1, 2], repeats=2)
    plan = make_plan(spec, sweep_id, [MACHINE])
    store = RunStore.create(out / sweep_id, {"sweep_id": sweep_id, "spec": spec.to_dict(),
                                             "plan": plan.to_dict(), "dry_run": True})
    store.update_sweep(created_at=created_at, status=status)
    for workers, repeat, ups, trial_status in results:
        trial = TrialPlan(f"{MACHINE.name}-w{workers}-r{repeat}", MACHINE.name, workers, repeat, [])
        store.record_trial(trial_row(summary(ups, trial_status), MACHINE, trial=trial,
                                     sweep_id=sweep_id, ran_on="local", provider="local"), None)
    return store


@pytest.fixture
def out(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    make_run(runs, "20260101-000000-aaaa",
             [(1, 0, 100.0, "ok"), (1, 1, 120.0, "ok"), (2, 0, 150.0, "ok"),
              (2, 1, 90.0, "ok")], created_at="2026-01-01T00:00:00Z")
    make_run(runs, "20260102-000000-bbbb", [(1, 0, 50.0, "ok"), (2, 0, 0.0, "failed")],
             created_at="2026-01-02T00:00:00Z", status="partial")
    (runs / "not-a-run").mkdir()  # ignored: no sweep.json
    broken = runs / "20260103-000000-cccc"
    broken.mkdir()
    (broken / "sweep.json").write_text("{not json")
    return runs


def test_list_runs_reads_status_machines_trials_best_cost_and_age_from_the_store(
    out: Path,
) -> None:
    now = time.mktime(time.strptime("2026-01-03 00:00:00", "%Y-%m-%d %H:%M:%S")) - time.timezone
    first, second, third = sorted(list_runs(out, now=now), key=lambda r: r.id)
    assert (first.status, first.machines, first.trials_planned) == ("done", ["n2-highcpu-8"], 4)
    assert (first.trials_ok, first.trials_failed) == (4, 0)
    # best = the highest median over repeats (w1: 110, w2: 120), not the single best trial (w2 150)
    assert first.best is not None and (first.best.workers, first.best.units_per_s) == (2, 120.0)
    assert first.best.repeats == 2
    assert first.age_s == pytest.approx(2 * 86400)
    plan = json.loads((out / first.id / "sweep.json").read_text())["plan"]
    assert first.estimated_cost_usd == pytest.approx(plan["estimated_total_cost_usd"])
    assert (second.status, second.trials_ok, second.trials_failed) == ("partial", 1, 1)
    assert second.best is not None and second.best.workers == 1
    assert third.status == "unreadable" and third.error and "sweep.json" in third.error
    # newest first, by the recorded creation time
    assert [r.id for r in list_runs(out, now=now)][:2] == [second.id, first.id]


def test_runs_prints_one_row_per_run_and_json_for_scripts(
    out: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # wide enough for one row per run, whatever the shell
    code = cli.main(["runs", "--out", str(out), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and len(data) == 3
    by_id = {row["id"]: row for row in data}
    row = by_id["20260101-000000-aaaa"]
    assert row["best"] == {"machine": "n2-highcpu-8", "workers": 2, "units_per_s": 120.0,
                           "repeats": 2}
    assert row["trials_ok"] == 4 and row["status"] == "done" and row["age_s"] > 0

    code = cli.main(["runs", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    lines = [line for line in text.splitlines() if line.startswith("2026")]
    # newest first; a run whose sweep.json cannot be read has no time and comes last, with why
    assert [line[:8] for line in lines] == ["20260102", "20260101", "20260103"]
    assert "unreadable" in lines[2] and "20260103-000000-cccc: sweep.json:" in text
    done = next(line for line in lines if line.startswith("20260101"))
    assert "done (dry run)" in done and "4/4" in done and "120 (n2-highcpu-8 × 2)" in done


def test_runs_under_an_empty_or_missing_directory_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["runs", "--out", str(tmp_path / "none")]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "no runs under" in err
    assert cli.main(["runs", "--out", str(tmp_path / "none"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


@pytest.mark.parametrize(("seconds", "expected"),
                         [(None, "-"), (5, "5s"), (125, "2m"), (7300, "2h01m"),
                          (3 * 86400 + 4 * 3600, "3d04h")])
def test_ages_are_shown_in_the_unit_that_matters(seconds: float | None, expected: str) -> None:
    assert fmt_age(seconds) == expected


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_runs_never_wraps_a_cell_and_stacks_when_the_table_is_too_wide(
    out: Path, columns: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    assert cli.main(["runs", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "…" not in text  # nothing cut short
    assert all(len(line) <= columns for line in text.splitlines())
    for whole in ("20260101-000000-aaaa", "done (dry run)", "n2-highcpu-8", "120"):
        assert whole in text  # on one line, never split
    stacked = "best 120 units/s, n2-highcpu-8 × 2 workers" in text
    assert stacked == (columns < 120), text
