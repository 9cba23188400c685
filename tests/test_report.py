"""The report's numbers against the stored trials, its files, and its behaviour on odd stores.

Stores are written here with pandas in the results-store layout
(``orchestrator.results.store``), the same files the sweep engine writes; one test at
the end runs a real tiny sweep through the engine and reports it.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from orchestrator.errors import CloudprofError, UsageError
from orchestrator.results import publish, rendering, report, series
from orchestrator.results.store import (
    SWEEP_FILE,
    TIMESERIES_DIR,
    TRIAL_COLUMNS,
    TRIALS_FILE,
    trial_row,
)
from workloads.protocol import TIMESERIES_COLUMNS

SVG = "{http://www.w3.org/2000/svg}"


def write_store(
    run_dir: Path,
    trials: list[dict[str, Any]],
    sweep: dict[str, Any] | None = None,
    timeseries: bool = True,
) -> Path:
    """A results store with one row per given trial; derived columns computed as documented.

    ``efficiency`` uses the median 1-worker throughput of the same machine (NaN
    without one), ``cost_per_million_units`` the store's formula.
    """
    rows = []
    for given in trials:
        row: dict[str, Any] = dict.fromkeys(TRIAL_COLUMNS)
        row.update(
            sweep_id=run_dir.name,
            provider="gcp",
            vcpus=4,
            memory_gib=16.0,
            repeat=0,
            status="ok",
            leak_verdict="ok",
            cpu_utilisation=0.5,
            price_per_hour=1.0,
            seconds=2.0,
            oversubscribed=False,
            peak_rss_bytes=100 * 2**20,
        )
        row.update(given)
        row["ran_on"] = row["ran_on"] or row["machine"]
        row["trial_id"] = row["trial_id"] or f"{row['machine']}-w{row['workers']}-r{row['repeat']}"
        ups = row["units_per_s"]
        ok = row["status"] == "ok" and ups is not None
        row["units"] = int(ups * row["seconds"]) if ok else 0
        row["units_per_s_per_vcpu"] = ups / row["vcpus"] if ok and row["vcpus"] else math.nan
        row["cost_per_million_units"] = (
            row["price_per_hour"] / (ups * 3600) * 1e6 if ok and row["price_per_hour"] else math.nan
        )
        rows.append(row)
    extra = sorted({k for row in rows for k in row} - set(TRIAL_COLUMNS))
    frame = pd.DataFrame(rows, columns=[*TRIAL_COLUMNS, *extra])
    for i, row in frame.iterrows():
        base = frame[
            (frame.machine == row.machine) & (frame.workers == 1) & (frame.status == "ok")
        ]["units_per_s"]
        ok = row.status == "ok" and not base.empty
        frame.loc[i, "efficiency"] = (
            row.units_per_s / (row.workers * base.median()) if ok else np.nan
        )
    frame["efficiency"] = frame["efficiency"].astype(float)
    run_dir.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(run_dir / TRIALS_FILE)
    if timeseries:
        (run_dir / TIMESERIES_DIR).mkdir(exist_ok=True)
        for row in rows:
            t = np.arange(0.0, 1.0, 0.1)
            series = {c: np.zeros(len(t)) for c in TIMESERIES_COLUMNS}
            series.update(t=t, rss_bytes=(50 + 20 * t) * 2**20, cpu_percent=90.0 * row["workers"])
            pd.DataFrame(series).to_parquet(run_dir / TIMESERIES_DIR / f"{row['trial_id']}.parquet")
    (run_dir / SWEEP_FILE).write_text(json.dumps(sweep or {"sweep_id": run_dir.name}))
    return run_dir


def scaling_trials(machine: str, price: float, rates: dict[int, list[float]], **extra: Any):
    """Trials of one machine: ``rates`` maps workers to the units/s of each repeat."""
    return [
        {
            "machine": machine,
            "workers": w,
            "repeat": r,
            "units_per_s": ups,
            "price_per_hour": price,
            "peak_rss_bytes": (100 + 10 * w + r) * 2**20,
            "cpu_utilisation": 0.1 * w + 0.01 * r,
            "leak_verdict": "ok",
            **extra,
        }
        for w, reps in rates.items()
        for r, ups in enumerate(reps)
    ]


# n2: fast but expensive, stops scaling at 4; e2: slower, cheaper per unit.
N2 = {1: [100, 110, 90], 2: [190, 200, 180], 4: [380, 360, 400], 8: [400, 390, 395]}
E2 = {1: [60, 61, 59], 2: [118, 120, 119], 4: [230, 240, 235]}


@pytest.fixture
def two_machines(tmp_path: Path) -> Path:
    trials = scaling_trials("n2-highcpu-8", 0.29, N2) + scaling_trials("e2-standard-4", 0.13, E2)
    return write_store(tmp_path / "sweep-a", trials)


def md_table(md: str, title: str) -> list[dict[str, str]]:
    """The rows of the table under the report.md heading starting with ``title``, by header."""
    section = md.split(f"\n## {title}")[1].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]

    def cells(line: str) -> list[str]:
        return [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]

    headers = cells(lines[0])
    rows = [dict(zip(headers, cells(line), strict=True)) for line in lines[2:]]
    return rows


def markdown_of(run_dir: Path) -> str:
    """report.md's text without drawing the plots (write_report's tests cover those)."""
    return report.render_markdown(report.build_report(report.load_run(run_dir)))


def html_of(run_dir: Path) -> str:
    return report.render_html(report.build_report(report.load_run(run_dir)))


def console_text(run_dir: Path) -> str:
    console = Console(record=True, width=250)
    report.print_summary(run_dir, console)
    return console.export_text()


# ------------------------------------------------------------------ numbers


def test_summary_medians_match_the_stored_trials(two_machines: Path) -> None:
    trials = pd.read_parquet(two_machines / TRIALS_FILE)
    summary = report.summarise(report.load_run(two_machines).trials)
    assert len(summary) == len(N2) + len(E2)
    for row in summary.to_dict("records"):
        mine = trials[(trials.machine == row["machine"]) & (trials.workers == row["workers"])]
        assert row["units_per_s"] == pytest.approx(mine.units_per_s.median())
        assert row["units_per_s_per_vcpu"] == pytest.approx(mine.units_per_s_per_vcpu.median())
        assert row["efficiency"] == pytest.approx(mine.efficiency.median())
        assert row["cpu_utilisation"] == pytest.approx(mine.cpu_utilisation.median())
        assert row["peak_rss_bytes"] == mine.peak_rss_bytes.max()
        assert row["repeats"] == 3
    n2_4 = summary[(summary.machine == "n2-highcpu-8") & (summary.workers == 4)].iloc[0]
    assert n2_4.units_per_s == 380
    assert n2_4.efficiency == pytest.approx(380 / (4 * 100))


def test_summary_spread_is_the_iqr_of_the_repeats_that_finished_ok(tmp_path: Path) -> None:
    trials = scaling_trials("n2-highcpu-8", 0.29, {2: [190, 200, 180, 500]})
    trials[-1]["status"] = "failed"  # its 500 units/s must not widen the spread
    run = report.load_run(write_store(tmp_path / "s", trials))
    summary = report.summarise(run.trials)
    (row,) = summary.to_dict("records")
    assert (row["units_per_s_min"], row["units_per_s"], row["units_per_s_max"]) == (180, 190, 200)
    # three repeats: the interquartile range, labelled as such
    assert (row["units_per_s_low"], row["units_per_s_high"]) == (185, 195)
    assert row["spread_method"] == "IQR"
    assert (row["repeats"], row["failed"]) == (3, 1)
    assert list(summary.columns) == report.SUMMARY_COLUMNS
    (shown,) = md_table(markdown_of(tmp_path / "s"), "Results per machine")
    assert (shown["units/s"], shown["spread"]) == ("190", "185–195 IQR")


def test_summary_spread_is_a_bootstrap_interval_once_repeats_allow(tmp_path: Path) -> None:
    from orchestrator.analysis.model import MIN_REPEATS_FOR_CI, bootstrap_ci

    rates = [9030.0, 11000.0, 12100.0, 13659.0, 10500.0][: max(MIN_REPEATS_FOR_CI, 5)]
    trials = scaling_trials("n2-highcpu-8", 0.29, {2: rates})
    run = report.load_run(write_store(tmp_path / "s", trials))
    summary = report.summarise(run.trials)
    (row,) = summary.to_dict("records")
    assert row["spread_method"] == "95% CI"
    assert (row["units_per_s_low"], row["units_per_s_high"]) == pytest.approx(bootstrap_ci(rates))
    assert row["units_per_s_low"] < row["units_per_s"] < row["units_per_s_high"]
    (shown,) = md_table(markdown_of(tmp_path / "s"), "Results per machine")
    assert shown["spread"].endswith(" CI")
    single = scaling_trials("n2-highcpu-8", 0.29, {2: [190]})
    (shown,) = md_table(markdown_of(write_store(tmp_path / "one", single)), "Results per machine")
    assert shown["spread"] == report.DASH  # one repeat: no spread measured, none invented


def test_the_knee_rule_has_one_definition() -> None:
    from orchestrator.analysis import model

    assert report.KNEE_GAIN is model.KNEE_GAIN
    for workers, rates in [([1, 2, 4, 8], [100, 190, 360, 370]), ([1, 2, 4], [1, 2, 4])]:
        assert report.find_knee(workers, rates).workers == model.knee_point(workers, rates)


def test_headline_says_when_the_runner_up_is_within_noise(tmp_path: Path) -> None:
    overlapping = {4: [380, 300, 460, 350, 420], 8: [390, 310, 470, 360, 400]}
    run = write_store(tmp_path / "noisy", scaling_trials("n2-highcpu-8", 0.29, overlapping))
    text = console_text(run)
    assert "Best by throughput: n2-highcpu-8 × 8 workers, 390 units/s; runner-up " in text
    assert "n2-highcpu-8 × 4 workers is within noise of it" in text
    apart = {4: [380, 381, 379, 380], 8: [760, 761, 759, 760]}
    run = write_store(tmp_path / "clear", scaling_trials("n2-highcpu-8", 0.29, apart))
    text = console_text(run)
    assert "clearly ahead of runner-up n2-highcpu-8 × 4 workers (0.50x" in text
    assert "within noise" not in text


def test_a_report_of_single_repeats_says_no_spread_was_measured(
    two_machines: Path, tmp_path: Path
) -> None:
    assert "One repeat per worker count" not in console_text(two_machines)
    single = scaling_trials("n2-highcpu-8", 0.29, {1: [100], 2: [190], 4: [380]})
    text = console_text(write_store(tmp_path / "one", single))
    assert "One repeat per worker count: no spread was measured" in text
    assert "--repeats 3" in text


def test_leak_column_shows_the_probability_and_marks_ramps(tmp_path: Path) -> None:
    trials = scaling_trials("n2-highcpu-8", 0.29, {1: [100, 101], 160: [900, 910]})
    for t in trials:
        ramp = t["workers"] == 160
        t.update(leak_probability=0.01 if ramp else 0.2 + 0.1 * t["repeat"], leak_ramp=ramp)
    rows = md_table(markdown_of(write_store(tmp_path / "s", trials)), "Results per machine")
    assert [r["leak"] for r in rows] == ["ok p=0.30", "ok p=0.01 ramp"]


def test_usl_fit_per_machine_with_intervals_and_a_poor_fit_said(tmp_path: Path) -> None:
    from orchestrator.analysis.model import usl

    rng = np.random.default_rng(3)
    smooth = {
        n: [float(usl(n, 100.0, 0.05, 0.002) * (1 + rng.normal(0, 0.02))) for _ in range(3)]
        for n in (1, 2, 4, 8, 16, 32, 48)
    }
    zigzag = {1: [100, 101, 99], 2: [20, 21, 19], 4: [400, 401, 399], 8: [30, 31, 29]}
    trials = scaling_trials("n2-highcpu-8", 0.29, smooth) + scaling_trials("e2", 0.1, zigzag)
    trials += scaling_trials("c2", 0.2, {1: [10], 2: [20]})
    rows = md_table(markdown_of(write_store(tmp_path / "s", trials)), "Scaling model per machine")
    by = {r["machine"]: {k: v.replace("\\", "") for k, v in r.items()} for r in rows}
    shown = by["n2-highcpu-8"][r"N\*"]  # Markdown escapes * and [ ]
    n_star = float(shown.split()[0])
    assert n_star == pytest.approx((0.95 / 0.002) ** 0.5, rel=0.15)  # ≈ 21.8 workers
    low, high = (float(v) for v in shown.split("[")[1].rstrip("]").split("–"))
    assert low < n_star < high
    assert by["n2-highcpu-8"]["fit"].startswith("good fit")
    assert by["e2"]["fit"].startswith("poor fit")
    assert by["c2"]["fit"].startswith("no fit: needs 3 worker counts")


def test_cost_per_million_units_is_price_over_hourly_output(two_machines: Path) -> None:
    summary = report.summarise(report.load_run(two_machines).trials)
    for row in summary.to_dict("records"):
        expected = row["price_per_hour"] / (row["units_per_s"] * 3600) * 1e6
        assert row["cost_per_million_units"] == pytest.approx(expected)
    assert report.cost_per_million_units(3.6, 1000.0) == pytest.approx(1.0)
    assert math.isnan(report.cost_per_million_units(None, 10.0))
    assert math.isnan(report.cost_per_million_units(1.0, 0.0))


def test_best_machine_by_cost_and_by_throughput(two_machines: Path) -> None:
    summary = report.summarise(report.load_run(two_machines).trials)
    cheapest, fastest = report.best_rows(summary)
    assert (cheapest["machine"], cheapest["workers"]) == ("e2-standard-4", 4)
    assert cheapest["cost_per_million_units"] == pytest.approx(0.13 / (235 * 3600) * 1e6)
    assert (fastest["machine"], fastest["workers"]) == ("n2-highcpu-8", 8)
    text = console_text(two_machines)
    assert "Best by cost: e2-standard-4 × 4 workers" in text
    assert "Best by throughput: n2-highcpu-8 × 8 workers, 395 units/s" in text


@pytest.mark.parametrize(
    ("workers", "rates", "knee", "reached"),
    [
        ([1, 2, 4, 8, 16], [100, 190, 360, 370, 375], 4, True),  # plateau from 4
        ([1, 2, 4, 8, 16], [100, 200, 400, 420, 300], 4, True),  # the article: peak, then a drop
        ([1, 2, 4, 8], [100, 200, 190, 400], None, False),  # a dip does not hide a later jump
        ([1, 2, 4], [100, 200, 400], None, False),  # still scaling at the largest count
        ([4], [400], None, False),  # one count: no knee
        ([8, 1, 4, 2], [395, 100, 380, 190], 4, True),  # order does not matter
    ],
)
def test_knee(workers: list[int], rates: list[float], knee: int | None, reached: bool) -> None:
    found = report.find_knee(workers, rates)
    assert (found.workers, found.reached) == (knee, reached)


def test_knee_is_shown_per_machine(two_machines: Path) -> None:
    text = console_text(two_machines)
    assert "Scaling stops for n2-highcpu-8: 4 workers" in text
    assert "Scaling stops for e2-standard-4: not reached (still scaling at 4 workers)" in text


def test_pareto_front_membership() -> None:
    summary = pd.DataFrame(
        {
            "units_per_s": [100.0, 200.0, 150.0, 300.0, 50.0, math.nan],
            "cost_per_million_units": [5.0, 4.0, 6.0, 8.0, 5.0, 1.0],
        }
    )
    # 150/$6 is beaten by 200/$4; 50/$5 by 100/$5 (same cost, faster); NaN never on it.
    assert report.pareto_front(summary) == [False, True, False, True, False, False]


def test_pareto_column_in_the_summary(two_machines: Path) -> None:
    summary = report.summarise(report.load_run(two_machines).trials)
    front = {(r.machine, r.workers) for r in summary.itertuples() if r.pareto}
    # e2×4 is the cheapest; n2×8 the fastest; n2×4 is faster than e2×4 but dearer -> on it too
    # unless n2×8 is both faster and cheaper than n2×4 (395 > 380 at the same price: yes).
    assert front == {("e2-standard-4", 4), ("n2-highcpu-8", 8)}


# ------------------------------------------------------------------ files


class _Checker(HTMLParser):
    VOID = frozenset({"meta", "img", "br", "hr", "link", "input"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.images: list[str] = []
        self.scripts: list[str] = []  # the src of each <script src=...>
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.images.append(dict(attrs)["src"] or "")
        if tag == "script" and dict(attrs).get("src") is not None:
            self.scripts.append(dict(attrs)["src"] or "")
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(f"unexpected </{tag}>")

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse_html(path: Path) -> _Checker:
    checker = _Checker()
    checker.feed(path.read_text(encoding="utf-8"))
    checker.close()
    assert not checker.errors, checker.errors
    assert checker.stack == [], f"unclosed tags {checker.stack}"
    return checker


def _specs(html_text: str) -> list[dict[str, Any]]:
    """The Vega-Lite specs a page embeds (``const specs=[...]``)."""
    import json

    (found,) = re.findall(r"const specs=(\[.*?\]);\n", html_text, flags=re.S)
    return json.loads(found.replace("<\\/", "</"))


def _values(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every data row a spec carries (its named datasets)."""
    return [row for rows in spec.get("datasets", {}).values() for row in rows]


