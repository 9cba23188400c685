"""cloudprof compare: the headline numbers of each run and their ratios to the first."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.errors import CloudprofError, UsageError
from orchestrator.results import compare, report
from tests.test_report import E2, N2, scaling_trials, write_store


def doubled(rates: dict[int, list[float]]) -> dict[int, list[float]]:
    return {w: [2 * r for r in reps] for w, reps in rates.items()}


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    before = scaling_trials("n2-highcpu-8", 0.29, N2) + scaling_trials("e2-standard-4", 0.13, E2)
    after = scaling_trials("n2-highcpu-8", 0.29, doubled(N2)) + scaling_trials(
        "e2-standard-4", 0.13, doubled(E2)
    )
    return write_store(tmp_path / "before", before), write_store(tmp_path / "after", after)


def compared(run_dirs: list[Path]) -> tuple[list[compare.Headline], str]:
    console = Console(record=True, width=250)
    heads = compare.compare_runs(run_dirs, console)
    return heads, console.export_text()


def test_headlines_are_the_reports_numbers(runs: tuple[Path, Path]) -> None:
    before, _ = runs
    (head, _) = compared([before, before])[0]
    summary = report.summarise(report.load_run(before).trials)
    assert head.best_units_per_s.value == max(summary["units_per_s"]) == 395
    assert head.best_units_per_s.where == "n2-highcpu-8 × 8"
    assert head.best_units_per_s_per_vcpu.value == max(summary["units_per_s_per_vcpu"])
    assert head.best_cost_per_million_units.value == pytest.approx(0.13 / (235 * 3600) * 1e6)
    assert head.best_cost_per_million_units.where == "e2-standard-4 × 4"
    assert head.peak_rss_bytes.value == max(summary["peak_rss_bytes"])
    assert head.knee_workers.value == 4  # n2 (the fastest machine) stops scaling at 4


def test_ratios_against_the_first_run(runs: tuple[Path, Path]) -> None:
    before, after = runs
    heads, text = compared([before, after])
    assert [h.name for h in heads] == ["before", "after"]
    assert compare.ratio(heads[1].best_units_per_s.value, heads[0].best_units_per_s.value) == 2.0
    cost = compare.ratio(
        heads[1].best_cost_per_million_units.value, heads[0].best_cost_per_million_units.value
    )
    assert cost == pytest.approx(0.5)
    best_line = next(line for line in text.splitlines() if "best units/s " in line)
    assert "395" in best_line and "790" in best_line and "×2.00" in best_line
    cost_line = next(line for line in text.splitlines() if "best $ per million" in line)
    assert "×0.50" in cost_line
    assert "(est.)" not in text  # both runs ran on the machines they price


def test_three_runs_each_get_a_ratio(runs: tuple[Path, Path]) -> None:
    before, after = runs
    _, text = compared([before, after, after])
    best_line = next(line for line in text.splitlines() if "best units/s " in line)
    assert best_line.count("×2.00") == 2


def test_local_runs_label_their_costs_as_estimates(tmp_path: Path) -> None:
    local = write_store(
        tmp_path / "dry", scaling_trials("n2-highcpu-80", 2.87, {1: [10], 2: [19]}, ran_on="local")
    )
    heads, text = compared([local, local])
    assert heads[0].best_cost_per_million_units.estimate
    assert not heads[0].best_units_per_s.estimate  # a measured throughput is not an estimate
    cost_line = next(line for line in text.splitlines() if "best $ per million" in line)
    assert "(est.)" in cost_line
    assert "the cost is an estimate" in text


def test_a_run_without_successful_trials_shows_dashes(runs: tuple[Path, Path], tmp_path: Path):
    failed = write_store(
        tmp_path / "failed",
        [{"machine": "n2-highcpu-8", "workers": 1, "units_per_s": None, "status": "failed"}],
    )
    heads, text = compared([runs[0], failed])
    assert math.isnan(heads[1].best_units_per_s.value)
    best_line = next(line for line in text.splitlines() if "best units/s " in line)
    cells = [cell.strip() for cell in best_line.split("│")[1:-1]]
    assert cells[2:] == [report.DASH, report.DASH]


def test_needs_two_runs_and_valid_paths(runs: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="at least two runs"):
        compare.compare_runs([runs[0]], Console())
    with pytest.raises(UsageError, match="does not exist"):
        compare.compare_runs([runs[0], tmp_path / "nope"], Console())
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "sweep.json").write_text("{}")
    with pytest.raises(CloudprofError, match="no trials in"):
        compare.compare_runs([runs[0], empty], Console())


def test_the_workload_row_says_whether_runs_are_comparable(tmp_path: Path) -> None:
    def run(name: str, strategy: str) -> Path:
        spec = {
            "workload": "cube",
            "duration_s": 5.0,
            "workload_params": {"dim": 60, "strategy": strategy},
        }
        trials = scaling_trials("n2-highcpu-8", 0.29, {1: [100]})
        return write_store(tmp_path / name, trials, {"sweep_id": name, "spec": spec})

    def verdicts(text: str) -> list[str]:
        line = next(line for line in text.splitlines() if line.startswith("│ workload"))
        return [cell.strip() for cell in line.split("│")[1:-1]][3::2]

    numpy, fast, fast2 = run("numpy", "numpy"), run("fast", "fast"), run("fast2", "fast")
    heads, text = compared([numpy, fast, fast2])
    assert heads[0].workload == "cube (dim=60, strategy=numpy), 5 s per trial"
    assert verdicts(text) == ["differs", "differs"]  # each run against the first
    assert verdicts(compared([fast, fast2])[1]) == ["same"]
    assert "one worker count tested" in text  # the knee cell of a single-count run


def test_ratio_formatting() -> None:
    assert [compare.fmt_ratio(r) for r in (2.0, 0.5, 0.0123, math.nan)] == [
        "×2.00",
        "×0.50",
        "×0.012",
        report.DASH,
    ]


def test_compare_json_gives_values_and_ratios_to_the_first_run(
    runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator import cli

    before, after = runs
    assert cli.main(["compare", str(before), str(after), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "cloudprof.compare/1"
    assert [r["name"] for r in doc["runs"]] == ["before", "after"]
    first, second = (r["metrics"] for r in doc["runs"])
    assert first["best_units_per_s"] == {
        "value": 395.0, "where": "n2-highcpu-8 × 8", "estimate": False, "repeats": 3,
        "ratio_to_first": 1.0, "ratio_ci95": None, "clear_difference": None,
    }  # fmt: skip
    assert second["best_units_per_s"]["ratio_to_first"] == 2.0
    low, high = second["best_units_per_s"]["ratio_ci95"]
    assert low <= 2.0 <= high and low > 1  # doubled repeats: a clear difference
    assert second["best_units_per_s"]["clear_difference"] is True
    assert second["peak_rss_bytes"]["ratio_ci95"] is None  # a max has no interval
    assert second["best_cost_per_million_units"]["ratio_to_first"] == pytest.approx(0.5)
    assert second["knee_workers"]["value"] == 4
    assert doc["runs"][1]["same_workload_as_first"] is True


@pytest.mark.parametrize("width", [80, 50])
def test_compare_at_80_columns_never_splits_a_number_or_a_word(
    runs: tuple[Path, Path], width: int
) -> None:
    console = Console(record=True, width=width)
    heads = compare.compare_runs([*runs, runs[0]], console)
    lines = console.export_text().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= width
    tokens = {token for line in lines for token in line.replace("│", " ").split()}
    for head in heads:
        for label, attr, fmt in compare.METRICS:
            text = compare._cell(getattr(head, attr), fmt)
            assert set(text.split()) <= tokens, (label, text)  # every number and word whole
    assert "×2.00" in tokens and "×0.50" in tokens


def test_overlapping_runs_say_no_clear_difference_with_the_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator import cli
    from orchestrator.analysis.model import compare_groups

    noisy_a = {4: [9030, 11000, 13659, 10500, 12100]}
    noisy_b = {4: [9500, 11800, 13000, 10100, 12600]}
    a = write_store(tmp_path / "a", scaling_trials("n2-highcpu-8", 0.29, noisy_a))
    b = write_store(tmp_path / "b", scaling_trials("n2-highcpu-8", 0.29, noisy_b))
    _, text = compared([a, b])
    best_line = next(line for line in text.splitlines() if "best units/s " in line)
    expected = compare_groups(noisy_a[4], noisy_b[4])
    assert expected is not None and not expected.clear
    assert f"[{expected.low:.2f}–{expected.high:.2f}] no clear difference" in best_line
    capsys.readouterr()  # the table above went to stdout too
    assert cli.main(["compare", str(a), str(b), "--json"]) == 0
    metric = json.loads(capsys.readouterr().out)["runs"][1]["metrics"]["best_units_per_s"]
    assert metric["clear_difference"] is False
    assert metric["ratio_ci95"] == pytest.approx([expected.low, expected.high])


def test_one_repeat_each_gives_a_ratio_without_an_interval(tmp_path: Path) -> None:
    a = write_store(tmp_path / "a", scaling_trials("n2-highcpu-8", 0.29, {4: [100]}))
    b = write_store(tmp_path / "b", scaling_trials("n2-highcpu-8", 0.29, {4: [200]}))
    _, text = compared([a, b])
    best_line = next(line for line in text.splitlines() if "best units/s " in line)
    assert "×2.00" in best_line and "[" not in best_line  # no spread measured, none invented


def test_the_interval_footnote_keeps_its_brackets(runs: tuple[Path, Path]) -> None:
    _, text = compared(list(runs))
    assert "[low–high]: bootstrap 95% interval" in text, text
