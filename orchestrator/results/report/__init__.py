"""What a sweep found, as numbers a user can act on: tables in the terminal, report.md, report.html.

One model over the results store (``model``: medians, knees, Pareto front;
``tables``: the same as headlines and tables of strings) and one renderer per
format (``terminal``, ``markdown``, ``html``), like memray's reporters; the figures and
the files are drawn and written by ``orchestrator.results.plots``, ``rendering`` and
``publish``, which import this package (never the reverse). This
module holds the entry points and re-exports the names callers use, so
``from orchestrator.results import report; report.summarise(...)`` keeps working.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from orchestrator.analysis.model import KNEE_GAIN
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
    "summarise",
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


def with_question(run: RunData, question: Any) -> RunData:
    """The run, with the user's --target/--total (``whole_job.Question``) when given."""
    run.question = question
    if question is not None and question.target is not None:
        from orchestrator.results.whole_job import size_name

        question.size = size_name(run, question.size)  # a bad --target: said before the report
    return run


def print_json(run_dir: str | Path, out: TextIO, question: Any = None) -> dict[str, Any]:
    """``cloudprof report --json``: the report document on ``out``; writes no file."""
    with stored_fits(run_dir, write=False):
        document = report_document(with_question(load_run(run_dir), question))
    out.write(render_json(document))
    return document
