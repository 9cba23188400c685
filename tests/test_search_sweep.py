"""``sweep --search``: a real local dry run over simulated machine types, planned by search.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from orchestrator.engine.sweep import run_sweep
from orchestrator.errors import UsageError
from orchestrator.results import report
from orchestrator.results.store import SWEEP_FILE, TRIALS_FILE
from orchestrator.spec.config import build_spec


def _values(tmp_path: Path, **over: object) -> dict[str, object]:
    values: dict[str, object] = {
        "search": "cost", "family": ["n2-highcpu"], "vcpus": "2-32", "budget": 3,
        "workers": "1,2", "repeats": 1, "duration": "1", "workload": "sleep",
        "params": ["unit_ms=20"], "out": tmp_path / "runs", "dry_run": True, "sample_hz": 10.0,
    }  # fmt: skip
    values.update(over)
    return values


def test_a_dry_run_search_tries_at_most_its_budget_of_candidates_and_reports_its_pick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDPROF_CACHE", str(tmp_path / "cache"))
    # the test renders the report itself: the sweep writes none of its files
    spec = build_spec(_values(tmp_path, report=False))
    assert spec.machines == [f"n2-highcpu-{v}" for v in (2, 4, 8, 16, 32)]
    console = Console(file=io.StringIO(), width=250)
    run_dir = run_sweep(spec, console=console)
    out = console.file.getvalue()
    assert "at most 3 of these 5 candidate machines" in out
    sweep = json.loads((run_dir / SWEEP_FILE).read_text())
    search = sweep["search"]
    assert sweep["status"] == "done"  # the untried candidates are not "missing" trials
    assert 2 <= len(search["tried"]) <= 3
    trials = pd.read_parquet(run_dir / TRIALS_FILE)
    assert set(trials["machine"]) == set(search["measured"])
    assert len(set(sweep["vms"])) == len(search["tried"])  # only the tried machines got a VM
    cost = {m: v["cost"] for m, v in search["measured"].items()}
    assert search["pick_machine"] == min(cost, key=cost.__getitem__)
    assert 0.0 <= search["confidence"] <= 1.0
    assert search["estimated_cost_usd"] < search["estimated_grid_cost_usd"]
    assert f"--search cost: picked {search['pick_machine']}" in out
    text = report.render_markdown(report.build_report(report.load_run(run_dir)))
    assert f"--search cost: picked {search['pick_machine']}" in text.replace("\\", "")
    # --resume: the search finished, so nothing runs again
    run_sweep(spec, resume=run_dir, console=Console(file=io.StringIO()))
    assert len(pd.read_parquet(run_dir / TRIALS_FILE)) == len(trials)


def test_the_plan_of_a_search_bounds_its_cost_by_the_budget_of_machines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDPROF_CACHE", str(tmp_path / "cache"))
    spec = build_spec(_values(tmp_path, budget=2))
    console = Console(file=io.StringIO(), width=250)
    assert run_sweep(spec, console=console, plan_only=True) is None
    out = console.file.getvalue()
    assert "Search (--search cost: the lowest cost per unit): at most 2 of these 5" in out
    assert "(the 2 dearest candidates) against" in out
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"search": None}, "--family selects the machines --search tries"),
        ({"family": ["n2-highcpux"]}, "--family: 'n2-highcpux' is not in the catalog"),
        ({"vcpus": "8-2"}, "--vcpus: expected 1 <= min <= max"),
        ({"vcpus": "2-2"}, "--search needs at least 2 candidate machines, found 1"),
        ({"search": "speed"}, "--search: expected one of cost, throughput"),
    ],
)
def test_a_bad_search_is_one_line_before_anything_runs(tmp_path, over, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_spec(_values(tmp_path, **over))


def test_a_search_and_its_candidates_can_come_from_sweep_toml(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text('search = "throughput"\nbudget = 2\nfamily = ["n2-highcpu"]\n'
                      'vcpus = [4, 16]\nmax_price = 0.3\n')
    spec = build_spec({"dry_run": True, "out": tmp_path / "runs"}, config)
    assert spec.search == "throughput" and spec.budget == 2
    assert spec.machines == ["n2-highcpu-4", "n2-highcpu-8"]  # 16 vCPUs cost more than $0.3/h


def test_a_deadline_needs_search_and_total_and_lands_in_the_plan(tmp_path):
    from orchestrator.errors import UsageError
    from orchestrator.plan.planner import make_plan

    out = str(tmp_path / "runs")
    with pytest.raises(UsageError, match="--deadline is --search's constraint"):
        build_spec({"machines": ["n2-highcpu-8"], "deadline": "10m", "out": out})
    with pytest.raises(UsageError, match="--total"):
        build_spec({"search": "cost", "family": ["n2-highcpu"], "deadline": "10m", "out": out})
    spec = build_spec({"search": "cost", "family": ["n2-highcpu"], "vcpus": "2-16",
                       "deadline": "10m", "total": 1_200_000, "out": out})
    from orchestrator.catalog.machines import lookup

    plan = make_plan(spec, "s1", [lookup(m) for m in spec.machines])
    assert plan.search is not None
    assert plan.search["min_rate"] == pytest.approx(1_200_000 / 600)
