"""The ``cloudprof`` command line.

This module is imported by every invocation, including ``--help``, so it
imports only Typer/Click and cloudprof's light modules at the top; the sweep
engine, reports, pandas and the cloud SDKs are imported inside the command
that needs them. ``main`` turns every ``CloudprofError`` and every Click usage
error into one ``error: ...`` line on stderr and the documented exit code.
"""

from __future__ import annotations

import copy
import enum
import importlib
import inspect
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator import __version__
from orchestrator.catalog.machines import CATALOG_PROVIDERS, REFRESH_SOURCES, SORT_KEYS
from orchestrator.engine import signals
from orchestrator.errors import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CloudprofError,
    UsageError,
    interrupt_again,
)
from orchestrator.spec.options import (
    SIZE_HELP,
    SWEEP_OPTIONS,
    TARGET_HELP,
    TOTAL_HELP,
    SweepOption,
    flag_name,
)
from orchestrator.spec.spec import SweepSpec
from workloads.base import REGISTRY

if TYPE_CHECKING:
    from rich.console import Console

def _choices(name: str, values: object) -> type[enum.Enum]:
    """An Enum of the names another module defines, so that ``--help`` lists them and the
    shell completes them, from that module's one definition."""
    return enum.Enum(name, {str(v): str(v) for v in values}, type=str)  # type: ignore[return-value]


CatalogProvider = _choices("CatalogProvider", CATALOG_PROVIDERS)
CleanupProvider = _choices("CleanupProvider", ("gcp", "aws"))
SortKey = _choices("SortKey", SORT_KEYS)
TableFormat = _choices("TableFormat", ("table", "csv"))
RefreshSource = _choices("RefreshSource", REFRESH_SOURCES)
_SOURCE_DEFAULT = RefreshSource("api")
_SORT_DEFAULT = SortKey("name")
_FORMAT_DEFAULT = TableFormat("table")


def _value(given: Any) -> Any:
    """A choice's string (Typer hands an Enum member); any other value unchanged."""
    return str(given.value) if isinstance(given, enum.Enum) else given


class _ClickConventions:
    """Help and usage as Click and argparse write them, not as Typer 0.29 does.

    Typer labels every parameter with its Python type (``<bool>``, ``<list[Path]>``) and
    writes a required argument as ``{RUN}`` in the usage line. A flag takes no value, so
    it gets no label (``--help`` included); an argument is named by its metavar alone
    (``RUN``, ``RUN...``, ``[RUN]`` when optional), its help says what it is.
    """

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if isinstance(param, typer.core.TyperArgument):
                param.display_type_rich = _no_type  # type: ignore[method-assign]
                if getattr(param, "type", None) is not None:  # Typer < 0.29
                    param.type = _unlabelled(param.type)
                param.get_usage_pieces = _usage_of(param)  # type: ignore[method-assign]
            elif getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _plain_help(self)
        super().format_help(ctx, formatter)  # type: ignore[misc]


def _plain_help(command: Any) -> None:
    """Escape the help texts of ``command``, its parameters and its subcommands, once.

    Typer reads help as rich markup, where the ``[ray]`` of ``cloudprof[ray]`` is a tag and
    vanishes; cloudprof's help texts are plain text. Done when help is shown, so that other
    invocations do not import rich for it.
    """
    if getattr(command, "_plain_help", False):
        return
    from rich.markup import escape

    command._plain_help = True
    for obj in (command, *command.params):
        for attr in ("help", "short_help"):
            if getattr(obj, attr, None):
                setattr(obj, attr, escape(getattr(obj, attr)))
    for sub in getattr(command, "commands", {}).values():
        _plain_help(sub)


def _no_type(ctx: Any) -> None:
    return None


def _unlabelled(kind: Any) -> Any:
    """The argument's type without a label in help (Typer < 0.29 labels an argument with its
    type's metavar, else ``<type>``): a copy, since a type may be shared by parameters."""
    kind = copy.copy(kind)
    kind.get_metavar = lambda *_a, **_k: ""
    return kind


def _usage_of(param: Any) -> Any:
    def pieces(ctx: Any) -> list[str]:
        name = (param.metavar or param.name or "").upper()
        if param.nargs != 1 and not name.endswith("..."):
            name += "..."
        return [name if param.required else f"[{name}]"]

    return pieces