def test_report_html_is_self_contained_and_shows_every_plot_alone(
    two_machines: Path, tmp_path: Path
) -> None:
    html_path = publish.write_report(two_machines)
    alone = tmp_path / "mailed" / "report.html"  # attached to a ticket, without plots/
    alone.parent.mkdir()
    alone.write_bytes(html_path.read_bytes())
    checker = parse_html(alone)
    text = alone.read_text()
    assert checker.scripts == [] and checker.images == []  # the script is inlined, not loaded
    assert not re.search(r"""(src|href)=["']?https?:""", text)  # nothing fetched from elsewhere
    outside = re.sub(r"<script>.*?</script>", "", text, flags=re.S)  # the page's own markup
    assert not re.search(r"""(src|href)=""", outside)  # loads nothing, links nothing
    assert "vegaEmbed" in text and "function" in text  # Vega, inlined
    specs = _specs(text)
    assert len(specs) >= 5  # throughput, efficiency, cost, peak memory, memory over time
    summary = report.summarise(report.load_run(two_machines).trials)
    throughput = {(r["label"], r["workers"], r["value"]) for r in _values(specs[0])
                  if "low" in r and "value" in r}
    want = {(report.machine_label(r.machine, r.ran_on), r.workers, r.units_per_s)
            for r in summary.itertuples()}
    assert want <= throughput  # the chart carries the table's numbers
    assert all(spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/")
               for spec in specs)  # a schema's name, not a load
    # the answer first, then the plots, then the tables
    assert text.index('class="answers"') < text.index("<h2>Plots</h2>") < text.index(
        "<h2>Results per machine")


