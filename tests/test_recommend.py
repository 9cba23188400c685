"""`cloudprof recommend` on stores whose right answer is known by construction.

Each store is written in the results-store layout (``tests.test_report.write_store``):
machines with chosen rates, prices, peaks and memory, so which one is cheapest, which
misses a deadline and which does not fit its memory follows from the figures alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator import cli
from orchestrator.results.recommend import MIN_BILLED_S, billed_cost, parse_margin
from tests.test_report import write_store

MIB = 2**20
TOTAL = 1_000_000  # units

# machine: (price USD/h, units/s, peak MiB, memory GiB)
GCP = {"n2-highcpu-2": (0.10, 1000.0, 300, 2.0),   # cheapest, 1000 s: slow
       "n2-highcpu-4": (0.40, 2000.0, 300, 4.0),   # 500 s
       "n2-highcpu-8": (0.80, 5000.0, 900, 1.0)}   # 200 s, cheaper than -4, peak near its memory


def _store(run_dir: Path, machines: dict[str, tuple[float, float, int, float]],
           provider: str = "gcp", sweep: dict[str, Any] | None = None, **extra: Any) -> Path:
    trials = [{"machine": m, "workers": 2, "repeat": r, "units_per_s": rate,
               "price_per_hour": price, "peak_rss_bytes": peak * MIB, "memory_gib": gib,
               "provider": provider, **extra}
              for m, (price, rate, peak, gib) in machines.items() for r in range(2)]
    return write_store(run_dir, trials, sweep={"sweep_id": run_dir.name, **(sweep or {})},
                       timeseries=False)


def _recommend(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict | str, str]:
    code = cli.main(["recommend", *args])
    out = capsys.readouterr()
    if "--json" in args and code == 0:
        return code, json.loads(out.out), out.err
    return code, out.out, out.err


def _cost(machine: str, table: dict = GCP, start: float = 0.0) -> float:
    price, rate, _peak, _gib = table[machine]
    return billed_cost(TOTAL / rate + start, price)


def test_without_constraints_the_cheapest_wins(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = _store(tmp_path / "gcp", GCP)
    code, doc, _ = _recommend(capsys, str(run), "--total", str(TOTAL), "--memory-margin", "0",
                              "--json")
    assert code == 0
    assert doc["choice"]["machine"] == min(GCP, key=_cost) == "n2-highcpu-2"
    assert doc["choice"]["cost"] == pytest.approx(_cost("n2-highcpu-2"))
    assert doc["choice"]["seconds"] == pytest.approx(TOTAL / GCP["n2-highcpu-2"][1])
    assert doc["runner_up"]["machine"] == "n2-highcpu-8"
    assert not doc["start_included"]  # write_store measured no VM start


def test_a_deadline_excludes_the_cheapest_and_says_why(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = _store(tmp_path / "gcp", GCP)
    code, out, _ = _recommend(capsys, str(run), "--total", str(TOTAL), "--deadline", "10m",
                              "--memory-margin", "5%")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("Choice:") and "n2-highcpu-8 × 2" in lines[0]
    assert lines[1].startswith("Runner-up:") and "n2-highcpu-4 × 2" in lines[1]
    (why,) = [line for line in lines if line.strip().startswith("n2-highcpu-2 × 2")]
    assert "misses the 10.0 min deadline" in why
    assert any("VM start" in line and "not included" in line for line in lines)


def test_a_memory_margin_excludes_a_machine(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    run = _store(tmp_path / "gcp", GCP)
    # 900 MiB + 20 % = 1080 MiB does not fit 1 GiB; + 10 % = 990 MiB does
    code, doc, _ = _recommend(capsys, str(run), "--total", str(TOTAL), "--deadline", "10m",
                              "--memory-margin", "20%", "--json")
    assert code == 0 and doc["choice"]["machine"] == "n2-highcpu-4"
    assert doc["runner_up"] is None
    (tight,) = [c for c in doc["rejected"] if c["machine"] == "n2-highcpu-8"]
    assert any("does not fit" in r for r in tight["reasons"])
    code, doc, _ = _recommend(capsys, str(run), "--total", str(TOTAL), "--deadline", "10m",
                              "--memory-margin", "10%", "--json")
    assert code == 0 and doc["choice"]["machine"] == "n2-highcpu-8"


def test_nothing_fits_is_one_line_and_a_non_zero_exit(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = _store(tmp_path / "gcp", GCP)
    code, out, err = _recommend(capsys, str(run), "--total", str(TOTAL), "--deadline", "1m")
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and "no configuration meets" in err
    code, out, err = _recommend(capsys, str(run), "--total", str(TOTAL), "--max-cost", "0.01")
    assert code != 0 and "over the $0.01" in err.replace("$0.0100", "$0.01")


def test_runs_on_two_clouds_compete_and_the_measured_vm_start_counts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gcp = _store(tmp_path / "gcp", GCP)
    aws_table = {"c7i.xlarge": (0.20, 4000.0, 300, 8.0)}  # 250 s: the cheapest, but for its start
    start = 400.0  # measured: asked for at 10:00:00, inputs staged at 10:06:40
    vms = {"vm-1": {"machine": "c7i.xlarge", "requested_at": "2026-01-01T10:00:00+00:00",
                    "inputs_staged_at": "2026-01-01T10:06:40+00:00"}}
    aws = _store(tmp_path / "aws", aws_table, provider="aws", sweep={"vms": vms})
    code, doc, _ = _recommend(capsys, str(gcp), str(aws), "--total", str(TOTAL),
                              "--memory-margin", "0%", "--json")
    assert code == 0
    costs = {m: _cost(m) for m in GCP} | {"c7i.xlarge": _cost("c7i.xlarge", aws_table, start)}
    ranked = sorted(costs, key=costs.get)
    assert [doc["choice"]["machine"], doc["runner_up"]["machine"]] == ranked[:2]
    (c7i,) = [c for c in [doc["choice"], doc["runner_up"], *doc["rejected"]]
              if c["machine"] == "c7i.xlarge"]
    assert c7i["provider"] == "aws" and c7i["start_s"] == pytest.approx(start)
    assert c7i["seconds"] == pytest.approx(TOTAL / 4000.0 + start)
    # the start pushes it past a deadline its work alone would meet
    code, doc, _ = _recommend(capsys, str(gcp), str(aws), "--total", str(TOTAL),
                              "--deadline", "5m", "--memory-margin", "0%", "--json")
    assert code == 0 and doc["choice"]["machine"] == "n2-highcpu-8"


def test_a_fixed_work_job_takes_its_time_per_run_times_the_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trials = [{"machine": m, "workers": w, "repeat": r, "units_per_s": 1.0 / s, "seconds": s,
               "job_kind": "fixed_work", "price_per_hour": price, "memory_gib": 16.0}
              for m, w, s, price in (("n2-highcpu-4", 4, 30.0, 0.2),
                                     ("n2-highcpu-16", 16, 5.0, 0.8))
              for r in range(2)]
    run = write_store(tmp_path / "fixed", trials, timeseries=False)
    code, doc, _ = _recommend(capsys, str(run), "--total", "20", "--deadline", "5m", "--json")
    assert code == 0 and doc["choice"]["machine"] == "n2-highcpu-16"
    assert doc["choice"]["seconds"] == pytest.approx(20 * 5.0)
    (slow,) = doc["rejected"]
    assert slow["seconds"] == pytest.approx(20 * 30.0)


def test_a_unit_job_needs_its_total_and_bad_input_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _store(tmp_path / "gcp", GCP)
    for args in ([str(run)], [str(run), "--total", "5", "--memory-margin", "lots"],
                 [str(run), "--total", "5", "--deadline", "soon"],
                 [str(tmp_path / "nowhere"), "--total", "5"]):
        code, out, err = _recommend(capsys, *args)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (args, err)


def test_billing_is_per_second_with_a_one_minute_minimum() -> None:
    assert billed_cost(10.0, 3.6) == pytest.approx(MIN_BILLED_S * 3.6 / 3600.0)
    assert billed_cost(90.2, 3.6) == pytest.approx(91 * 3.6 / 3600.0)
    assert parse_margin("20%") == pytest.approx(0.2) == parse_margin("0.2")


def test_a_dry_run_is_judged_on_the_planned_machines_memory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.catalog.machines import lookup

    gib = lookup("n2-highcpu-2").memory_gib
    peak = int(0.9 * gib * 1024)  # MiB: fits the machine, not with a 20 % margin
    trials = [{"machine": "n2-highcpu-2", "ran_on": "local", "provider": "local",
               "memory_gib": 64.0, "workers": 1, "repeat": r, "units_per_s": 100.0,
               "peak_rss_bytes": peak * MIB} for r in range(2)]
    vms = {"local-1": {"machine": "n2-highcpu-2", "requested_at": "2026-01-01T10:00:00+00:00",
                       "inputs_staged_at": "2026-01-01T10:00:01+00:00"}}
    run = write_store(tmp_path / "dry", trials, sweep={"sweep_id": "dry", "vms": vms},
                      timeseries=False)
    code, _, err = _recommend(capsys, str(run), "--total", "1000")
    assert code == 1 and "does not fit" in err  # the host's 64 GiB is not the machine's
    code, doc, _ = _recommend(capsys, str(run), "--total", "1000", "--memory-margin", "5%",
                              "--json")
    choice = doc["choice"]
    assert code == 0 and choice["measured_elsewhere"] and choice["provider"] == "gcp"
    assert choice["machine_bytes"] == gib * 2**30
    assert choice["start_s"] is None  # the local host's start is not the VM's
    assert any("another host" in n for n in doc["notes"])


def test_runs_of_different_jobs_do_not_compete(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cubes = _store(tmp_path / "cubes", GCP, unit="cube")
    rows = _store(tmp_path / "rows", GCP, unit="row")
    code, out, err = _recommend(capsys, str(cubes), str(rows), "--total", str(TOTAL))
    assert code == 2 and out == "" and "different jobs" in err
    assert len(err.strip().splitlines()) == 1