class _Group(_ClickConventions, typer.core.TyperGroup):
    pass


class _Command(_ClickConventions, typer.core.TyperCommand):
    pass


app = typer.Typer(
    name="cloudprof",
    cls=_Group,
    help=(
        "Which cloud machine, how many workers, what cost, what peak memory: "
        "profile a workload across VM types."
    ),
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_DEFAULTS = SweepSpec(machines=[])  # help texts show the spec's own defaults


PIPED_WIDTH = 160  # columns of output that goes to a file or a pipe


def _console(stderr: bool = False) -> Console:
    """rich assumes 80 columns when not writing to a terminal, which wraps the report's
    tables mid-word in a file or a CI log; there it gets PIPED_WIDTH unless $COLUMNS says."""
    from rich.console import Console

    console = Console(stderr=stderr)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = PIPED_WIDTH
    return console


def _lazy(module: str, what: str) -> ModuleType:
    """Import a part of cloudprof on use; a missing part is a clear error, not a traceback."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise CloudprofError(
            f"{what} is not available in this installation ({module} is missing)"
        ) from None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cloudprof {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Which cloud machine, how many workers, what cost, what peak memory."""
    if ctx.invoked_subcommand is None:  # a command is missing: a usage error, as in git or Click
        typer.echo(ctx.get_help())
        raise typer.Exit(EXIT_USAGE)


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
app.command(cls=_Command)(sweep)


def _question(target: str | None, size: str | None, total: float | None) -> Any:
    """--target/--size/--total as a ``whole_job.Question`` (None when none given)."""
    if target is None and size is None and total is None:
        return None
    return _lazy("orchestrator.results.whole_job", "forecasts").question(target, size, total)


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


catalog_app = typer.Typer(
    invoke_without_command=True,
    cls=_Group,
    help="List machine types and prices; `catalog refresh` fetches dated prices.",
)
app.add_typer(catalog_app, name="catalog")


@catalog_app.callback()
def catalog(
    ctx: typer.Context,
    provider: Annotated[
        CatalogProvider | None,  # type: ignore[valid-type]
        typer.Option(help="Only this cloud."),
    ] = None,
    family: Annotated[
        str | None,
        typer.Option(help="n2, c6i, or a name prefix like n2-highcpu.", metavar="FAMILY"),
    ] = None,
    region: Annotated[str | None, typer.Option(help="Only this region.", metavar="REGION")] = None,
    min_vcpus: Annotated[
        int | None, typer.Option(help="At least this many vCPUs.", metavar="N")
    ] = None,
    max_vcpus: Annotated[
        int | None, typer.Option(help="At most this many vCPUs.", metavar="N")
    ] = None,
    max_price: Annotated[
        float | None, typer.Option(help="At most this many USD per hour.", metavar="USD")
    ] = None,
    spot: Annotated[
        bool, typer.Option("--spot", help="Filter and sort by the spot price.")
    ] = False,
    sort: Annotated[SortKey, typer.Option(help="Sort key.")] = _SORT_DEFAULT,  # type: ignore[valid-type]
    fmt: Annotated[
        TableFormat,  # type: ignore[valid-type]
        typer.Option("--format", help="A table for people or CSV in the catalog's own format."),
    ] = _FORMAT_DEFAULT,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="A JSON array of machine types, full precision, for scripts."),
    ] = False,
) -> None:
    """List machine types with vCPUs, memory, prices per hour, and where each price comes from."""
    if ctx.invoked_subcommand is not None:
        return
    from orchestrator.catalog import machines as cat

    provider = _value(provider)
    if as_json and fmt.value != "table":
        raise UsageError(f"--json and --format {fmt.value} are two outputs: give one")
    for flag, value in (("--min-vcpus", min_vcpus), ("--max-vcpus", max_vcpus)):
        if value is not None and value < 1:
            raise UsageError(f"{flag}: must be 1 or more, got {value}")
    if min_vcpus is not None and max_vcpus is not None and min_vcpus > max_vcpus:
        raise UsageError(f"--min-vcpus {min_vcpus} is above --max-vcpus {max_vcpus}")
    if max_price is not None and not max_price > 0:
        raise UsageError(f"--max-price: must be positive, got {max_price}")
    rows = cat.load_catalog(provider)
    for flag, value, known in (
        ("--family", family, {m.family for m in rows} | {m.name.rsplit("-", 1)[0] for m in rows}),
        ("--region", region, {m.region for m in rows}),
    ):
        if value is not None and value not in known:
            close = cat.suggest(value, known)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(f"{flag}: {value!r} is not in the catalog{hint}")
    rows = cat.filter_catalog(
        rows, provider=provider, family=family, region=region, min_vcpus=min_vcpus,
        max_vcpus=max_vcpus, max_price=max_price, spot=spot,
    )  # fmt: skip
    rows = cat.sort_catalog(rows, sort.value, spot=spot)
    if as_json:  # the catalog files' column names, as in --format csv; null for no price
        _print_json([cat.to_record(m) for m in rows])
    elif fmt.value == "csv":
        sys.stdout.write(cat.render_csv(rows))
    elif not rows:
        typer.echo("no machine type matches these filters", err=True)
    else:
        _print_catalog_table(rows)


