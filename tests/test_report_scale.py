"""A report of many machines: what the terminal prints of it, what the files keep, and the
figures' data bounded (aggregated, not every trial) yet the same as the tables."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from rich.console import Console

from orchestrator.analysis import model
from orchestrator.results import publish, report
from orchestrator.results.report import view
from tests.test_report import md_table, scaling_trials, write_store

MACHINES = 14  # more than view.TERMINAL_MACHINES


def _machines() -> list[dict[str, Any]]:
    """``MACHINES`` machines: m00 is the cheapest per unit (cheap and fast enough), m13 the
    fastest (and dear); the others in between."""
    trials = []
    for i in range(MACHINES):
        speed = 100.0 + 10 * i + (400 if i == MACHINES - 1 else 0)
        price = 0.5 if i == 0 else 100.0 if i == MACHINES - 1 else 1.0 + i
        rates = {w: [speed * w * f for f in (0.98, 1.0, 1.02)] for w in (1, 2, 4)}
        trials += scaling_trials(f"m{i:02d}", price, rates)
    return trials


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_store(tmp_path_factory.mktemp("many") / "many", _machines(), timeseries=False)


def _terminal(run_dir: Path) -> str:
    console = Console(record=True, width=200)
    report.print_summary(run_dir, console)
    return console.export_text()


def test_the_terminal_prints_the_best_few_and_says_where_the_rest_are(many: Path) -> None:
    text = _terminal(many)
    cards = re.findall(r"Answer for (m\d\d)", text)
    assert cards == ["m00", "m01", "m02", "m13"]  # the cheapest three, then the fastest
    # the ten cheapest and the fastest
    assert f"{view.TERMINAL_MACHINES + 1} of {MACHINES} machines shown" in text
    assert f"the other {MACHINES - view.TERMINAL_MACHINES - 1} are in report.md" in text
    rows = re.findall(r"^ (m\d\d)\s+(\d+)\s", text, flags=re.MULTILINE)
    per_count = [m for m, w in rows if w == "1"]  # one row per machine and worker count
    assert per_count[:3] == ["m00", "m01", "m02"] and "m13" in per_count
    assert "m11" not in text and "m12" not in text  # neither cheap nor the fastest
    assert f"{(MACHINES - view.TERMINAL_MACHINES - 1) * 3} more rows, of the machines not " \
        "shown, in report.md and report.html." in text
    assert "Scaling stops for m00" in text and "Scaling stops for m12" not in text


def test_the_files_keep_every_machine(many: Path, tmp_path: Path) -> None:
    run = Path(shutil.copytree(many, tmp_path / "copy"))
    html_path = publish.report_run(run, Console(record=True, width=200))
    md = (run / report.REPORT_MD).read_text()
    assert len(re.findall(r"^## Answer for m\d\d", md, flags=re.MULTILINE)) == MACHINES
    assert len(md_table(md, "Results per machine")) == MACHINES * 3
    assert "Scaling stops for m12" in md
    page = html_path.read_text()
    assert page.count('<section class="card">') == MACHINES
    top, folded = page.split("<details>", 1)
    assert re.findall(r"<h2>Answer for (m\d\d)</h2>", top) == ["m00", "m01", "m02", "m13"]
    assert f"{MACHINES - 4} more answer cards" in folded
    shown, more = folded.split(f"{MACHINES - 4} more headlines, one machine each")
    assert "Scaling stops for m13" in shown and "Scaling stops for m12" not in shown
    assert "Scaling stops for m12" in more.split("</details>")[0]


def test_a_few_machines_print_in_full(tmp_path: Path) -> None:
    trials = [t for t in _machines() if t["machine"] in {"m03", "m00", "m07"}]
    text = _terminal(write_store(tmp_path / "few", trials, timeseries=False))
    assert re.findall(r"Answer for (m\d\d)", text) == ["m00", "m03", "m07"]  # their order
    assert "machines shown" not in text and "more rows" not in text


def test_curves_from_the_tables_ranges_are_the_curves_from_the_trials(many: Path) -> None:
    from orchestrator.results import plots
    from orchestrator.results.report.model import samples

    run = report.load_run(many)
    fits = {key: model.fit_usl_with_intervals(data) for key, data in samples(run.trials).items()}
    labels = {f"m{i:02d}" for i in range(MACHINES)}
    ranges = {label: (1.0, 4.0) for label in labels}
    from_ranges = plots.usl_curves(run.trials, labels, fits, 2.0, ranges)
    from_trials = plots.usl_curves(run.trials, labels, fits, 2.0)
    assert len(from_ranges) == plots.usl_points(MACHINES) * MACHINES
    pd.testing.assert_frame_equal(from_ranges, from_trials)


def test_many_trials_draw_medians_and_intervals_not_every_repeat(
    many: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.results import plots

    run = report.load_run(many)
    summary = report.summarise(run.trials)
    layers = {c.description for c in plots.throughput_figure(summary, run.trials).layer}
    assert {"repeats", "median", "interval"} <= layers
    monkeypatch.setattr(plots, "MAX_REPEAT_DOTS", len(run.trials) - 1)
    chart = plots.throughput_figure(summary, run.trials)
    layers = {c.description for c in chart.layer}
    assert "repeats" not in layers and {"median", "interval"} <= layers
    assert "repeats not drawn" in chart.to_dict()["title"]["subtitle"]


def test_the_page_of_many_machines_draws_every_chart_in_chromium(
    many: Path, tmp_path: Path
) -> None:
    """The page opened in headless Chromium, as a browser does: every figure drawn on its
    canvas by the inlined script (no network), none replaced by an error."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no Chromium on this machine")
    run = Path(shutil.copytree(many, tmp_path / "page"))
    page = publish.write_report(run)
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=390,900",
         "--virtual-time-budget=20000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=180, check=True).stdout
    charts = len(re.findall(r'<div class="chart" id="chart-\d+"', page.read_text()))
    assert charts >= 4
    assert len(re.findall(r'<canvas[^>]*class="marks"', dom)) == charts
    assert "figure not drawn:" not in dom.split("<script>const specs=")[0]
