"""A report's files: the figures (plots/*.svg), report.md and report.html, in the store.

Here, outside ``orchestrator.results.report``, because the figures read the report's data
(``plots`` imports ``report``): the report builds tables and knows nothing of charts, the
HTML writer takes the charts' specs as input, and this module joins the two. Altair and
vl-convert are imported only when a report is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.results.fits import stored_fits
from orchestrator.results.report import (
    PLOTS_DIR,
    REPORT_HTML,
    REPORT_MD,
    Report,
    RunData,
    build_report,
    load_run,
    render_console,
    render_html,
    render_markdown,
    with_question,
)
from orchestrator.results.store import atomic_write_bytes

if TYPE_CHECKING:
    from rich.console import Console


def report_run(run_dir: str | Path, console: Console, question: Any = None, *,
               follow_up: bool = True, files: bool = True) -> Path | None:
    """Print the terminal summary, then write the report files; returns report.html's path.

    What ``cloudprof report`` and the end of a sweep do. The store is read and the report
    built once for both, and the summary is printed before the figures are drawn, so the
    user reads the results while they are drawn. ``question``: the user's --target/--total
    (``whole_job.Question``): its whole-job figure on each machine's card, and (unless
    ``follow_up`` is False: the sweep command prints them itself, after its last line) the
    forecast and every configuration's whole job after the summary. ``files`` False
    (``sweep --no-report``): the summary alone, no files, and None.
    """
    run = with_question(load_run(run_dir), question)
    with stored_fits(run_dir):  # each machine's USL fit, kept in the store (fits.json)
        report = build_report(run)
    render_console(report, console)
    if question is not None and follow_up:  # --target / --total: every configuration
        from orchestrator.results.whole_job import render_lines

        for line in render_lines(run, question):
            console.print(line, highlight=False, markup=False,
                          style="bold red" if line.startswith("WARNING") else None)
    return write_files(run, report) if files else None


def write_report(run_dir: str | Path) -> Path:
    """Write plots/*.svg, report.md and report.html into the store; returns report.html's path.

    Each file is written to a temporary name and renamed, so a reader never sees half a
    report.
    """
    run = load_run(run_dir)
    with stored_fits(run_dir):
        report = build_report(run)
    return write_files(run, report)


def write_files(run: RunData, report: Report) -> Path:
    """The figures (SVG files for report.md, specs for report.html), then both pages."""
    from orchestrator.results import plots, rendering

    page, per_machine = plots.report_figures(run, report.summary, usl_models=report.usl_models)
    with rendering.figures_written(page + per_machine, run.run_dir / PLOTS_DIR,
                                   run.run_dir) as report.plots:  # both pages render as they draw
        markdown = render_markdown(report)
        charts = [(drawn.caption, drawn.spec()) for drawn in page]
        html = render_html(report, charts=charts,
                           script=rendering.javascript() if charts else None)
    atomic_write_bytes(run.run_dir / REPORT_MD, markdown.encode())
    html_path = run.run_dir / REPORT_HTML
    atomic_write_bytes(html_path, html.encode())
    return html_path
