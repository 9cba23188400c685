"""The answer card every report opens with, read back from real dry-run sweeps in each format.

Two small sweeps run through the CLI as a user runs them (its entry point, in the
test's process): the cube (a job that reports units) and a fixed-work ``--command`` job
(one complete run per trial).
Each format (the 80-column terminal, report.md, report.html, ``report --json``)
must show the card before its first table, with the figures of the tables' best
row, and say that a dry run measured this host's hardware.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from orchestrator.formatting import fmt_bytes, fmt_rate, fmt_usd
from orchestrator.results import report
from orchestrator.results.report.memory import memory_request
from tests.fixtures.in_process import Called, cloudprof
from tests.test_report import N2, md_table, scaling_trials, write_store

WIDTH = 80


def _cloudprof(tmp_path: Path, *args: str) -> Called:
    """The command as a user runs it, in this process (what it prints is what is read)."""
    env = {"CLOUDPROF_CACHE": str(tmp_path / "cache"), "NO_COLOR": "1", "TERM": "dumb"}
    proc = cloudprof(*args, cwd=tmp_path, env=env, columns=WIDTH)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-3000:]
    return proc


def _sweep(tmp_path: Path, *args: str) -> tuple[Path, str]:
    """A --dry-run sweep; (its results store, what it printed at 80 columns)."""
    out = tmp_path / "runs"
    proc = _cloudprof(tmp_path, "sweep", "--machine", "n2-highcpu-8", "--dry-run",
                      "--out", str(out), *args)
    (run,) = list(out.iterdir())
    return run, proc.stdout


def _card_lines(text: str, title: str) -> dict[str, str]:
    """The boxed card under ``title`` in terminal text: label → its (unwrapped) text."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line)
    out: dict[str, str] = {}
    label = ""
    for line in lines[start + 1:]:
        if line.startswith("╰"):
            break
        inner = line[1:].rstrip().removesuffix("│")
        if inner[1:2] != " ":  # a label starts the line; else the text goes on
            label, _, text = inner.strip().partition(" ")
            out[label] = text.strip()
        else:
            out[label] += " " + inner.strip()
    return out


