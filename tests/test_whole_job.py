"""Forecasts, whole-job totals and recommendations at a target size, on stores whose right
answer is known by construction (``tests.test_report.write_store``): rates, times, peaks,
prices and VM starts chosen so the time, the bill and the winner follow from them alone."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from orchestrator import cli
from orchestrator.results import forecast
from tests.test_report import write_store

MIB = 2**20
START_S = 100.0  # each store's VM: asked for at 10:00:00, inputs staged at 10:01:40
VMS = {"vm-1": {"machine": "n2-highcpu-8", "requested_at": "2026-01-01T10:00:00+00:00",
                "inputs_staged_at": "2026-01-01T10:01:40+00:00"},
       "vm-2": {"machine": "n2-highcpu-2", "requested_at": "2026-01-01T10:00:00+00:00",
                "inputs_staged_at": "2026-01-01T10:01:40+00:00"}}


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    code = cli.main(list(args))
    out = capsys.readouterr()
    if "--json" in args and code == 0:
        return code, json.loads(out.out), out.err
    return code, out.out, out.err


def _billed(seconds: float, price: float, vms: int = 1) -> float:
    """``vms`` VMs at ``price`` each, each billed per second with a one-minute minimum."""
    return vms * math.ceil(max(seconds, 60.0)) * price / 3600.0


def _units_store(tmp_path: Path) -> Path:
    """n2-highcpu-8 × 8 at 1000 cubes/s on 1, 2 and 4 VMs (2000, 3600 cubes/s), $0.40/h each
    (a --nodes trial's price is that of all its VMs, as the store records it)."""
    trials = [{"machine": "n2-highcpu-8", "workers": 8, "nodes": nodes, "repeat": r,
               "units_per_s": rate, "price_per_hour": 0.40 * nodes, "unit": "cube",
               "job_kind": "throughput", "trial_id": f"t-{nodes}-{r}"}
              for nodes, rate in ((1, 1000.0), (2, 2000.0), (4, 3600.0)) for r in range(3)]
    return write_store(tmp_path / "units", trials, sweep={"sweep_id": "units", "vms": VMS},
                       timeseries=False)


def test_the_whole_job_is_the_measured_start_plus_the_work_billed_per_vm(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _units_store(tmp_path)
    code, doc, _ = _cli(capsys, "report", str(run), "--total", "1000000", "--json")
    assert code == 0
    by_nodes = {t["nodes"]: t for t in doc["total"]}
    assert sorted(by_nodes) == [1, 2, 4]
    for nodes, rate in ((1, 1000.0), (2, 2000.0), (4, 3600.0)):
        t = by_nodes[nodes]
        assert t["start_s"] == pytest.approx(START_S) and t["basis"] == "measured"
        assert t["seconds"] == pytest.approx(START_S + 1e6 / rate)
        assert t["seconds_low"] <= t["seconds"] <= t["seconds_high"]
        assert t["cost_usd"] == pytest.approx(_billed(START_S + 1e6 / rate, 0.40, nodes))
    # the card of the machine says it in one line, as the terminal does
    (card,) = doc["answer"]
    assert card["whole_job"].startswith("1,000,000 cubes: 18.3 min")
    assert "$0.122" in card["whole_job"] and "× 4 VMs" in card["whole_job"]
    code, out, _ = _cli(capsys, "report", str(run), "--total", "1000000")
    assert code == 0 and "Whole job" in out and "1,000,000 cubes: 18.3 min" in out


def test_a_short_job_pays_the_one_minute_minimum_on_every_vm(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _units_store(tmp_path)
    code, doc, _ = _cli(capsys, "report", str(run), "--total", "1000", "--json")
    assert code == 0
    by_nodes = {t["nodes"]: t for t in doc["total"]}
    assert by_nodes[1]["seconds"] == pytest.approx(START_S + 1.0)
    assert by_nodes[4]["cost_usd"] == pytest.approx(4 * math.ceil(START_S + 1000 / 3600)
                                                    * 0.40 / 3600)
    without_start = {**json.loads((run / "sweep.json").read_text()), "vms": {}}
    (run / "sweep.json").write_text(json.dumps(without_start))
    code, doc, _ = _cli(capsys, "report", str(run), "--total", "1000", "--json")
    by_nodes = {t["nodes"]: t for t in doc["total"]}
    assert by_nodes[4]["start_s"] is None
    assert by_nodes[4]["cost_usd"] == pytest.approx(_billed(1000 / 3600, 0.40, 4))  # 4 minutes


# a fixed-work job at rows=1000..8000: seconds = 2 + 1e-6 rows², peak = 50 MiB + 2 kB per row
def _seconds(rows: float) -> float:
    return 2.0 + 1e-6 * rows * rows


def _peak(rows: float) -> float:
    return 50 * MIB + 2000.0 * rows


def _sized_store(tmp_path: Path, machines: dict[str, tuple[float, float, float]]) -> Path:
    """machine: (price/h, memory GiB, speed factor: its time is _seconds × the factor)."""
    trials = [{"machine": m, "workers": 2, "repeat": r, "job_kind": "fixed_work",
               "units_per_s": 1.0 / (_seconds(rows) * factor), "seconds": _seconds(rows) * factor,
               "peak_rss_bytes": _peak(rows), "price_per_hour": price, "memory_gib": gib,
               "cpu_seconds": 1.0,
               "grid": json.dumps({"rows": str(rows), "mode": "fast"}),
               "trial_id": f"{m}-{rows}-{r}"}
              for m, (price, gib, factor) in machines.items()
              for rows in (1000, 2000, 4000, 8000) for r in range(2)]
    return write_store(tmp_path / "sized", trials, sweep={"sweep_id": "sized", "vms": VMS},
                       timeseries=False)


def test_a_known_growth_is_forecast_with_its_law_and_a_run_of_it_is_priced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _sized_store(tmp_path, {"n2-highcpu-8": (0.40, 8.0, 1.0)})
    code, doc, _ = _cli(capsys, "report", str(run), "--target", "rows=80000", "--json")
    assert code == 0
    (entry,) = doc["forecast"]
    assert entry["model"] == "n²" and entry["peak_model"] == "linear"
    assert entry["seconds"] == pytest.approx(_seconds(80000), rel=0.02)
    assert entry["peak_rss_bytes"] == pytest.approx(_peak(80000), rel=0.02)
    assert entry["extrapolation"] == pytest.approx(10.0) and not entry["beyond_10x"]
    assert entry["grid"] == "mode=fast" and entry["size_name"] == "rows"
    (total,) = doc["total"]  # one run at the target, the VM's start before it
    assert total["basis"] == "forecast" and total["amount"] == 1
    assert total["seconds"] == pytest.approx(START_S + entry["seconds"])
    assert total["cost_usd"] == pytest.approx(_billed(total["seconds"], 0.40))
    # the card of the largest measured size carries it
    (line,) = [c["whole_job"] for c in doc["answer"] if c["whole_job"]]
    assert line.startswith("1 run at rows=80,000:")


def test_beyond_ten_times_the_largest_size_is_said_loudly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _sized_store(tmp_path, {"n2-highcpu-8": (0.40, 8.0, 1.0)})
    code, doc, _ = _cli(capsys, "report", str(run), "--target", "800000", "--json")
    assert code == 0 and doc["forecast"][0]["beyond_10x"]
    assert doc["forecast_warnings"] and "100×" in doc["forecast_warnings"][0]
    code, out, _ = _cli(capsys, "report", str(run), "--target", "rows=800000")
    (warning,) = [line for line in out.splitlines() if line.startswith("WARNING")]
    assert "100× the largest measured size (8,000)" in warning


@pytest.mark.parametrize(("args", "said"), [
    (["--target", "rows=lots"], "expected NAME=SIZE"),
    (["--target", "rows=-5"], "more than 0"),
    (["--target", "cols=100"], "no --grid variable cols"),
    (["--target", "mode=100"], "not sizes"),
    (["--size", "rows"], "give --target SIZE too"),
    (["--target", "rows=100", "--size", "mode"], "give one"),
])
def test_a_bad_target_is_one_line_and_a_non_zero_exit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str) -> None:
    run = _sized_store(tmp_path, {"n2-highcpu-8": (0.40, 8.0, 1.0)})
    code, out, err = _cli(capsys, "report", str(run), *args)
    assert code != 0 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and said in err, err


def test_a_sweep_refuses_a_target_without_a_size_to_forecast_along_before_running(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "sweep", "--machine", "n2-highcpu-2", "--dry-run",
                        "--command", "echo {mode}", "--grid", "mode=a,b", "--target", "1000",
                        "--out", str(tmp_path / "runs"))
    assert code != 0 and "sweep a size to forecast along" in err
    assert not (tmp_path / "runs").exists()


def test_recommend_at_a_target_size_rejects_a_machine_its_forecast_peak_outgrows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # at rows=80000 the peak is 50 MiB + 160 MB ≈ 203 MiB: it fits 1 GiB, and with 20 % it
    # also fits; a 0.2 GiB machine (205 MiB) holds the measured peaks but not the forecast one
    run = _sized_store(tmp_path, {"n2-highcpu-8": (0.40, 8.0, 1.0),
                                  "n2-highcpu-2": (0.10, 0.2, 1.5)})
    code, doc, _ = _cli(capsys, "recommend", str(run), "--target", "rows=80000",
                        "--memory-margin", "20%", "--json")
    assert code == 0
    assert doc["choice"]["machine"] == "n2-highcpu-8 · mode=fast"
    assert doc["choice"]["basis"] == "forecast"
    assert doc["choice"]["peak_bytes"] == pytest.approx(_peak(80000), rel=0.02)
    (small,) = doc["rejected"]
    assert any("forecast peak" in r and "does not fit" in r for r in small["reasons"])
    # without the target the small machine is cheaper and fits what was measured
    code, doc, _ = _cli(capsys, "recommend", str(run), "--memory-margin", "20%", "--json")
    assert code == 0 and doc["choice"]["machine"].startswith("n2-highcpu-2")


def test_recommend_at_a_target_size_meets_a_deadline_with_the_faster_machine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the cheap machine takes 1.5 × as long: 100 s start + 1.5 × 6402 s = 2.7 h misses 2 h
    run = _sized_store(tmp_path, {"n2-highcpu-8": (0.40, 8.0, 1.0),
                                  "n2-highcpu-2": (0.10, 4.0, 1.5)})
    code, doc, _ = _cli(capsys, "recommend", str(run), "--target", "rows=80000",
                        "--deadline", "2h", "--json")
    assert code == 0 and doc["choice"]["machine"].startswith("n2-highcpu-8")
    assert doc["choice"]["seconds"] == pytest.approx(START_S + _seconds(80000), rel=0.02)
    (slow,) = doc["rejected"]
    assert any("misses the 2.0 h deadline" in r for r in slow["reasons"])
    code, doc, _ = _cli(capsys, "recommend", str(run), "--target", "rows=80000", "--json")
    assert code == 0 and doc["choice"]["machine"].startswith("n2-highcpu-2")
    assert doc["runner_up"]["machine"].startswith("n2-highcpu-8")


def test_the_interval_is_reproducible_and_brackets_the_forecast() -> None:
    sizes = [1000.0, 2000.0, 4000.0, 8000.0]
    noisy = [_seconds(n) * (1 + e) for n, e in zip(sizes, (0.03, -0.02, 0.02, -0.03),
                                                     strict=True)]
    first = forecast.forecast(sizes, noisy, 80000)
    again = forecast.forecast(sizes, noisy, 80000)
    assert (first.low, first.high) == (again.low, again.high)
    assert first.low < first.value < first.high
    assert first.low <= _seconds(80000) <= first.high


def test_a_job_that_reports_units_is_forecast_in_units_per_second_and_totalled(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # seconds per row grow with the table: 1e-4 + 1e-9 × rows; rows/s is its inverse
    def per_row(rows: float) -> float:
        return 1e-4 + 1e-9 * rows

    trials = [{"machine": "n2-highcpu-8", "workers": 4, "repeat": r, "unit": "row",
               "job_kind": "throughput", "units_per_s": 1.0 / per_row(rows),
               "price_per_hour": 0.40, "grid": json.dumps({"rows": str(rows)}),
               "trial_id": f"t-{rows}-{r}"}
              for rows in (10000, 20000, 40000, 80000) for r in range(2)]
    run = write_store(tmp_path / "rows", trials, sweep={"sweep_id": "rows", "vms": VMS},
                      timeseries=False)
    code, doc, _ = _cli(capsys, "report", str(run), "--target", "800000", "--json")
    assert code == 0 and doc["total"] == []  # no --total: a rate has no whole job
    (entry,) = doc["forecast"]
    assert entry["seconds"] is None and entry["model"] == "linear"
    assert entry["units_per_s"] == pytest.approx(1.0 / per_row(800000), rel=0.02)
    assert entry["units_per_s_low"] <= entry["units_per_s"] <= entry["units_per_s_high"]
    code, doc, _ = _cli(capsys, "report", str(run), "--target", "800000", "--total", "800000",
                        "--json")
    (total,) = doc["total"]
    assert total["amount_unit"] == "rows"
    assert total["seconds"] == pytest.approx(START_S + 800000 * per_row(800000), rel=0.02)
    assert total["cost_usd"] == pytest.approx(_billed(total["seconds"], 0.40), rel=0.02)


@pytest.mark.slow
def test_a_sweeps_card_carries_the_whole_job_where_the_report_puts_it(tmp_path: Path) -> None:
    """``sweep --total N`` prints the whole job on the answer card, as ``report RUN --total N``
    does, and every configuration's figures once, after the report's last line."""
    from tests.test_answer_card import _card_lines, _cloudprof, _sweep

    run, printed = _sweep(tmp_path, "--workers", "1,2", "--duration", "1", "--frames", "4",
                          "--rows", "100", "--cols", "100", "--dim", "20", "--total", "50000")
    title = "Answer for n2-highcpu-8"
    card = _card_lines(printed, title)
    whole = next(text for label, text in card.items() if label == "Whole")
    assert whole.startswith("job 50,000 cubes: ") and "$" in whole
    report = _cloudprof(tmp_path, "report", str(run), "--total", "50000").stdout
    assert _card_lines(report, title)["Whole"] == whole  # the same line in the same place
    # the card comes before the tables, the list of configurations after the report's line
    lines = printed.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Report: "))
    assert printed.index(title) < printed.index("Whole job") < printed.index(lines[at])
    assert printed.count("Whole job (VM start as measured") == 1
    assert any(line.startswith("Whole job (VM start") for line in lines[at + 1:])