def test_write_report_files_and_plots(two_machines: Path) -> None:
    html_path = publish.write_report(two_machines)
    assert html_path == two_machines / "report.html"
    md = (two_machines / "report.md").read_text()
    plots = {p.name for p in (two_machines / "plots").glob("*.svg")}
    assert {
        "throughput.svg",
        "efficiency.svg",
        "cost_vs_throughput.svg",
        "peak_memory.svg",
        "timeseries_n2-highcpu-8.svg",
        "timeseries_e2-standard-4.svg",
    } <= plots
    for svg in (two_machines / "plots").glob("*.svg"):
        root = ElementTree.fromstring(svg.read_bytes())  # well-formed, standalone SVG
        assert root.tag == SVG + "svg" and root.find(f".//{SVG}path") is not None
        assert f"(plots/{svg.name})" in md
    checker = parse_html(html_path)
    text = " ".join(checker.text)
    assert "Results per machine and worker count" in text and "where scaling stops" in text
    rows = md_table(md, "Results per machine and worker count")
    e2_4 = next(r for r in rows if r["machine"] == "e2-standard-4" and r["workers"] == "4")
    assert (e2_4["n"], e2_4["units/s"], e2_4["$/M units"]) == ("3", "235", "$0.154")
    assert "ran on" not in e2_4  # every trial ran where it was planned
    (n2,) = [r for r in md_table(md, "Per machine") if r["machine"] == "n2-highcpu-8"]
    # 400 at 8 workers is within 10 % of 380 at 4 but not of 360: resampling moves the knee.
    assert n2["scaling stops at"] == "4 workers (4 to not reached in 95% of resamples)"
    assert n2["peak RSS"] == "182 MiB at 8"
    assert n2["$/hour"] == "$0.29" and n2["workers tested"] == "1, 2, 4, 8"
    # the discounts a user may have are named, not silently ignored
    assert "discounts not applied (GCP sustained/committed use, AWS savings plans" in md


