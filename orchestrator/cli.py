"""The ``cloudprof`` command line.

This module is imported by every invocation, including ``--help``, so it
imports only Typer/Click and cloudprof's light modules at the top; the sweep
engine, reports, pandas and the cloud SDKs are imported inside the command
that needs them. ``main`` turns every ``CloudprofError`` and every Click usage
error into one ``error: ...`` line on stderr and the documented exit code.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator import __version__
from orchestrator.errors import EXIT_INTERRUPTED, EXIT_USAGE, CloudprofError, UsageError
from orchestrator.spec.spec import SweepSpec

if TYPE_CHECKING:
    from rich.console import Console

app = typer.Typer(
    name="cloudprof",
    help=(
        "Which cloud machine, how many workers, what cost, what peak memory: "
        "profile a workload across VM types."
    ),
    invoke_without_command=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_DEFAULTS = SweepSpec(machines=[])  # help texts show the spec's own defaults
SWEEP = "Sweep"
WORKLOAD = "Workload"
CLOUD = "Provider"
LIMITS = "Limits and output"


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
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())


@app.command()
def sweep(
    machine: Annotated[
        list[str] | None,
        typer.Option(
            "--machine",
            "-m",
            help="Machine type (repeatable), e.g. n2-highcpu-80, c6i.large.",
            rich_help_panel=SWEEP,
        ),
    ] = None,
    workers: Annotated[
        str | None,
        typer.Option(
            help="Worker counts: 1,2,4,8 or 1-8 or 1-64:x2 (default: powers of two up to the "
            "vCPUs, the vCPUs, one oversubscribed).",
            rich_help_panel=SWEEP,
        ),
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option(
            help=f"Trials per worker count (default: {_DEFAULTS.repeats}).", rich_help_panel=SWEEP
        ),
    ] = None,
    duration: Annotated[
        str | None,
        typer.Option(
            help=f"Time per trial: 5, 30s, 2m (default: {_DEFAULTS.duration_s:g}s).",
            rich_help_panel=SWEEP,
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="sweep.toml with any of these options; flags override it.",
            rich_help_panel=SWEEP,
        ),
    ] = None,
    dry_run: Annotated[
        bool | None,
        typer.Option(
            "--dry-run/--no-dry-run",
            help="Print the plan and cost, then run the whole "
            "pipeline on this machine: no cloud call, no credentials.",
            rich_help_panel=SWEEP,
        ),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            help="Run only the missing trials of the run directory RUN.",
            metavar="RUN",
            rich_help_panel=SWEEP,
        ),
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option(
            help=f"Registered workload or module:Class (default: {_DEFAULTS.workload}).",
            rich_help_panel=WORKLOAD,
        ),
    ] = None,
    frames: Annotated[
        int | None, typer.Option(help="Input frames (Parquet files).", rich_help_panel=WORKLOAD)
    ] = None,
    dim: Annotated[int | None, typer.Option(help="Cube side.", rich_help_panel=WORKLOAD)] = None,
    rows: Annotated[
        int | None, typer.Option(help="Rows per frame.", rich_help_panel=WORKLOAD)
    ] = None,
    cols: Annotated[
        int | None, typer.Option(help="Columns per frame.", rich_help_panel=WORKLOAD)
    ] = None,
    strategy: Annotated[
        str | None,
        typer.Option(help="naive, dataframes, numpy, threads or fast.", rich_help_panel=WORKLOAD),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Input generator seed.", rich_help_panel=WORKLOAD)
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            "-p",
            help="key=value for the workload (repeatable).",
            rich_help_panel=WORKLOAD,
        ),
    ] = None,
    provider: Annotated[
        str | None,
        typer.Option(
            help="gcp, aws, ssh or local (default: the machine's provider in the catalog).",
            rich_help_panel=CLOUD,
        ),
    ] = None,
    region: Annotated[
        str | None,
        typer.Option(help="Region (default: the catalog's first).", rich_help_panel=CLOUD),
    ] = None,
    zone: Annotated[
        str | None, typer.Option(help="Zone (sets the region).", rich_help_panel=CLOUD)
    ] = None,
    project: Annotated[str | None, typer.Option(help="GCP project.", rich_help_panel=CLOUD)] = None,
    bucket: Annotated[
        str | None,
        typer.Option(
            help="gs://name, s3://name or a directory for the inputs.", rich_help_panel=CLOUD
        ),
    ] = None,
    spot: Annotated[
        bool | None,
        typer.Option("--spot/--no-spot", help="Spot/preemptible VMs.", rich_help_panel=CLOUD),
    ] = None,
    hosts: Annotated[
        Path | None,
        typer.Option(
            "--hosts", help="TOML file of SSH hosts (provider ssh).", rich_help_panel=CLOUD
        ),
    ] = None,
    host: Annotated[
        list[str] | None,
        typer.Option(
            "--host", help="user@address[:port] (repeatable, provider ssh).", rich_help_panel=CLOUD
        ),
    ] = None,
    ssh_key: Annotated[
        Path | None,
        typer.Option(
            help="Private key for --host (instead of a per-sweep key).", rich_help_panel=CLOUD
        ),
    ] = None,
    max_cost: Annotated[
        float | None,
        typer.Option(
            help="Refuse to start when the estimate is above this many USD.", rich_help_panel=LIMITS
        ),
    ] = None,
    max_peak_memory: Annotated[
        str | None,
        typer.Option(
            help="Memory gate: exit 3 when a trial peaks above this (2G, 512MiB).",
            rich_help_panel=LIMITS,
        ),
    ] = None,
    sample_hz: Annotated[
        float | None,
        typer.Option(
            help=f"Profiling samples per second (default: {_DEFAULTS.sample_hz:g}).",
            rich_help_panel=LIMITS,
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            help="Also run one extra profiled trial per worker count: cpu (py-spy: why scaling "
            "stops) or memory (memray: where the peak comes from). Kept out of throughput tables.",
            rich_help_panel=LIMITS,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help=f"Results directory (default: {_DEFAULTS.out}).", rich_help_panel=LIMITS),
    ] = None,
) -> None:
    """Run a workload at several worker counts on each machine type and record the results."""
    from orchestrator.spec.config import build_spec, flag_name, load_run_spec

    values: dict[str, Any] = {
        "machines": machine, "workers": workers, "repeats": repeats, "duration": duration,
        "workload": workload, "frames": frames, "dim": dim, "rows": rows, "cols": cols,
        "strategy": strategy, "seed": seed, "params": param, "provider": provider,
        "region": region, "zone": zone, "project": project, "bucket": bucket, "spot": spot,
        "max_cost": max_cost, "max_peak_memory": max_peak_memory, "sample_hz": sample_hz,
        "profile": profile, "out": out, "dry_run": dry_run, "hosts_file": hosts, "hosts": host,
        "ssh_key": ssh_key,
    }  # fmt: skip
    if resume is not None:
        given = [k for k, v in values.items() if v not in (None, [])]
        if given or config is not None:
            flags = ", ".join(flag_name(k) for k in given) or "--config"
            raise UsageError(f"--resume takes the spec from RUN/sweep.json; drop {flags}")
        spec = load_run_spec(resume)
    else:
        spec = build_spec(values, config)
    engine = _lazy("orchestrator.engine.sweep", "the sweep engine")
    engine.run_sweep(spec, resume=resume, console=_console())  # prints the plan, report, store


catalog_app = typer.Typer(
    invoke_without_command=True,
    help="List machine types and prices; `catalog refresh` fetches dated prices.",
)
app.add_typer(catalog_app, name="catalog")


@catalog_app.callback()
def catalog(
    ctx: typer.Context,
    provider: Annotated[str | None, typer.Option(help="gcp or aws.")] = None,
    family: Annotated[
        str | None, typer.Option(help="n2, c6i, or a name prefix like n2-highcpu.")
    ] = None,
    region: Annotated[str | None, typer.Option(help="Only this region.")] = None,
    min_vcpus: Annotated[int | None, typer.Option(help="At least this many vCPUs.")] = None,
    max_vcpus: Annotated[int | None, typer.Option(help="At most this many vCPUs.")] = None,
    max_price: Annotated[float | None, typer.Option(help="At most this many USD per hour.")] = None,
    spot: Annotated[
        bool, typer.Option("--spot", help="Filter and sort by the spot price.")
    ] = False,
    sort: Annotated[str, typer.Option(help="name, vcpus, memory or price.")] = "name",
    fmt: Annotated[str, typer.Option("--format", help="table or csv.")] = "table",
) -> None:
    """List machine types with vCPUs, memory, prices per hour, and where each price comes from."""
    if ctx.invoked_subcommand is not None:
        return
    from orchestrator.spec import catalog as cat

    if provider is not None and provider not in cat.CATALOG_PROVIDERS:
        raise UsageError(
            f"--provider: the catalog covers {', '.join(cat.CATALOG_PROVIDERS)}, not {provider!r}"
        )
    if fmt not in ("table", "csv"):
        raise UsageError(f"--format: choose table or csv, not {fmt!r}")
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
    rows = cat.sort_catalog(rows, sort, spot=spot)
    if fmt == "csv":
        sys.stdout.write(cat.render_csv(rows))
    elif not rows:
        typer.echo("no machine type matches these filters", err=True)
    else:
        _print_catalog_table(rows)


@catalog_app.command("refresh")
def catalog_refresh(
    path: Annotated[
        Path | None,
        typer.Argument(help="With --from skypilot: its catalogs folder or a vms.csv "
                       "(default ~/.sky/catalogs).", show_default=False),
    ] = None,
    provider: Annotated[
        str | None, typer.Option(help="gcp or aws (default: both).")
    ] = None,
    source: Annotated[
        str, typer.Option("--from", help="api (the providers' price APIs) or skypilot.")
    ] = "api",
    region: Annotated[
        list[str] | None,
        typer.Option("--region", help="Only this region (repeatable; default: all for GCP, "
                     "the shipped catalog's for AWS)."),
    ] = None,
    project: Annotated[str | None, typer.Option(help="GCP project for machine types.")] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a catalog file you edited (kept beside).")
    ] = False,
) -> None:
    """Fetch dated prices (your credentials) into ~/.cache/cloudprof/catalog; sweeps use them."""
    from orchestrator.spec import catalog as cat
    from orchestrator.spec.pricing import refresh as pricing

    if source not in pricing.SOURCES:
        raise UsageError(f"--from: choose {' or '.join(pricing.SOURCES)}, not {source!r}")
    if path is not None and source != "skypilot":
        raise UsageError("a PATH is only read with --from skypilot")
    if provider is not None and provider not in cat.CATALOG_PROVIDERS:
        raise UsageError(
            f"--provider: choose {' or '.join(cat.CATALOG_PROVIDERS)}, not {provider!r}")
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
                   f"{done.path} (from {done.source}; fetched {done.rows[0].fetched_at})")
        if done.missing:
            shown = ", ".join(done.missing[:8]) + (
                f" and {len(done.missing) - 8} more" if len(done.missing) > 8 else "")
            typer.echo(f"warning: {name}: no price found for {shown}; the shipped offline "
                       "estimate stays in use there", err=True)
    if failures:
        raise failures[0]


def _fmt_price(price: float | None) -> str:
    return "-" if price is None else f"{price:.4f}"


def _print_catalog_table(rows: list[Any]) -> None:
    """A rich table; each distinct price source is printed once, below it, as a note."""
    from rich.table import Table

    notes: dict[tuple[str, str], int] = {}
    for m in rows:
        notes.setdefault((m.price_source, m.price_date), len(notes) + 1)
    table = Table(title="Machine types (USD per hour, Linux)", box=None, pad_edge=False)
    for column, justify in (
        ("cloud", "left"), ("machine type", "left"), ("vCPUs", "right"), ("GiB", "right"),
        ("region", "left"), ("on-demand", "right"), ("spot", "right"), ("source", "right"),
    ):  # fmt: skip
        table.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for m in rows:
        table.add_row(
            m.provider, m.name, str(m.vcpus), f"{m.memory_gib:g}", m.region,
            _fmt_price(m.price_on_demand), _fmt_price(m.price_spot),
            f"[{notes[(m.price_source, m.price_date)]}]",
        )  # fmt: skip
    console = _console()
    console.print(table)
    console.print("Price sources (offline estimates are not fetched: run `cloudprof catalog "
                  "refresh` for dated provider prices):", highlight=False)
    for (source, day), number in notes.items():
        console.print(f"  \\[{number}] {source}; price date {day}", highlight=False)


@app.command()
def report(
    run: Annotated[Path, typer.Argument(help="A run directory, e.g. runs/<sweep-id>.")],
) -> None:
    """Print a run's summary and write report.html, report.md and plots/ into it."""
    reports = _lazy("orchestrator.results.report", "reporting")
    console = _console()
    reports.print_summary(run, console)
    written = reports.write_report(run)
    for path in written if isinstance(written, list | tuple) else [written]:
        console.print(f"wrote {path}")