class _Html(HTMLParser):
    """The cards' (label, text) pairs and the order of cards and tables in report.html."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[str] = []
        self.cards: list[dict[str, str]] = []
        self._tag = ""
        self._label = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("dt", "dd"):
            self._tag = tag
        if tag == "dd":
            self.cards[-1][self._label] = ""
        elif tag == "section" and ("class", "card") in attrs:
            self.order.append("card")
            self.cards.append({})
        elif tag == "table":
            self.order.append("table")

    def handle_data(self, data: str) -> None:
        if self._tag == "dt":
            self._label = data
        elif self._tag == "dd":  # the text goes on through its <span>s
            self.cards[-1][self._label] += data

    def handle_endtag(self, tag: str) -> None:
        if tag in ("dt", "dd"):
            self._tag = ""


def _read_formats(tmp_path: Path, run: Path) -> tuple[dict[str, Any], str, str, str]:
    """(report --json, report.md, report.html, ``cloudprof report`` at 80 columns)."""
    document = json.loads(_cloudprof(tmp_path, "report", "--json", str(run)).stdout)
    terminal = _cloudprof(tmp_path, "report", str(run)).stdout
    return (document, (run / "report.md").read_text(), (run / "report.html").read_text(),
            terminal)


def _check_order(md: str, html_text: str, terminal: str, title: str) -> _Html:
    """The card comes before the first table in every format; returns the parsed page."""
    assert md.index(f"## {title}") < md.index("\n|")
    page = _Html()
    page.feed(html_text)
    assert page.order[0] == "card" and "table" in page.order
    lines = terminal.splitlines()
    first_table = min(i for i, line in enumerate(lines) if line.startswith(" ───"))  # its rule
    card_at = next(i for i, line in enumerate(lines) if title in line)
    assert card_at < first_table
    assert lines[-1].startswith("wrote ")  # the one line a path may run past the width in
    assert max(len(line) for line in lines[:-1]) <= WIDTH
    return page


@pytest.mark.slow
def test_a_dry_run_sweep_opens_every_format_with_the_card_of_its_best_row(tmp_path: Path) -> None:
    run, printed = _sweep(tmp_path, "--workers", "1,2", "--repeats", "2", "--duration", "1",
                          "--frames", "8", "--rows", "200", "--cols", "200", "--dim", "50")
    title = "Answer for n2-highcpu-8"
    # the sweep prints the same card before its tables, and ends with one line: the report
    assert printed.index(title) < printed.index("Results per machine and worker count")
    last = printed.rstrip().splitlines()[-1]
    assert last == f"Report: {run / 'report.html'} (report.md beside it)"
    assert str(run) not in printed.rstrip().splitlines()[-2]

    document, md, html_text, terminal = _read_formats(tmp_path, run)
    page = _check_order(md, html_text, terminal, title)

    # the tables' best row: the highest median units/s
    best = max(document["results"], key=lambda r: r["units_per_s"])
    memory = next(m for m in document["memory"] if m["workers"] == best["workers"])
    (card,) = document["answer"]
    assert (card["machine"], card["ran_on"], card["workers"]) == ("n2-highcpu-8", "local",
                                                                 best["workers"])
    assert card["units_per_s"] == best["units_per_s"] > 0
    assert (card["low"], card["high"]) == (best["units_per_s_low"], best["units_per_s_high"])
    assert card["interval"] == best["spread_method"] and card["repeats"] == 2
    assert card["cost_per_million_units"] == best["cost_per_million_units"] > 0
    assert card["cost_is_estimate"] and card["measured_elsewhere"]
    assert card["peak_bytes"] == memory["peak_rss_bytes"] > 0
    assert card["request_bytes"] == memory["request_bytes"] >= card["peak_bytes"]
    assert card["workers_tested"] == [1, 2]

    # the same figures as text, equal to the cells of the tables' best row in report.md
    results = md_table(md, "Results per machine and worker count")
    row = next(r for r in results if r["workers"] == str(best["workers"]))
    mem_row = next(r for r in md_table(md, "Memory per machine")
                   if r["workers"] == str(best["workers"]))
    rate, usd = row["units/s"], fmt_usd(best["cost_per_million_units"])
    assert rate == fmt_rate(best["units_per_s"])
    request = mem_row["memory request"].split(" (")[0]
    terminal_card = _card_lines(terminal, title)
    md_card = dict(re.findall(r"^- \*\*(\w+):\*\* (.*)$", md.split("\n## The sweep")[0], re.M))
    (html_card,) = page.cards
    for shown in (terminal_card, md_card, html_card, card["lines"]):
        shown = {k.lower(): v.replace("\\", "") for k, v in shown.items()}
        assert shown["best"].startswith(f"{best['workers']} worker")
        assert f" {rate} cubes/s " in shown["best"]
        assert shown["cost"].startswith(f"{usd} per million cubes (est.)")
        assert f"peak {fmt_bytes(card['peak_bytes'])}" in shown["memory"]
        assert f"memory request {request}" in shown["memory"]
        assert "this host, local" in shown["hardware"]
        assert "n2-highcpu-8" in shown["hardware"] and "--dry-run" in shown["hardware"]


JOB = """\
import sys, threading, time
workers = int(sys.argv[1])
threads = [threading.Thread(target=time.sleep, args=(0.6 / workers,)) for _ in range(workers)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


@pytest.mark.slow
def test_a_fixed_work_job_gets_its_time_and_cost_per_run_on_the_card(tmp_path: Path) -> None:
    """One complete run per trial: the card gives the fastest time per run and its cost."""
    workdir = tmp_path / "job"
    workdir.mkdir()
    (workdir / "job.py").write_text(JOB)
    run, _ = _sweep(tmp_path, "--workers", "1,3", "--repeats", "2", "--workdir", str(workdir),
                    "--command", "python job.py {workers}")
    document, md, html_text, terminal = _read_formats(tmp_path, run)
    title = "Answer for n2-highcpu-8"
    _check_order(md, html_text, terminal, title)

    import pyarrow.parquet as pq

    trials = pq.read_table(run / "trials.parquet").to_pylist()
    assert {t["job_kind"] for t in trials} == {"fixed_work"}
    seconds: dict[int, list[float]] = {}
    for t in trials:
        seconds.setdefault(int(t["workers"]), []).append(float(t["seconds"]))
    median_s = {w: statistics.median(v) for w, v in seconds.items()}
    fastest = min(median_s, key=median_s.__getitem__)
    (card,) = document["answer"]
    assert card["fixed_work"] and card["workers"] == fastest
    assert card["seconds_per_run"] == pytest.approx(median_s[fastest])
    price = document["machines"][0]["price_per_hour"]
    assert card["cost_per_run"] == pytest.approx(price * median_s[fastest] / 3600)
    fixed_rows = md_table(md, "Fixed-work job")
    row = next(r for r in fixed_rows if r["workers"] == str(fastest))
    lines = card["lines"]
    assert lines["best"].startswith(f"{fastest} workers: {row['time to complete']} per run")
    assert lines["cost"].startswith(row["cost per run"].removesuffix(" (est.)") + " per run (est.)")
    assert "this host, local" in lines["hardware"]


@pytest.mark.slow
def test_a_profiled_sweep_says_where_thread_time_goes_on_the_card(tmp_path: Path) -> None:
    """--profile gil: the card's scaling line carries the profiled trial's own shares."""
    from orchestrator.formatting import fmt_pct

    run, printed = _sweep(tmp_path, "--workers", "1,2", "--repeats", "1", "--duration", "1",
                          "--frames", "8", "--rows", "200", "--cols", "200", "--dim", "50",
                          "--profile", "gil")
    (card,) = json.loads(_cloudprof(tmp_path, "report", "--json", str(run)).stdout)["answer"]
    top = json.loads((run / "profiles" / "n2-highcpu-8-w2-prof-gil" / "record.json").read_text())
    shares = top["profile"]["shares"]
    if card["knee_reached"] and card["knee_workers"] == 1:
        where = "above 1 worker"  # the profiled trials above the knee: here only 2 workers
    else:
        where = "at 2 workers"  # no knee: the largest profiled count
    assert card["shares"] == pytest.approx({k: shares[k] for k in card["shares"]})
    expected = (f"Profiled {where}: GIL wait {fmt_pct(shares['gil_wait'])}, idle "
                f"{fmt_pct(shares['idle'])}, native {fmt_pct(shares['native'])} of thread time")
    assert expected in card["lines"]["scaling"]
    assert expected.split(":")[0] in " ".join(printed.replace("│", " ").split())  # printed too


def _cards(run: Path) -> list[Any]:
    return report.build_report(report.load_run(run)).answers


def test_a_machine_measured_on_itself_gets_its_knee_and_no_hardware_line(tmp_path: Path) -> None:
    run = write_store(tmp_path / "sweep", scaling_trials("n2-highcpu-8", 0.29, N2))
    (card,) = _cards(run)
    document = report.report_document(report.load_run(run))
    (machine,) = document["machines"]
    assert (card.workers, card.units_per_s) == (machine["best_workers"],
                                                machine["best_units_per_s"]) == (8, 395)
    assert card.knee_reached and card.knee_workers == machine["knee_workers"] == 4
    lines = dict(card.lines())
    assert "Hardware" not in lines and not card.measured_elsewhere
    assert lines["Scaling"].startswith("stops at 4 workers: no larger count (8) gains more than "
                                       "10% in median units/s; the host has 4 vCPUs")
    assert lines["Scaling"].endswith(". --profile gil shows where the thread time goes")
    assert lines["Cost"].startswith(f"{fmt_usd(card.cost_per_million_units)} per million units "
                                    "at $0.29/hour")  # measured on the machine: no (est.)
    q1, q3 = statistics.quantiles(N2[8], n=4, method="inclusive")[::2]  # the repeats' IQR
    assert (card.low, card.high, card.interval) == (q1, q3, "IQR")
    assert lines["Best"].startswith(f"8 workers: 395 units/s ({fmt_rate(q1)}–{fmt_rate(q3)}, "
                                    "IQR of 3 repeats)")


def test_one_repeat_of_one_count_without_a_price_says_what_is_missing(tmp_path: Path) -> None:
    run = write_store(tmp_path / "sweep", scaling_trials("m", math.nan, {2: [50.0]}))
    (card,) = _cards(run)
    lines = dict(card.lines())
    assert lines["Best"] == ("2 workers: 50 units/s (one repeat: no interval measured; "
                             "--repeats 3 measures one)")
    assert lines["Cost"] == "– (no price known for m)"
    request = memory_request([120 * 2**20])
    assert request is not None and request.request_bytes > 120 * 2**20
    assert lines["Memory"] == (f"peak {fmt_bytes(120 * 2**20)} at 2 workers; memory request "
                               f"{fmt_bytes(request.request_bytes)} (default margin: one repeat)")
    assert lines["Scaling"].startswith("one worker count tested")
