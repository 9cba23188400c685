"""``cloudprof catalog`` (machine types and prices, filtered and sorted) and ``catalog
refresh`` (dated prices fetched with the user's credentials)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.catalog.machines import CATALOG_PROVIDERS, REFRESH_SOURCES, SORT_KEYS
from orchestrator.cli.conventions import _choices, _Command, _console, _Group, _print_json, _value
from orchestrator.errors import CloudprofError, UsageError

CatalogProvider = _choices("CatalogProvider", CATALOG_PROVIDERS)
SortKey = _choices("SortKey", SORT_KEYS)
TableFormat = _choices("TableFormat", ("table", "csv"))
RefreshSource = _choices("RefreshSource", REFRESH_SOURCES)
_SOURCE_DEFAULT = RefreshSource("api")
_SORT_DEFAULT = SortKey("name")
_FORMAT_DEFAULT = TableFormat("table")


catalog_app = typer.Typer(
    invoke_without_command=True,
    cls=_Group,
    help="List machine types and prices; `catalog refresh` fetches dated prices.",
)


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
