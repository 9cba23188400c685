"""``cloudprof sweep``: its parameters generated from the one table of sweep options
(``spec/options.py``), the spec built and checked before the engine is imported."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.cli.conventions import _choices, _console, _lazy, _question, _value
from orchestrator.errors import CloudprofError, UsageError
from orchestrator.spec.options import SWEEP_OPTIONS, SweepOption, flag_name
from workloads.base import REGISTRY


def _complete_workload(incomplete: str) -> list[str]:
    """The registered workloads (a module:Class is the user's own)."""
    return [name for name in REGISTRY if name.startswith(incomplete)]


def _complete_machine(incomplete: str) -> list[str]:
    """Machine types of the catalog (read only when the shell asks)."""
    from orchestrator.catalog.machines import load_catalog

    try:
        names = {m.name for m in load_catalog(None)}
    except CloudprofError:
        return []
    return sorted(n for n in names if n.startswith(incomplete))


_COMPLETIONS = {"machine": _complete_machine, "workload": _complete_workload}


def _sweep_parameter(option: SweepOption) -> inspect.Parameter:
    """One ``cloudprof sweep`` parameter, as Typer reads it from a signature."""
    kind: Any = {"text": str, "path": str, "int": int, "float": float, "texts": list[str],
                 "flag": bool, "switch": bool}.get(option.kind)
    if option.kind == "choice":
        kind = _choices(option.param.title(), option.choices)
    # not Path for paths: Typer turns '' into the current directory
    info = typer.Option(
        *option.names, help=option.help, metavar=option.metavar,
        rich_help_panel=option.panel,
        autocompletion=_COMPLETIONS.get(option.complete or ""),
    )
    default = False if option.kind == "switch" and not option.in_config else None
    annotation = Annotated[kind if default is False else kind | None, info]  # type: ignore[index]
    return inspect.Parameter(option.param, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=annotation)


def sweep(**given: Any) -> None:
    """Run a workload at several worker counts on each machine type and record the results."""
    from orchestrator.spec.config import build_spec, load_run_spec

    values = {o.key: _value(given[o.param]) for o in SWEEP_OPTIONS if o.in_config}
    resume, config = given["resume"], given["config"]
    asked = _question(given["target"], given["size"], given["total"])  # checked before anything
    if resume is not None:
        # --total asks about the run after it ends; anything else would change the sweep
        named = [k for k, v in values.items() if v not in (None, []) and k != "total"]
        if named or config is not None:
            flags = ", ".join(flag_name(k) for k in named) or "--config"
            raise UsageError(f"--resume takes the spec from RUN/sweep.json; drop {flags}")
        spec = load_run_spec(Path(resume))
    else:
        spec = build_spec(values, Path(config) if config is not None else None)
    if asked is not None and asked.target is not None:
        _check_size_in_grid(asked.size, spec.grid)
    engine = _lazy("orchestrator.engine.sweep", "the sweep engine")
    # prints the plan, then (unless --plan) the report and where the store is
    run_dir = engine.run_sweep(spec, resume=None if resume is None else Path(resume),
                               console=_console(), plan_only=given["plan"])
    if asked is not None and run_dir is not None:
        _print_whole_job(run_dir, asked)


sweep.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [_sweep_parameter(o) for o in SWEEP_OPTIONS])


def _check_size_in_grid(size: str | None, grid: dict[str, list[str]]) -> None:
    """A sweep's --target needs a numeric --grid variable to forecast along: said now."""
    def numeric(values: list[str]) -> bool:
        try:
            return all(float(v) > 0 for v in values)
        except ValueError:
            return False

    sizes = [name for name, values in grid.items() if numeric(values)]
    if size is not None and size not in sizes:
        raise UsageError(f"--target: no numeric --grid {size} to forecast along "
                         f"(numeric grid variables: {', '.join(sizes) or 'none'})")
    if size is None and len(sizes) != 1:
        raise UsageError("--target: " + ("several --grid variables are numbers: say which is "
                                         "the size, e.g. --size rows" if sizes else
                                         "sweep a size to forecast along, e.g. "
                                         "--grid rows=1000,2000,4000,8000"))


def _print_whole_job(run_dir: Path, asked: Any) -> None:
    """The forecast and whole-job lines after a sweep's report."""
    whole_job = _lazy("orchestrator.results.whole_job", "forecasts")
    reports = _lazy("orchestrator.results.report", "reporting")
    console = _console()
    for line in whole_job.render_lines(reports.load_run(run_dir), asked):
        console.print(line, highlight=False, markup=False,
                      style="bold red" if line.startswith("WARNING") else None)