@catalog_app.command("refresh", cls=_Command)
def catalog_refresh(
    path: Annotated[
        Path | None,
        typer.Argument(help="With --from skypilot: its catalogs folder or a vms.csv "
                       "(default ~/.sky/catalogs).", show_default=False, metavar="[PATH]"),
    ] = None,
    provider: Annotated[
        CatalogProvider | None,  # type: ignore[valid-type]
        typer.Option(help="Only this cloud (default: both)."),
    ] = None,
    source: Annotated[
        RefreshSource,  # type: ignore[valid-type]
        typer.Option("--from", help="api (the providers' price APIs) or skypilot."),
    ] = _SOURCE_DEFAULT,
    region: Annotated[
        list[str] | None,
        typer.Option("--region", metavar="REGION",
                     help="Only this region (repeatable; default: all for GCP, "
                     "the shipped catalog's for AWS)."),
    ] = None,
    project: Annotated[
        str | None, typer.Option(help="GCP project for machine types.", metavar="PROJECT")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a catalog file you edited (kept beside).")
    ] = False,
) -> None:
    """Fetch dated prices (your credentials) into ~/.cache/cloudprof/catalog; sweeps use them."""
    from orchestrator.catalog import machines as cat
    from orchestrator.catalog.pricing import refresh as pricing

    provider, source = _value(provider), str(source.value)
    if path is not None and source != "skypilot":
        raise UsageError("a PATH is only read with --from skypilot")
    for name in region or []:
        cat.check_name(name, "region")
    failures: list[CloudprofError] = []
    for name in [provider] if provider else list(cat.CATALOG_PROVIDERS):
        try:
            done = pricing.refresh(name, source=source, path=path, regions=region or (),
                                   project=project, force=force)
        except CloudprofError as exc:
            if provider:  # the one asked for: its error is the command's
                raise
            typer.echo(f"error: {name}: {exc}", err=True)
            failures.append(exc)
            continue
        typer.echo(f"{name}: {len(done.rows)} prices in {done.regions} region(s) written to "
                   f"{done.path} (from {done.source}; fetched {done.rows[0].fetched_at})"
                   + (f"; {done.kept} kept from earlier refreshes" if done.kept else ""))
        if done.missing:
            shown = ", ".join(done.missing[:8]) + (
                f" and {len(done.missing) - 8} more" if len(done.missing) > 8 else "")
            typer.echo(f"warning: {name}: no price found for {shown}; the shipped offline "
                       "estimate stays in use there", err=True)
    if failures:
        raise failures[0]


def _print_json(data: Any) -> None:
    """JSON for scripts on stdout: one document, keys as stored, no colours or wrapping."""
    import json

    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _fmt_price(price: float | None) -> str:
    return "-" if price is None else f"{price:.4f}"