@app.command()
def compare(
    runs: Annotated[
        list[Path], typer.Argument(help="Two or more run directories.", metavar="RUN...")
    ],
) -> None:
    """Compare two or more runs side by side, with ratios."""
    if len(runs) < 2:
        raise UsageError("compare needs at least two runs, e.g. cloudprof compare runs/a runs/b")
    _lazy("orchestrator.results.compare", "run comparison").compare_runs(list(runs), _console())


@app.command()
def cleanup(
    provider: Annotated[str | None, typer.Option(help="gcp or aws (default: both).")] = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            help="Only resources created longer ago than this: 30m, 2h, 1d "
            "(default: those whose expiry label has passed)."
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
        typer.Option(help=f"Runs directory whose sweeps' buckets are looked in "
                     f"(default: {_DEFAULTS.out})."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="sweep.toml whose bucket (and out) to use."),
    ] = None,
) -> None:
    """List (and with --yes delete) leftover resources carrying cloudprof's labels."""
    from orchestrator.results.store import recorded_buckets
    from orchestrator.spec.catalog import check_name
    from orchestrator.spec.config import check_bucket, parse_duration, read_config

    if provider is not None and provider not in ("gcp", "aws"):
        raise UsageError(f"--provider: cleanup applies to gcp and aws, not {provider!r}")
    older_than_s = parse_duration(older_than, "--older-than") if older_than is not None else None
    runs_dirs = []
    if sweep_id is not None:
        if Path(sweep_id).is_dir():
            runs_dirs.append(Path(sweep_id))
        sweep_id = check_name(_sweep_id_of(sweep_id), "sweep id")
    given = [check_bucket(url) for url in bucket or []]
    settings = read_config(config) if config is not None else {}
    runs_dirs.append(out or Path(settings.get("out") or _DEFAULTS.out))
    found = [*([settings["bucket"]] if settings.get("bucket") else []),
             *recorded_buckets(runs_dirs)]
    # Bucket arguments only when there are buckets: cleanup's 5-argument call stays as is.
    buckets = {"given_buckets": given, "found_buckets": found} if given or found else {}
    module = _lazy("orchestrator.engine.cleanup", "cleanup")
    module.cleanup(provider, older_than_s, sweep_id, yes, _console(), **buckets)


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
    """Console-script entry point: run the app, map errors to one line and an exit code."""
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="cloudprof", standalone_mode=False)
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
