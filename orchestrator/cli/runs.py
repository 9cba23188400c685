"""``cloudprof runs``: the runs under ``--out``, newest first, as a table or JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.cli.conventions import _DEFAULTS, _console, _print_json


def runs(
    out: Annotated[
        Path | None,
        typer.Option(help=f"Results directory (default: {_DEFAULTS.out}).", metavar="DIR"),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="A JSON array, one object per run, for scripts.")
    ] = False,
) -> None:
    """List the runs under --out, newest first: status, machines, trials, best result, cost."""
    from orchestrator.results.runs import list_runs

    found = list_runs(out or Path(_DEFAULTS.out))
    if as_json:
        _print_json([run.to_dict() for run in found])
    elif not found:
        typer.echo(f"no runs under {out or _DEFAULTS.out}", err=True)
    else:
        _print_runs_table(found)


def _print_runs_table(found: list[Any]) -> None:
    """A table; where it is wider than the terminal, one short block per run instead, so
    that no cell is wrapped mid-number or mid-word. Costs are the plan's, marked (est.)."""
    from rich.markup import escape
    from rich.measure import Measurement
    from rich.table import Table

    from orchestrator.results.report import fmt_rate, fmt_usd
    from orchestrator.results.runs import fmt_age

    rows, bests = [], []
    # a fixed-work job's best is in runs/h, said in its cell
    best_header = "best units/s" if all(
        r.best is None or r.best.measure == "units/s" for r in found) else "best"
    for run in found:
        rate = "" if run.best is None else fmt_rate(run.best.rate or run.best.units_per_s) + (
            "" if run.best.measure == "units/s" else f" {run.best.measure}")  # runs/h
        best = "-" if run.best is None else (
            f"{rate} ({run.best.machine} × {run.best.workers})")
        bests.append("-" if run.best is None else (
            f"{rate}{' units/s' if run.best.measure == 'units/s' else ''}, "
            f"{run.best.machine} × {run.best.workers} worker"
            f"{'' if run.best.workers == 1 else 's'}"))
        rows.append({
            "run": run.id, "status": run.status + (" (dry run)" if run.dry_run else ""),
            "machines": ", ".join(run.machines) or "-",
            "ok": f"{run.trials_ok}/{run.trials_planned}", "failed": str(run.trials_failed),
            best_header: best, "cost": fmt_usd(run.estimated_cost_usd, estimate=True),
            "age": fmt_age(run.age_s),
        })  # fmt: skip
    table = Table(box=None, pad_edge=False, title="Runs (newest first)")
    for column in rows[0]:
        right = column in ("ok", "failed", "cost", "age")
        table.add_column(column, justify="right" if right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*(escape(v) for v in row.values()))
    console = _console()
    unbounded = console.options.update_width(10**6)  # measured unclamped, then compared
    if Measurement.get(console, unbounded, table).maximum <= console.width:
        console.print(table)
    else:
        console.print("Runs (newest first)", highlight=False)
        for row, best in zip(rows, bests, strict=True):
            console.print(
                f"{escape(row['run'])}  {escape(row['status'])}, {row['age']} old\n"
                f"  machines {escape(row['machines'])}\n"
                f"  trials {row['ok']} ok, {row['failed']} failed · cost {row['cost']}\n"
                f"  best {escape(best)}", highlight=False)
    for run in found:
        if run.error:
            console.print(f"  {escape(run.id)}: {escape(run.error)}", highlight=False)
    console.print("ok = trials ok of those planned; cost = the plan's estimate at launch "
                  "(the run's report has its measured VM time).", highlight=False)