def _print_catalog_table(rows: list[Any]) -> None:
    """A rich table with each row's source and price date (its age in days, ``!`` past
    STALE_DAYS); each distinct source's full text is printed once, below it, as a note."""
    from rich.markup import escape
    from rich.table import Table

    notes: dict[tuple[str, str], int] = {}
    for m in rows:
        notes.setdefault((m.price_source, m.price_date), len(notes) + 1)
    table = Table(title="Machine types (USD per hour, Linux)", box=None, pad_edge=False)
    for column, justify in (
        ("cloud", "left"), ("machine type", "left"), ("vCPUs", "right"), ("GiB", "right"),
        ("region", "left"), ("on-demand", "right"), ("spot", "right"), ("source", "left"),
        ("price date", "left"),
    ):  # fmt: skip
        # names and figures whole at any width; the source and date wrap instead
        wraps = column in ("source", "price date")
        widest = max((len(m.name) for m in rows), default=0) if column == "machine type" else None
        table.add_column(column, justify=justify, no_wrap=not wraps,  # type: ignore[arg-type]
                         overflow="fold", min_width=widest)
    for m in rows:
        age = m.age_days()
        table.add_row(
            m.provider, m.name, str(m.vcpus), f"{m.memory_gib:g}", m.region,
            _fmt_price(m.price_on_demand), _fmt_price(m.price_spot),
            escape(f"{m.source_name} [{notes[(m.price_source, m.price_date)]}]"),
            m.price_date + ("" if age is None else f" ({age} d{' !' if m.stale() else ''})"),
        )  # fmt: skip
    console = _console()
    console.print(table)
    if any(m.stale() for m in rows):
        from orchestrator.catalog.machines import STALE_DAYS

        console.print(f"[yellow]warning:[/yellow] prices marked ! are over {STALE_DAYS} days "
                      "old: run `cloudprof catalog refresh` for current ones", highlight=False)
    console.print("Price sources (offline estimates are not fetched: run `cloudprof catalog "
                  "refresh` for dated provider prices):", highlight=False)
    for (source, day), number in notes.items():
        console.print(f"  [{number}] {source}; price date {day}", highlight=False, markup=False,
                      soft_wrap=True)  # one line per source, as long as it is


@app.command(cls=_Command)
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


@app.command(cls=_Command)
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


@app.command(cls=_Command)
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


@app.command(cls=_Command)
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


@app.command(cls=_Command)
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


_CLEANUP_HELP = (
    "List (and with --yes delete) leftover resources carrying cloudprof's labels.\n\n"
    "Due by default: what is past its expiry label, and every instance, key pair, security "
    "group and firewall rule of a sweep whose run directory (under --out) no process is "
    "running, a killed one included (its sweep.json may still say running; the run's lock "
    "tells). A sweep running here deletes its own; one with no run directory here waits "
    "for its expiry. Bucket prefixes keep their retention (--resume reads them)."
)


@app.command(cls=_Command, help=_CLEANUP_HELP)
def cleanup(
    provider: Annotated[
        CleanupProvider | None,  # type: ignore[valid-type]
        typer.Option(help="Only this cloud (default: both)."),
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            help="Only resources created longer ago than this: 30m, 2h, 1d "
            "(default: those whose expiry label has passed, and those of a sweep "
            "under --out that no process is running any more).",
            metavar="TIME",
        ),
    ] = None,
    sweep_id: Annotated[
        str | None,
        typer.Option(
            "--sweep",
            help="Only this sweep's resources (its id or run directory).",
            metavar="ID|RUN",
        ),
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Delete; without it, only list.")
    ] = False,
    bucket: Annotated[
        list[str] | None,
        typer.Option(
            help="Also look for labelled prefixes in this bucket (repeatable); the buckets "
            "of the runs under --out and of --config are looked in anyway.",
            metavar="URL",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help=f"Runs directory whose sweeps' buckets are looked in, and whose "
                     f"ended sweeps' resources are due (default: {_DEFAULTS.out}).",
                     metavar="DIR"),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="sweep.toml whose bucket (and out) to use.",
                     metavar="FILE"),
    ] = None,
) -> None:
    """List (and with --yes delete) leftover resources carrying cloudprof's labels."""
    from orchestrator.catalog.machines import check_name
    from orchestrator.results.store import recorded_buckets
    from orchestrator.spec.config import read_config
    from orchestrator.spec.values import check_bucket, parse_duration

    provider = _value(provider)
    older_than_s = parse_duration(older_than, "--older-than") if older_than is not None else None
    runs_dirs = []
    if sweep_id is not None and not sweep_id.strip():  # Path('') is the current directory
        raise UsageError("--sweep: empty; give a sweep id or its run directory")
    if sweep_id is not None:
        if Path(sweep_id).is_dir():
            runs_dirs.append(Path(sweep_id))
        sweep_id = check_name(_sweep_id_of(sweep_id), "sweep id")
    given = [check_bucket(url) for url in bucket or []]
    settings = read_config(config) if config is not None else {}
    runs_dirs.append(out or Path(settings.get("out") or _DEFAULTS.out))
    found = [*([settings["bucket"]] if settings.get("bucket") else []),
             *recorded_buckets(runs_dirs)]
    module = _lazy("orchestrator.engine.cleanup", "cleanup")
    module.cleanup(provider, older_than_s, sweep_id, yes, _console(), given_buckets=given,
                   found_buckets=found, runs_dirs=runs_dirs)


