"""What a sweep found, as numbers a user can act on: tables in the terminal, report.md, report.html.

One model over the results store (``model``: medians, knees, Pareto front;
``tables``: the same as headlines and tables of strings) and one renderer per
format (``terminal``, ``markdown``, ``html``), like memray's reporters. This
module holds the entry points and re-exports the names callers use, so
``from orchestrator.results import report; report.summarise(...)`` keeps working.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from orchestrator.formatting import (
    DASH,
    EST,
    fmt_bytes,
    fmt_duration,
    fmt_pct,
    fmt_rate,
    fmt_usd,
    n_workers,
)
from orchestrator.plan.model import KNEE_GAIN
from orchestrator.results.fits import stored_fits
from orchestrator.results.report.html import render_html
from orchestrator.results.report.json_doc import SCHEMA as JSON_SCHEMA
from orchestrator.results.report.json_doc import render_json, report_document
from orchestrator.results.report.markdown import render_markdown
from orchestrator.results.report.model import (
    LOCAL,
    OK,
    SUMMARY_COLUMNS,
    Knee,
    RunData,
    best_rows,
    cost_per_million_units,
    find_knee,
    knees,
    load_run,
    machine_label,
    pareto_front,
    peak_memory,
    summarise,
)
from orchestrator.results.report.tables import (
    Report,
    Row,
    Table,
    build_report,
    describe_workload,
)
from orchestrator.results.report.terminal import render_console
from orchestrator.results.store import atomic_write_bytes

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "DASH",
    "EST",
    "JSON_SCHEMA",
    "KNEE_GAIN",
    "LOCAL",
    "OK",
    "PLOTS_DIR",
    "REPORT_HTML",
    "REPORT_MD",
    "SUMMARY_COLUMNS",
    "Knee",
    "Report",
    "Row",
    "RunData",
    "Table",
    "best_rows",
    "build_report",
    "cost_per_million_units",
    "describe_workload",
    "find_knee",
    "fmt_bytes",
    "fmt_duration",
    "fmt_pct",
    "fmt_rate",
    "fmt_usd",
    "knees",
    "load_run",
    "machine_label",
    "n_workers",
    "pareto_front",
    "peak_memory",
    "print_json",
    "print_summary",
    "render_console",
    "render_html",
    "render_json",
    "render_markdown",
    "report_document",
    "report_run",
    "summarise",
    "write_report",
]

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
PLOTS_DIR = "plots"


def print_summary(run_dir: str | Path, console: Console) -> Report:
    """The terminal report of one store (``cloudprof report`` and the end of a sweep)."""
    with stored_fits(run_dir):
        report = build_report(load_run(run_dir))
    render_console(report, console)
    return report


def report_run(run_dir: str | Path, console: Console) -> Path:
    """Print the terminal summary, then write the report files; returns report.html's path.

    What ``cloudprof report`` and the end of a sweep do. The store is read and the
    report built once for both (reading it twice cost ~0.7 s of every sweep), and
    the summary is printed before the plots are drawn, so the user reads the
    results while the figures are drawn.
    """
    run = load_run(run_dir)
    with stored_fits(run_dir):
        report = build_report(run)
    render_console(report, console)
    return _write_files(run, report)


def write_report(run_dir: str | Path) -> Path:
    """Write plots/*.svg, report.md and report.html into the store; returns report.html's path.

    Each file is written to a temporary name and renamed, so a reader never sees
    half a report.
    """
    run = load_run(run_dir)
    with stored_fits(run_dir):
        report = build_report(run)
    return _write_files(run, report)


def _write_files(run: RunData, report: Report) -> Path:
    """The plots, then report.md and report.html that reference them (see ``write_report``)."""
    from orchestrator.results import plots

    report.plots = plots.render_plots(
        run, report.summary, run.run_dir / PLOTS_DIR, usl_models=report.usl_models
    )
    from orchestrator.results.profiles import render_profile_plots  # profiled trials (issue 12)

    report.plots += render_profile_plots(run.run_dir, run.run_dir / PLOTS_DIR)
    atomic_write_bytes(run.run_dir / REPORT_MD, render_markdown(report).encode())
    html_path = run.run_dir / REPORT_HTML
    atomic_write_bytes(html_path, render_html(report, base_dir=run.run_dir).encode())
    return html_path


def print_json(run_dir: str | Path, out: TextIO) -> dict[str, Any]:
    """``cloudprof report --json``: the report document on ``out``; writes no file."""
    with stored_fits(run_dir, write=False):
        document = report_document(load_run(run_dir))
    out.write(render_json(document))
    return document