def test_a_report_prints_the_summary_and_writes_its_files_from_one_reading_of_the_store(
    two_machines: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[Path] = []
    real_load_run = report.load_run

    def counting_load_run(run_dir: Any) -> Any:
        reads.append(Path(run_dir))
        return real_load_run(run_dir)

    monkeypatch.setattr(publish, "load_run", counting_load_run)
    console = Console(record=True, width=250)
    html_path = publish.report_run(two_machines, console)
    assert reads == [two_machines]  # the sweep's end and `cloudprof report` read it once
    printed = console.export_text()
    assert "Results per machine and worker count" in printed
    md = (two_machines / "report.md").read_text()
    first = report.build_report(real_load_run(two_machines)).headlines[0]
    assert first.startswith("21 trials") and first in printed and first in md
    svgs = sorted((two_machines / "plots").glob("*.svg"))
    assert svgs and html_path == two_machines / "report.html"
    for svg in svgs:
        assert f"(plots/{svg.name})" in md


def test_a_run_is_read_with_the_values_pandas_read_parquet_gives(
    two_machines: Path, tmp_path: Path
) -> None:
    """load_run's single-file read (no dataset layer) against pandas' own reader, for a table
    pandas wrote (with its index metadata) and one written as the store writes it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.results.report.model import read_table

    pandas_written = two_machines / TRIALS_FILE
    frame = pd.read_parquet(pandas_written)
    frame.loc[0, "error"] = "boom"  # a string among nulls
    store_written = tmp_path / "store.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), store_written)

    for path in (pandas_written, store_written):
        pd.testing.assert_frame_equal(read_table(path), pd.read_parquet(path))
    assert read_table(store_written)["error"].iloc[0] == "boom"


def test_text_is_escaped_in_html_and_markdown(tmp_path: Path) -> None:
    evil = "<script>alert(1)</script> | *x*"
    trials = scaling_trials("n2-highcpu-8", 0.29, {1: [100], 2: [150]})
    trials.append(
        {
            "machine": "n2-highcpu-8",
            "workers": 2,
            "repeat": 1,
            "units_per_s": None,
            "status": "failed",
            "error": evil,
        }
    )
    run = write_store(tmp_path / "evil", trials)
    html_text = publish.write_report(run).read_text()
    assert "<script>alert(1)" not in html_text and "alert(1)</script>" not in html_text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html_text
    parse_html(run / "report.html")
    md = (run / "report.md").read_text()
    failed_row = next(line for line in md.splitlines() if "alert(1)" in line)
    assert "\\<script\\>" in failed_row and "\\|" in failed_row
    # the escaped pipe keeps the row at the table's 6 columns
    assert failed_row.replace("\\|", "").count("|") == 7


# ------------------------------------------------------------------ estimates


def test_local_runs_label_every_cost_as_an_estimate(tmp_path: Path) -> None:
    trials = scaling_trials("n2-highcpu-80", 2.87, {1: [100], 2: [190], 4: [200]}, ran_on="local")
    run = write_store(tmp_path / "dry", trials)
    summary = report.summarise(report.load_run(run).trials)
    assert summary["estimate"].all()
    text = console_text(run)
    assert "an estimate" in text and "ran on local" in text
    md = markdown_of(run)
    assert "## Results per machine and worker count (all trials ran on local)" in md
    rows = md_table(md, "Results per machine and worker count")
    assert len(rows) == 3
    for row in rows:  # the whole column is labelled
        assert row["$/M units (est.)"].startswith("$")
    assert "Estimates: trials ran on local" in md
    assert "(est.)" in html_of(run)


def test_dry_run_of_several_machines_warns_that_only_prices_differ(tmp_path: Path) -> None:
    trials = scaling_trials("n2-highcpu-80", 2.87, {1: [100]}, ran_on="local", cpu_model="EPYC")
    trials += scaling_trials("c2-standard-60", 3.1, {1: [101]}, ran_on="local", cpu_model="EPYC")
    spec = {"workload": "cube", "workload_params": {"dim": 10}, "duration_s": 1.0}
    run = write_store(tmp_path / "dry2", trials, {"sweep_id": "dry2", "spec": spec})
    text = console_text(run)
    assert "Workload: cube (dim=10), 1 s per trial" in text
    assert "Estimates: trials ran on local (4 vCPUs, EPYC) instead of the planned" in text
    assert "Every machine ran on the same host (local)" in text


def test_mixed_hosts_label_each_estimated_cost(tmp_path: Path) -> None:
    trials = scaling_trials("n2-highcpu-8", 0.29, {1: [100], 2: [190]})
    trials += scaling_trials("c2-standard-60", 3.0, {1: [120], 2: [230]}, ran_on="local")
    run = write_store(tmp_path / "mixed", trials)
    rows = md_table(markdown_of(run), "Results per machine and worker count")
    for row in rows:
        estimated = row["machine"] == "c2-standard-60"
        assert row["ran on"] == ("local" if estimated else "n2-highcpu-8")
        assert row["$/M units"].endswith("(est.)") == estimated


def test_measured_costs_are_not_labelled_estimates(two_machines: Path) -> None:
    md = markdown_of(two_machines)
    rows = md_table(md, "Results per machine and worker count")
    assert len(rows) == len(N2) + len(E2)
    assert not any("(est.)" in cell for row in rows for cell in [*row, *row.values()])
    assert "Estimates:" not in md


def test_plan_figures_are_labelled_estimates_next_to_the_vm_time(tmp_path: Path) -> None:
    from orchestrator.engine.sweep import lookup_machines
    from orchestrator.plan.planner import make_plan
    from orchestrator.spec.spec import SweepSpec

    spec = SweepSpec(repeats=1, machines=["n2-highcpu-80", "c2-standard-60"], workers=[1, 2])
    plan = make_plan(spec, "p", lookup_machines(spec))
    done, stuck = plan.vms
    sweep = {
        "sweep_id": "p",
        "plan": plan.to_dict(),
        "vms": {
            done.name: {
                "provider": "gcp",
                "requested_at": "2026-01-01T10:00:00Z",
                "deleted_at": "2026-01-01T10:01:40Z",
                "state": "deleted",
            },
            stuck.name: {
                "provider": "gcp",
                "requested_at": "2026-01-01T10:00:00Z",
                "state": "delete_failed",
            },
        },
    }
    run = write_store(tmp_path / "p", scaling_trials("n2-highcpu-80", 2.87, {1: [10]}), sweep)
    md = markdown_of(run)
    assert "## Plan (estimates) and VM time" in md
    rows = {r["machine"]: r for r in md_table(md, "Plan (estimates)")}
    first = rows[done.machine.name]
    assert first["est. time"] == report.fmt_duration(done.estimate.total_s)
    assert first["est. cost"] == report.fmt_usd(done.estimate.cost_usd)
    assert first["VM time"] == "100 s"
    assert first["VM cost (est.)"] == report.fmt_usd(done.estimate.price_per_hour * 100 / 3600)
    assert rows[stuck.machine.name]["VM time"] == "not deleted (delete\\_failed)"
    assert (
        f"Estimated total cost of the planned VMs: {report.fmt_usd(plan.total_cost_usd)} (est.)"
        in md
    )


def test_spot_prices_are_marked(tmp_path: Path) -> None:
    run = write_store(tmp_path / "spot", scaling_trials("n2-highcpu-8", 0.07, {1: [10]}, spot=True))
    (machine,) = md_table(markdown_of(run), "Per machine")
    assert machine["$/hour"] == "$0.07 spot"


def test_oversubscribed_rows_are_marked(tmp_path: Path) -> None:
    trials = scaling_trials("n2-highcpu-8", 0.29, {1: [100], 2: [150]})
    trials += scaling_trials("n2-highcpu-8", 0.29, {4: [160]}, oversubscribed=True)
    run = write_store(tmp_path / "over", trials)
    rows = md_table(markdown_of(run), "Results per machine and worker count")
    assert [r["workers"] for r in rows if "oversubscribed" in r["notes"]] == ["4"]
    assert 'class="oversubscribed' in html_of(run)


# ------------------------------------------------------------------ odd stores


def test_failed_trials_are_left_out_of_the_medians(tmp_path: Path) -> None:
    trials = scaling_trials("n2-highcpu-8", 0.29, {1: [100, 120], 2: [190]})
    trials.append(
        {
            "machine": "n2-highcpu-8",
            "workers": 1,
            "repeat": 2,
            "units_per_s": 5.0,
            "status": "memory_budget_exceeded",
            "error": "peak 9 GiB > 8 GiB",
        }
    )
    run = write_store(tmp_path / "f", trials)
    summary = report.summarise(report.load_run(run).trials)
    one = summary[summary.workers == 1].iloc[0]
    assert one.units_per_s == 110 and one.repeats == 2 and one.failed == 1
    text = console_text(run)
    assert "Trials that did not finish ok" in text and "peak 9 GiB > 8 GiB" in text


def test_all_trials_failed_still_reports(tmp_path: Path) -> None:
    trials = [
        {
            "machine": "n2-highcpu-8",
            "workers": 1,
            "units_per_s": None,
            "status": "failed",
            "error": "boom",
        }
    ]
    run = write_store(tmp_path / "allfail", trials)
    text = console_text(run)
    assert "No trial finished ok" in text and "boom" in text
    publish.write_report(run)
    assert (run / "report.html").is_file()


def test_single_worker_count_and_missing_baseline(tmp_path: Path) -> None:
    trials = scaling_trials("n2-highcpu-8", 0.29, {4: [400, 410]})
    run = write_store(tmp_path / "one", trials)
    summary = report.summarise(report.load_run(run).trials)
    assert math.isnan(summary.iloc[0].efficiency)
    text = console_text(run)
    assert "one worker count tested" in text
    publish.write_report(run)
    (row,) = md_table((run / "report.md").read_text(), "Results per machine and worker count")
    assert row["eff."] == report.DASH


def test_empty_store_is_a_one_line_error(tmp_path: Path) -> None:
    run = tmp_path / "empty"
    run.mkdir()
    pd.DataFrame(columns=list(TRIAL_COLUMNS)).to_parquet(run / TRIALS_FILE)
    with pytest.raises(CloudprofError, match=r"^no trials in .*empty$"):
        report.print_summary(run, Console())
    (run / TRIALS_FILE).unlink()
    (run / SWEEP_FILE).write_text("{}")
    with pytest.raises(CloudprofError, match="no trials in"):
        publish.write_report(run)


@pytest.mark.parametrize(
    "kind", ["missing", "file", "not-a-store", "runs-dir", "corrupt", "bad-json"]
)
def test_bad_run_paths_are_usage_errors(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "run"
    if kind == "file":
        path.write_text("x")
    elif kind == "not-a-store":
        path.mkdir()
    elif kind == "runs-dir":
        write_store(path / "20260101-000000-abcd", scaling_trials("n2-highcpu-8", 0.29, {1: [1]}))
    elif kind == "corrupt":
        path.mkdir()
        (path / TRIALS_FILE).write_bytes(b"PAR1 not parquet\n" * 10)
    elif kind == "bad-json":
        path.mkdir()
        (path / SWEEP_FILE).write_text("{not json")
    with pytest.raises(UsageError) as info:
        publish.write_report(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    if kind == "runs-dir":
        assert str(info.value).endswith(f"e.g. {path / '20260101-000000-abcd'}")


def test_the_report_imports_its_plotting_library_only_to_draw() -> None:
    """Tables, ``--json`` and ``compare`` never import Altair or vl-convert (1.5 s and a
    JavaScript runtime); ``plots`` does, and only drawing the report files imports it."""
    code = (
        "import sys, orchestrator.results.report, orchestrator.results.publish\n"
        "import orchestrator.results.compare\n"
        "heavy = [m for m in ('altair', 'vl_convert', 'matplotlib') if m in sys.modules]\n"
        "import orchestrator.results.plots\n"
        "print(','.join(heavy), 'altair' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True"]


# ------------------------------------------------------------------ a real sweep


@pytest.mark.slow
def test_report_of_a_real_local_sweep(tmp_path: Path) -> None:
    """The engine's own store, from a tiny --dry-run sweep, reported end to end."""
    from orchestrator.engine.sweep import run_sweep
    from orchestrator.spec.spec import SweepSpec

    spec = SweepSpec(
        repeats=1, machines=["n2-highcpu-8"],
        workers=[1, 2],
        duration_s=1.0,
        workload_params={"frames": 4, "rows": 40, "cols": 50, "dim": 10},
        out=tmp_path / "runs",
        dry_run=True,
    )
    console = Console(record=True, width=200)
    run = run_sweep(spec, console=console)
    engine_output = console.export_text()
    assert "Best by throughput: n2-highcpu-8 × " in engine_output  # the engine printed the report

    trials = pd.read_parquet(run / TRIALS_FILE)
    sweep = json.loads((run / SWEEP_FILE).read_text())
    assert list(trials["status"]) == ["ok", "ok"]
    assert (trials["load_s"] > 0).all() and (trials["peak_rss_before_trial_bytes"] > 0).all()
    summary = report.summarise(report.load_run(run).trials)
    price = sweep["prices"]["n2-highcpu-8"]["price_per_hour"]
    for row in summary.to_dict("records"):
        (stored,) = trials[trials.workers == row["workers"]].to_dict("records")
        assert row["units_per_s"] == stored["units_per_s"] > 0
        assert row["peak_rss_bytes"] == stored["peak_rss_bytes"] > 0
        assert row["cost_per_million_units"] == pytest.approx(
            price / (stored["units_per_s"] * 3600) * 1e6
        )
        assert row["cost_per_million_units"] == pytest.approx(stored["cost_per_million_units"])
        assert row["estimate"] and row["ran_on"] == "local"
    fastest = summary.loc[summary["units_per_s"].idxmax()]
    knee = report.find_knee(list(summary["workers"]), list(summary["units_per_s"]))

    publish.write_report(run)
    md = (run / "report.md").read_text()
    rows = md_table(md, "Results per machine and worker count (all trials ran on local)")
    assert [r["workers"] for r in rows] == ["1", "2"]
    assert all(r["$/M units (est.)"].startswith("$") for r in rows)
    (plan,) = md_table(md, "Plan (estimates)")
    assert plan["machine"] == "n2-highcpu-8" and plan["trials"] == "2"
    assert plan["est. cost"].startswith("$") and plan["VM cost (est.)"] == "– (local)"
    (machine,) = md_table(md, "Per machine")
    assert machine["best units/s"].endswith(f"at {int(fastest['workers'])}")
    assert machine["scaling stops at"] == knee.describe()
    parse_html(run / "report.html")
    assert (run / "plots" / "timeseries_n2-highcpu-8_on_local.svg").is_file()


WIDE = [1, 2, 4, 8, 16, 32, 64, 80, 160]


@pytest.fixture
def wide_sweep(tmp_path: Path) -> Path:
    """Nine worker counts × two repeats on one machine, three counts on another; each series
    has a cumulative ``units`` column and a last CPU sample of 3 × what the host can do."""
    rates = {w: [10.0 * min(w, 60), 10.5 * min(w, 60)] for w in WIDE}
    trials = scaling_trials("n2-highcpu-80", 2.9, rates, vcpus=80)
    trials += scaling_trials("e2-standard-4", 0.13, {1: [9, 9], 2: [17, 18], 4: [30, 31]}, vcpus=4)
    run = write_store(tmp_path / "wide", trials)
    for t in trials:
        trial_id = f"{t['machine']}-w{t['workers']}-r{t['repeat']}"
        time = np.arange(0.0, 3.0, 0.1)
        series = {c: np.zeros(len(time)) for c in TIMESERIES_COLUMNS}
        cpu = np.full(len(time), 90.0 * t["workers"])
        cpu[-1] = 300.0 * t["vcpus"]  # a short last interval
        series.update(
            t=time,
            rss_bytes=(100 + t["workers"] * time + np.sin(time * 7)) * 2**20,
            cpu_percent=cpu,
            units=np.floor(t["units_per_s"] * time),
        )
        pd.DataFrame(series).to_parquet(run / TIMESERIES_DIR / f"{trial_id}.parquet")
    return run


def _figures(run_dir: Path) -> dict[str, Any]:
    from orchestrator.results import plots

    run = report.load_run(run_dir)
    summary = report.summarise(run.trials)
    colours = plots.machine_colours(zip(run.trials["machine"], run.trials["ran_on"], strict=True))
    figures = {
        "throughput": plots.throughput_figure(summary, run.trials, colours=colours),
        "efficiency": plots.efficiency_figure(summary, colours=colours),
        "cost": plots.cost_figure(summary, colours=colours),
        "memory": plots.memory_figure(summary, colours=colours),
    }
    for machine, group in run.trials.groupby("machine"):
        figures[f"timeseries {machine}"] = plots.timeseries_figure(
            run, group, colour=colours[machine]
        )
    return {"colours": colours, **figures}


def _layer(chart: Any, description: str) -> pd.DataFrame:
    """The data of a figure's layer, named by its description."""
    (layer,) = [c for c in chart.layer if c.description == description]
    return layer.data


def _encoding(chart: Any, description: str) -> dict[str, Any]:
    """The encoding of a figure's layer, named by its description, as the spec says it."""
    (layer,) = [c for c in chart.to_dict()["layer"] if c.get("description") == description]
    return layer["encoding"]


def _series(run_dir: Path, machine: str) -> pd.DataFrame:
    """The samples a machine's time-series figure draws (``series.timeline_data``)."""
    run = report.load_run(run_dir)
    return series.timeline_data(run, run.trials[run.trials["machine"] == machine])


def test_every_plot_gives_a_machine_the_same_colour(wide_sweep: Path) -> None:
    figures = _figures(wide_sweep)
    colours = figures.pop("colours")
    assert len(set(colours.values())) == len(colours) == 2
    for name in ("throughput", "efficiency", "memory", "cost"):
        spec = figures[name].to_dict()
        scales = [layer["encoding"]["color"]["scale"] for layer in spec["layer"]
                  if "scale" in layer.get("encoding", {}).get("color", {})]
        assert scales, name
        for scale in scales:
            assert dict(zip(scale["domain"], scale["range"], strict=True)) == colours, name
    for machine, colour in colours.items():
        fig = figures[f"timeseries {machine}"]
        marks = [layer["mark"] for panel in fig.to_dict()["hconcat"]
                 for layer in panel["spec"]["layer"]]
        assert marks and {m["color"] for m in marks} == {colour}
        assert f'stroke="{colour}"' in rendering.to_svg(fig)  # and that is the colour drawn


def test_time_series_shows_every_worker_count_and_repeat_and_marks_each_peak(
    wide_sweep: Path,
) -> None:
    data = _series(wide_sweep, "n2-highcpu-80")
    rss = data[data["panel"] == "RSS (MiB)"]
    assert sorted(set(rss["workers"])) == WIDE  # 16 and 160 included: no count is dropped
    for _, trial in rss.groupby("trial"):
        samples, peaks = trial[trial["kind"] == "sample"], trial[trial["kind"] == "peak"]
        assert len(peaks) == 1 and peaks["value"].iloc[0] == samples["value"].max()
    assert {w: len(set(g["repeat"])) for w, g in rss.groupby("workers")} == dict.fromkeys(
        WIDE, 2)  # both repeats of every count
    fig = _figures(wide_sweep)["timeseries n2-highcpu-80"].to_dict()
    assert all(panel["facet"]["row"]["sort"] == WIDE for panel in fig["hconcat"])
    assert any(layer["encoding"].get("strokeDash", {}).get("field") == "repeat"
               for panel in fig["hconcat"] for layer in panel["spec"]["layer"])


def test_time_series_draws_the_load_phase_before_the_trial(tmp_path: Path) -> None:
    trials = scaling_trials("n2-highcpu-8", 0.29, {1: [10], 2: [19]})
    for t in trials:
        t.update(load_s=1.5, peak_rss_before_trial_bytes=300 * 2**20)
    data = _series(write_store(tmp_path / "load", trials), "n2-highcpu-8")
    for _, trial in data.groupby("trial"):
        load = trial[trial["kind"] == "load"]  # the load phase, as long as it was, every panel
        assert sorted(load["panel"]) == ["CPU %", "RSS (MiB)", "units/s"]
        assert list(load["t"]) == [-1.5] * 3 and list(load["t_end"]) == [0.0] * 3
        (before,) = trial[trial["kind"] == "before"].itertuples()  # its peak, drawn over it
        assert (before.t, before.t_end, before.value, before.panel) == (
            -1.5, 0.0, 300.0, "RSS (MiB)")


def test_time_series_rates_come_from_the_samples_with_units_and_a_bad_series_is_skipped(
    tmp_path: Path,
) -> None:

    trials = scaling_trials("n2-highcpu-8", 0.29, {1: [10], 2: [19], 4: [30]})
    run = report.load_run(write_store(tmp_path / "gaps", trials))
    t = np.arange(0.0, 3.0, 0.1)
    units = pd.array([None] * 5 + list(range(10, 260, 10)), dtype="Int64")  # none before 0.5 s
    pd.DataFrame({"t": t, "rss_bytes": (100 + t) * 2**20, "cpu_percent": 50.0,
                  "units": units}).to_parquet(run.timeseries_path("n2-highcpu-8-w1-r0"))
    pd.DataFrame({"t": t, "rss_bytes": 2**27, "cpu_percent": 80.0}).to_parquet(
        run.timeseries_path("n2-highcpu-8-w2-r0"))  # a job without units
    run.timeseries_path("n2-highcpu-8-w4-r0").write_bytes(b"PAR1 not parquet")
    data = series.timeline_data(run, run.trials)
    assert sorted(set(data["workers"])) == [1, 2]  # the unreadable series is left out
    rate = data[(data["panel"] == "units/s") & (data["workers"] == 1)]
    want_t, want_rate = series.units_per_s_over_time(t[5:], np.arange(10, 260, 10))
    assert list(rate["t"]) == list(want_t) and list(rate["value"]) == list(want_rate)
    two = data[data["workers"] == 2]
    assert "units/s" not in set(two["panel"])  # no units, no rate line
    assert two[two["panel"] == "RSS (MiB)"]["value"].max() == 128.0  # but its RSS


def test_a_long_series_is_thinned_and_keeps_its_peak() -> None:
    keep = series.thinned(10_000, 4_321, 300)
    assert len(keep) <= 301 and 4_321 in keep and keep[0] == 0 and keep[-1] == 9_999
    assert list(series.thinned(50, 7, 300)) == list(range(50))


def test_cpu_percent_never_exceeds_100_times_the_cores(wide_sweep: Path) -> None:
    data = _series(wide_sweep, "n2-highcpu-80")
    assert data[data["panel"] == "CPU %"]["value"].max() == 100 * 80  # 300 × 80, clipped


def test_throughput_axes_start_at_zero_and_units_are_shown_over_time(wide_sweep: Path) -> None:
    figures = _figures(wide_sweep)
    median = _encoding(figures["throughput"], "median")
    assert median["y"]["scale"]["zero"] is True
    points = _encoding(figures["cost"], "points")
    assert points["x"]["scale"]["zero"] is True and points["y"]["scale"]["zero"] is True
    data = _series(wide_sweep, "n2-highcpu-80")
    last_row = data[(data["panel"] == "units/s") & (data["workers"] == 160)]
    peaks = sorted(g["value"].max() for _, g in last_row.groupby("trial"))
    assert peaks == pytest.approx([600, 630], rel=0.05)  # 160 workers: the stored rates
    t, rate = series.units_per_s_over_time([0, 1, 2, 3, 4], [0, 5, 10, 15, 20])
    assert list(t) == [1, 2, 3, 4] and list(rate) == pytest.approx([5, 5, 5, 5])


def test_throughput_plot_has_error_bars_and_the_fitted_usl_with_its_band(tmp_path: Path) -> None:
    from orchestrator.analysis.model import usl

    rng = np.random.default_rng(5)
    rates = {
        n: [float(usl(n, 100.0, 0.05, 0.002) * (1 + rng.normal(0, 0.03))) for _ in range(3)]
        for n in (1, 2, 4, 8, 16, 32)
    }
    run = write_store(tmp_path / "s", scaling_trials("n2-highcpu-8", 0.29, rates))
    fig = _figures(run)["throughput"]
    bars = _layer(fig, "interval")
    assert len(bars) == len(rates)  # one bar per worker count
    summary = report.summarise(report.load_run(run).trials)
    assert sorted(bars["high"]) == pytest.approx(sorted(summary["units_per_s_high"]))
    curve = _layer(fig, "usl")
    assert curve["workers"].max() > 32  # drawn a little past the largest tested count
    band = _layer(fig, "usl_band")  # the 95 % band
    assert (band["low"] <= band["fit"]).all() and (band["fit"] <= band["high"]).all()
    svg = ElementTree.fromstring(rendering.to_svg(fig))
    assert len(svg.findall(f".//{SVG}path")) >= 3  # drawn
    assert {c.description for c in fig.layer} >= {"median", "repeats", "interval", "usl"}


def test_a_report_fits_each_machines_usl_once_for_its_table_and_its_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.analysis import model
    from orchestrator.results import plots

    rates = {n: [model.usl(n, 100.0, 0.05, 0.002) * f for f in (0.98, 1.0, 1.02)]
             for n in (1, 2, 4, 8, 16)}  # fmt: skip
    run = write_store(tmp_path / "s", scaling_trials("n2-highcpu-8", 0.29, rates))
    fits: list[Any] = []
    real = model._with_intervals  # a bootstrap fit made, whichever call asked for it

    def counting(*args: Any, **kwargs: Any) -> Any:
        fits.append(real(*args, **kwargs))
        return fits[-1]

    monkeypatch.setattr(model, "_with_intervals", counting)
    drawn: list[pd.DataFrame] = []
    real_curves = plots.usl_curves

    def watching(*args: Any) -> pd.DataFrame:
        drawn.append(real_curves(*args))
        return drawn[-1]

    monkeypatch.setattr(plots, "usl_curves", watching)
    publish.write_report(run)
    assert len(fits) == 1 and fits[0] is not None and not fits[0].fit.poor  # one bootstrap fit
    (curve,) = drawn  # and the figure drew it: the table's fit, not a second one
    first = curve.iloc[0]
    assert first["fit"] == pytest.approx(fits[0].band([first["workers"]])[0][0])


def test_legends_sit_below_the_plot_and_every_figure_renders(wide_sweep: Path) -> None:
    figures = _figures(wide_sweep)
    del figures["colours"]
    for name, fig in figures.items():
        spec = fig.to_dict()
        legends = [enc["legend"] for layer in spec.get("layer", [])
                   for enc in layer.get("encoding", {}).values()
                   if isinstance(enc, dict) and enc.get("legend")]
        assert all(legend["orient"] == "bottom" for legend in legends), name  # never on data
        root = ElementTree.fromstring(rendering.to_svg(fig))
        assert root.tag == SVG + "svg" and float(root.get("width", 0)) > 0, name


def test_unknown_host_facts_show_dashes(tmp_path: Path) -> None:
    trials = scaling_trials("n2-highcpu-8", 0.29, {1: [10], 2: [18]}, vcpus=None)
    md = markdown_of(write_store(tmp_path / "nofacts", trials))
    (machine,) = md_table(md, "Per machine")
    assert machine["vCPUs"] == report.DASH
    assert {r["per vCPU"] for r in md_table(md, "Results per machine")} == {report.DASH}


# ------------------------------------------------------------------ --json


def test_report_json_holds_the_summarys_numbers_with_stable_keys(
    two_machines: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator import cli

    trials = scaling_trials("n2-highcpu-8", 0.29, N2)
    trials += scaling_trials("c2-standard-4", 0.2, {2: [50]})
    trials += scaling_trials("n2-highcpu-8", 0.29, {1: [10]}, status="failed", repeat=9)
    write_store(two_machines, trials, timeseries=False)
    assert cli.main(["report", str(two_machines), "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)  # stdout is the JSON document and nothing else
    assert "NaN" not in out
    assert list(doc) == [
        "schema", "run", "measure", "trials", "answer", "best", "machines", "results",
        "failed_trials", "plan", "memory",
    ]  # fmt: skip
    assert doc["measure"]["name"] == "units/s" and doc["measure"]["kind"] == "units"
    # the answer card per machine: the machines' best rows
    assert [(a["machine"], a["workers"], a["units_per_s"]) for a in doc["answer"]] == [
        (m["machine"], m["best_workers"], m["best_units_per_s"]) for m in doc["machines"]]
    assert {r["workers"] for r in doc["memory"]} == {1, 2, 4, 8}
    assert all(r["request_bytes"] >= r["peak_rss_bytes"] for r in doc["memory"])
    assert doc["schema"] == report.JSON_SCHEMA == "cloudprof.report/1"
    assert doc["trials"] == {"total": 14, "ok": 13, "not_ok": 1}
    assert doc["failed_trials"][0]["status"] == "failed"
    summary = report.summarise(report.load_run(two_machines).trials)
    assert [list(r) for r in doc["results"]] == [report.SUMMARY_COLUMNS] * len(summary)
    for row, expected in zip(doc["results"], summary.to_dict("records"), strict=True):
        assert row["units_per_s"] == expected["units_per_s"]
        assert row["peak_rss_bytes"] == expected["peak_rss_bytes"]
    assert doc["results"][0]["machine"] == "c2-standard-4"
    assert doc["results"][0]["efficiency"] is None  # no 1-worker baseline: null, not NaN
    _, machine = doc["machines"]
    assert machine["knee_workers"] == 4 and machine["best_units_per_s"] == 395
    from orchestrator.analysis.ranking import machine_confidence

    confidence = machine["confidence"]
    assert confidence == json.loads(json.dumps(machine_confidence(N2, predict_at=[1, 2, 4, 8, 16])))
    assert confidence["usl"]["verdict"] and confidence["knee"]["workers"] == 4
    assert confidence["spread"]["4"]["q1"] == 370  # IQR of 360, 380, 400
    assert [p["workers"] for p in confidence["usl"]["predictions"]] == [1, 2, 4, 8, 16]
    assert doc["machines"][0]["confidence"]["usl"] is None  # c2: one worker count, no fit
    assert "needs at least 3" in doc["machines"][0]["confidence"]["usl_reason"]
    assert doc["best"]["by_throughput"]["workers"] == 8
    assert not (two_machines / "report.html").exists()  # --json writes no file


# ------------------------------------------------------------------ terminal width


@pytest.fixture
def mixed_hosts(tmp_path: Path) -> Path:
    """Estimated and measured costs, a failed repeat, a long knee text: the widest tables."""
    trials = scaling_trials("n2-highcpu-8", 0.29, N2)
    trials += scaling_trials("e2-standard-4", 0.13, E2, ran_on="local")
    trials[0].update(status="failed", error="the trial ran out of memory at 2.1 GiB")
    return write_store(tmp_path / "mixed", trials, sweep={"sweep_id": "mixed"})


def _lines_at(run_dir: Path, width: int) -> list[str]:
    console = Console(record=True, width=width)
    report.print_summary(run_dir, console)
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 100, 60])
def test_terminal_tables_never_split_a_number_or_a_word(mixed_hosts: Path, width: int) -> None:
    lines = _lines_at(mixed_hosts, width)
    assert max(len(line.rstrip()) for line in lines) <= width
    tokens = {token for line in lines for token in line.split()}
    built = report.build_report(report.load_run(mixed_hosts))
    flowing = " ".join(" ".join(lines).split())  # the "Left out" note may wrap
    dropped = {
        header
        for names in re.findall(rf"Left out at {width} columns: (.*?) \(a wider", flowing)
        for header in names.split(", ")
    }
    for table in built.tables:
        for i, header in enumerate(table.headers):
            if header in dropped:
                continue
            for row in table.rows:
                cell = row.cells[i]
                if report.terminal.unbreakable(cell, header in report.terminal._NUMERIC):
                    assert any(cell in line for line in lines), (header, cell)
                else:
                    assert set(cell.split()) <= tokens, (header, cell)
    if width == 80:  # $/M units with "(est.)" and the notes column stay, "per vCPU" goes
        assert {"per vCPU", "leak"} <= dropped and "$0.602 (est.)" in "\n".join(lines)


def test_a_wide_terminal_shows_every_column(mixed_hosts: Path) -> None:
    lines = _lines_at(mixed_hosts, 200)
    assert not any(line.startswith("Left out") for line in lines)
    assert any("per vCPU" in line and "leak" in line for line in lines)


def test_a_narrow_terminal_stacks_each_row(mixed_hosts: Path) -> None:
    lines = _lines_at(mixed_hosts, 36)
    assert max(len(line.rstrip()) for line in lines) <= 36
    text = "\n".join(lines)
    assert re.search(r"^  \$/M units +\$0\.602 \(est\.\) *$", text, re.M)  # header, then its value
    assert re.search(r"^  per vCPU +29\.8 *$", text, re.M)  # nothing left out when stacked


def test_json_values_are_plain_and_unknown_numbers_are_null() -> None:
    from orchestrator.results.report.json_doc import plain

    given = {"na": pd.NA, "nat": pd.NaT, "nan": np.float64("nan"), "inf": [math.inf]}
    given |= {"int": np.int64(3), "bool": np.bool_(True)}
    assert plain(given) == {
        "na": None, "nat": None, "nan": None, "inf": [None], "int": 3, "bool": True
    }  # fmt: skip
    assert type(plain(np.int64(3))) is int


# ------------------------------------------------------------------ units


@pytest.mark.parametrize(
    ("consumer", "delivered"),
    [("contiguous", "delivered as a C-contiguous array"),
     ("keep", "delivered as an array kept (the last two per thread)")],
)
def test_the_report_says_what_one_unit_delivered(
    tmp_path: Path, consumer: str, delivered: str
) -> None:
    """The real runner records the cube's consumer; the store keeps it; the report says it."""
    import os

    from orchestrator.catalog.machines import MachineType
    from orchestrator.plan.planner import TrialPlan
    from orchestrator.results.store import RunStore

    params = {"frames": "4", "rows": "40", "cols": "50", "dim": "10", "consumer": consumer}
    out = tmp_path / "trial"
    proc = subprocess.run(
        [sys.executable, "-m", "workloads.run", "--out", str(out), "--duration", "0.3",
         "--quiet", *[a for k, v in params.items() for a in ("--param", f"{k}={v}")]],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "CLOUDPROF_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["params"]["workload_resolved"]["consumer"] == consumer
    spec = {"workload": "cube", "workload_params": params, "duration_s": 0.3}
    store = RunStore.create(tmp_path / "run", {"sweep_id": "u", "spec": spec, "plan": {}})
    machine = MachineType(provider="gcp", name="n2-highcpu-8", family="n2", vcpus=8,
                          memory_gib=8.0, region="us-central1", price_on_demand=0.36,
                          price_spot=0.09, price_source="test", price_date="2024-06-01")
    store.record_trial(trial_row(summary, machine, trial=TrialPlan("t1", machine.name, 1, 0, []),
                                 sweep_id="u", ran_on="local", provider="local"), None)
    store.compact()  # what the sweep's end does
    assert pd.read_parquet(store.trials_path)["unit_detail"].tolist() == [
        f"one cube of 4×10×10 float64 (0.0032 MB) {delivered}"
    ]
    text = console_text(store.run_dir)
    assert f"1 unit = one cube of 4×10×10 float64 (0.0032 MB) {delivered}" in text


def test_the_headlines_name_the_largest_gpu_memory_a_trial_used(tmp_path: Path) -> None:
    trials = scaling_trials("a2-highgpu-1g", 3.67, {1: [100], 2: [190]})
    for t in trials:
        t.update(peak_gpu_mem_bytes=float(t["workers"] * 3 * 2**30),
                 gpu_peak_source="NVML, the trial's processes")  # fmt: skip
    md = markdown_of(write_store(tmp_path / "s", trials))
    line = next(x for x in md.splitlines() if "Peak GPU memory" in x)
    assert "6 GiB" in line and "× 2 workers" in line and "NVML, the trial's processes" in line
    cpu_only = scaling_trials("n2-highcpu-8", 0.29, {1: [100], 2: [190]})
    assert "Peak GPU memory" not in markdown_of(write_store(tmp_path / "c", cpu_only))


def test_a_trial_row_keeps_the_summarys_gpu_peak() -> None:
    from orchestrator.results.store import trial_row
    from tests.test_planner import machine

    trial = type("T", (), {"trial_id": "m-w1-r0", "workers": 1, "repeat": 0})()
    gpu = {"peak_mem_bytes": 9 * 2**30, "peak_source": "PyTorch allocator (max_memory_allocated)"}
    row = trial_row({"gpu": gpu, "status": "ok"}, machine(), trial=trial, sweep_id="s",
                    ran_on="m", provider="gcp")  # fmt: skip
    assert row["peak_gpu_mem_bytes"] == 9 * 2**30
    assert row["gpu_peak_source"].startswith("PyTorch allocator")
    assert trial_row(None, machine(), trial=trial, sweep_id="s", ran_on="m",
                     provider="gcp")["peak_gpu_mem_bytes"] is None  # fmt: skip


def test_a_sweep_whose_ok_trials_all_ran_on_two_nodes_points_to_scale_out_not_to_failure(
    tmp_path: Path,
) -> None:
    trials = scaling_trials("n2-highcpu-8", 0.29, {1: [100, 104]}, nodes=2,
                            scaleout_efficiency=float("nan"))  # no 1-node trial to compare
    text = console_text(write_store(tmp_path / "s", trials))
    assert "2 trials: 2 ok, 0 not ok" in text
    assert "No trial finished ok" not in text
    assert "every ok trial is in \"Scale out\" below" in text
    assert "Scale out: throughput, cost and memory per node count" in text