def _sweep_id_of(value: str) -> str:
    """A sweep id given as such, or as its run directory (read from sweep.json)."""
    import json

    from orchestrator.results.store import SWEEP_FILE

    path = Path(value)
    if not path.is_dir():
        return value
    try:
        recorded = json.loads((path / SWEEP_FILE).read_text(encoding="utf-8")).get("sweep_id")
    except (OSError, ValueError, AttributeError):
        recorded = None
    return str(recorded or path.resolve().name)


def _error(message: str) -> None:
    sys.stderr.write(f"error: {' '.join(message.split())}\n")
    sys.stderr.flush()


def _cli_error_types() -> tuple[type[Exception], ...]:
    """Command-line parsing errors: Typer's own (vendored Click) and Click's, whichever exist."""
    types: list[type[Exception]] = []
    try:
        from typer import TyperException

        types.append(TyperException)
    except ImportError:  # typer < 0.20 uses click
        pass
    try:
        import click

        types.append(click.ClickException)
    except ImportError:
        pass
    return tuple(types)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run the app, map errors to one line and an exit code.

    Every teardown signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT: see ``engine.signals``) is
    Ctrl-C here, so one landing outside a sweep's own handling (just before or after it)
    still exits 130 with one line, never a core dump or a traceback. As the process's
    entry point (no ``argv``), writes to a closed stdout or stderr vanish instead of
    failing the command, and signals are ignored once the exit code is known.
    """
    entry = argv is None and threading.current_thread() is threading.main_thread()
    hook = sys.unraisablehook
    if entry:
        sys.unraisablehook = _interrupt_in_a_finalizer
        signals.tolerate_closed_output()
    try:
        with signals.as_interrupt(restore=not entry):
            return _main(argv, entry)
    except KeyboardInterrupt:  # landed between the command's own handling and here
        _error("interrupted")
        return EXIT_INTERRUPTED
    finally:
        if entry:
            signals.ignore_all()
            _exit_without_a_final_collection()
        sys.unraisablehook = hook


def _exit_without_a_final_collection() -> None:
    """The process is about to exit: move every object into the collector's permanent
    generation, so that the interpreter's collections at shutdown do not walk what a sweep
    loaded (pandas, pyarrow, the report: 0.1-0.4 s of a sweep's wall, measured by
    benchmarks/bench_cli_exit.py). Exit handlers, flushes and the deletion of temporary
    files still run; only cyclic garbage is left for the OS to reclaim with the process.
    Never done for an in-process call (``main(argv)``: tests, a notebook), whose objects
    must stay collectable."""
    import gc

    gc.freeze()


def _interrupt_in_a_finalizer(unraisable: Any) -> None:
    """A Ctrl-C that landed in a finalizer is sent again: it interrupts the command, or is
    ignored once the command is over; never a traceback."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        interrupt_again(signals.signum_of(unraisable.exc_value))
        return
    sys.__unraisablehook__(unraisable)


def _main(argv: list[str] | None, entry: bool = False) -> int:
    command = typer.main.get_command(app)
    try:
        try:
            result = command.main(args=argv, prog_name="cloudprof", standalone_mode=False)
        finally:
            if entry:  # before the handlers below drop the error (its frames' finalizers run)
                signals.ignore_all()
    except CloudprofError as exc:
        _error(str(exc))
        return exc.exit_code
    except _cli_error_types() as exc:  # unknown option, missing argument, bad int...
        _error(exc.format_message())  # type: ignore[attr-defined]
        return int(getattr(exc, "exit_code", EXIT_USAGE)) or EXIT_USAGE
    except (KeyboardInterrupt, typer.Abort):
        _error("interrupted")
        return EXIT_INTERRUPTED
    if result == EXIT_INTERRUPTED:  # Typer turns Ctrl-C into this exit code
        _error("interrupted")
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
