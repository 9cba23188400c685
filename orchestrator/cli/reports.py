"""The commands that read finished runs: ``report``, ``compare``, ``export`` and
``recommend``; each imports its part of ``results/`` when it runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.conventions import _choices, _console, _lazy, _print_json, _question, _value
from orchestrator.errors import UsageError
from orchestrator.spec.options import SIZE_HELP, TARGET_HELP, TOTAL_HELP


def report(
    run: Annotated[
        Path, typer.Argument(help="A run directory, e.g. runs/<sweep-id>.", metavar="RUN")
    ],
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the report as JSON (stable keys, see docs) and write no file."
        ),
    ] = False,
    size: Annotated[str | None, typer.Option(help=SIZE_HELP, metavar="NAME")] = None,
    target: Annotated[str | None, typer.Option(help=TARGET_HELP, metavar="[NAME=]SIZE")] = None,
    total: Annotated[float | None, typer.Option(help=TOTAL_HELP, metavar="N")] = None,
) -> None:
    """Print a run's summary and write report.html, report.md and plots/ into it."""
    asked = _question(target, size, total)
    reports = _lazy("orchestrator.results.report", "reporting")
    if as_json:
        reports.print_json(run, sys.stdout, asked)
        return
    console = _console()
    publish = _lazy("orchestrator.results.publish", "reporting")
    written = publish.report_run(run, console, asked)
    for path in written if isinstance(written, list | tuple) else [written]:
        console.print(f"wrote {path}", soft_wrap=True)  # a path folded by rich cannot be pasted


def compare(
    runs: Annotated[
        list[Path], typer.Argument(help="Two or more run directories.", metavar="RUN...")
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the comparison as JSON (stable keys, see docs).")
    ] = False,
) -> None:
    """Compare two or more runs side by side, with ratios."""
    if len(runs) < 2:
        raise UsageError("compare needs at least two runs, e.g. cloudprof compare runs/a runs/b")
    comparing = _lazy("orchestrator.results.compare", "run comparison")
    if as_json:
        document = comparing.compare_document(comparing.load_headlines(list(runs)), list(runs))
        sys.stdout.write(_lazy("orchestrator.results.report", "reporting").render_json(document))
        return
    comparing.compare_runs(list(runs), _console())


ExportFormat = _choices("ExportFormat", ("k8s", "ray", "dask"))


def export(
    run: Annotated[
        Path, typer.Argument(help="A run directory, e.g. runs/<sweep-id>.", metavar="RUN")
    ],
    fmt: Annotated[
        ExportFormat,  # type: ignore[valid-type]
        typer.Option("--format", help="k8s: a Job manifest (YAML); ray: task/actor options "
                     "(JSON); dask: a `dask worker` line."),
    ],
    machine: Annotated[
        str | None,
        typer.Option(help="The machine (as the report names it; default: the run's best by "
                     "throughput).", metavar="M"),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(help="The worker count (default: the one the machine's answer picked).",
                     metavar="N", min=1),
    ] = None,
) -> None:
    """Print a spec to deploy a measured configuration: CPUs from its workers, memory
    from its measured peak plus margin, naming the trials it came from."""
    exporting = _lazy("orchestrator.results.export", "export")
    reports = _lazy("orchestrator.results.report", "reporting")
    measured = exporting.measured(reports.load_run(run), machine, workers)
    sys.stdout.write(exporting.render(measured, _value(fmt)))


def recommend(
    runs: Annotated[
        list[Path], typer.Argument(help="One or more run directories (any clouds).",
                                   metavar="RUN...")
    ],
    deadline: Annotated[
        str | None,
        typer.Option(help="Finish within this, e.g. 10m, 2h.", metavar="DURATION"),
    ] = None,
    max_cost: Annotated[
        float | None,
        typer.Option(help="Spend at most this many USD.", metavar="USD", min=0.0),
    ] = None,
    memory_margin: Annotated[
        str, typer.Option(help="Headroom over the measured peak that must fit the machine's "
                          "memory, e.g. 20%.", metavar="SHARE")
    ] = "20%",
    total: Annotated[
        float | None,
        typer.Option(help="The job's size: units for a job that reports units, runs for a "
                     "fixed-work job (default 1 run).", metavar="N", min=0.0),
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(help="Judge every configuration at this data size, forecast from the "
                     "sizes swept (e.g. rows=4000000): time, cost and peak.",
                     metavar="[NAME=]SIZE"),
    ] = None,
    size: Annotated[str | None, typer.Option(help=SIZE_HELP, metavar="NAME")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the recommendation as JSON.")
    ] = False,
) -> None:
    """The cheapest measured machine and worker count that meets a deadline, a cost limit
    and memory with a margin; the runner-up, and why every other one lost."""
    from orchestrator.spec.values import parse_duration

    deciding = _lazy("orchestrator.results.recommend", "recommendation")
    deadline_s = parse_duration(deadline, "--deadline") if deadline is not None else None
    if total is not None and total <= 0:
        raise UsageError("--total must be more than 0")
    asked = _question(target, size, total) if target is not None or size is not None else None
    rec = deciding.recommend_runs(list(runs), deadline_s, max_cost,
                                  deciding.parse_margin(memory_margin), total, asked)
    if as_json:
        _print_json(rec.to_dict())
    else:
        sys.stdout.write(deciding.render(rec))
