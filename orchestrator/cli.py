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
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator import __version__
from orchestrator.engine import signals
from orchestrator.errors import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CloudprofError,
    UsageError,
    interrupt_again,
)
from orchestrator.plan.search import OBJECTIVES
from orchestrator.providers import PROVIDERS
from orchestrator.spec.catalog import CATALOG_PROVIDERS, REFRESH_SOURCES, SORT_KEYS
from orchestrator.spec.spec import SweepSpec
from workloads.base import REGISTRY
from workloads.cube_strategies import STRATEGIES
from workloads.limits import MAX_SAMPLE_HZ, MIN_SAMPLE_HZ
from workloads.protocol import PROFILE_KINDS

if TYPE_CHECKING:
    from rich.console import Console

def _choices(name: str, values: object) -> type[enum.Enum]:
    """An Enum of the names another module defines, so that ``--help`` lists them and the
    shell completes them, from that module's one definition."""
    return enum.Enum(name, {str(v): str(v) for v in values}, type=str)  # type: ignore[return-value]


ProviderChoice = _choices("ProviderChoice", PROVIDERS)
CatalogProvider = _choices("CatalogProvider", CATALOG_PROVIDERS)
CleanupProvider = _choices("CleanupProvider", ("gcp", "aws"))
Strategy = _choices("Strategy", STRATEGIES)
SortKey = _choices("SortKey", SORT_KEYS)
TableFormat = _choices("TableFormat", ("table", "csv"))
ProfileKind = _choices("ProfileKind", PROFILE_KINDS)
RefreshSource = _choices("RefreshSource", REFRESH_SOURCES)
SearchGoal = _choices("SearchGoal", OBJECTIVES)
_SOURCE_DEFAULT = RefreshSource("api")
_SORT_DEFAULT = SortKey("name")
_FORMAT_DEFAULT = TableFormat("table")


def _value(choice: enum.Enum | None) -> str | None:
    return None if choice is None else str(choice.value)


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
SWEEP = "Sweep"
SEARCH = "Search over machine types"
WORKLOAD = "Workload"
JOB = "Your own job"
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
    if ctx.invoked_subcommand is None:  # a command is missing: a usage error, as in git or Click
        typer.echo(ctx.get_help())
        raise typer.Exit(EXIT_USAGE)


def _complete_workload(incomplete: str) -> list[str]:
    """The registered workloads (a module:Class is the user's own)."""
    return [name for name in REGISTRY if name.startswith(incomplete)]


def _complete_machine(incomplete: str) -> list[str]:
    """Machine types of the catalog (read only when the shell asks)."""
    from orchestrator.spec.catalog import load_catalog

    try:
        names = {m.name for m in load_catalog(None)}
    except CloudprofError:
        return []
    return sorted(n for n in names if n.startswith(incomplete))


@app.command(cls=_Command)
def sweep(
    machine: Annotated[
        list[str] | None,
        typer.Option(
            "--machine",
            "-m",
            help="Machine type (repeatable), e.g. n2-highcpu-80, c6i.large.",
            metavar="TYPE",
            autocompletion=_complete_machine,
            rich_help_panel=SWEEP,
        ),
    ] = None,
    workers: Annotated[
        str | None,
        typer.Option(
            help="Worker counts: 1,2,4,8 or 1-8 or 1-64:x2 (default: powers of two up to the "
            "vCPUs, the vCPUs, one oversubscribed).",
            metavar="COUNTS",
            rich_help_panel=SWEEP,
        ),
    ] = None,
    nodes: Annotated[
        str | None,
        typer.Option(
            help="Scale out: node counts such as 1,2,4 (default 1). Each trial also runs on a "
            "Ray cluster of that many VMs of the machine; needs cloudprof[ray].",
            metavar="COUNTS",
            rich_help_panel=SWEEP,
        ),
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option(
            help=f"Trials per worker count (default: {_DEFAULTS.repeats}).", metavar="N",
            rich_help_panel=SWEEP,
        ),
    ] = None,
    duration: Annotated[
        str | None,
        typer.Option(
            help=f"Time per trial: 5, 30s, 2m (default: {_DEFAULTS.duration_s:g}s).",
            metavar="TIME",
            rich_help_panel=SWEEP,
        ),
    ] = None,
    warmup: Annotated[
        str | None,
        typer.Option(
            help="Untimed warm-up before each trial, e.g. 5s: workers allocate their buffers "
            "before the clock and the memory sampler start (default: none).",
            metavar="T", rich_help_panel=SWEEP,
        ),
    ] = None,
    trial_timeout: Annotated[
        str | None,
        typer.Option(
            help="Stop and fail a trial that runs longer than this, e.g. 600 or 10m "
            "(default: from the plan: 4 x the trial's length + 2 min; a fixed-work --command "
            "job: 4 x its slowest finished trial + 2 min, 1 h before the first).",
            metavar="SECONDS", rich_help_panel=SWEEP,
        ),
    ] = None,
    adaptive: Annotated[
        bool | None,
        typer.Option(
            "--adaptive/--no-adaptive",
            help="Per machine, start at 1, v/4, v and 2v workers and add the counts that narrow "
            "the predicted peak (USL fit) until it is known within ±10% or the grid's trial "
            "count is spent.",
            rich_help_panel=SWEEP,
        ),
    ] = None,
    search: Annotated[
        SearchGoal | None,  # type: ignore[valid-type]
        typer.Option(
            help="Try the candidate machines one at a time, each next one chosen from what "
            "was measured (a Gaussian process, expected improvement), for the lowest cost per "
            "unit or the highest throughput; report the pick and how sure it is.",
            rich_help_panel=SEARCH,
        ),
    ] = None,
    budget: Annotated[
        int | None,
        typer.Option(help="--search tries at most N machines (default: a third of the "
                     "candidates, at least 3).", metavar="N", rich_help_panel=SEARCH),
    ] = None,
    family: Annotated[
        list[str] | None,
        typer.Option(help="--search candidates: catalog family or name prefix, e.g. "
                     "n2-highcpu,c3 (repeatable).", metavar="FAMILY", rich_help_panel=SEARCH),
    ] = None,
    vcpus: Annotated[
        str | None,
        typer.Option(help="--search candidates: vCPUs, e.g. 8-80.", metavar="MIN-MAX",
                     rich_help_panel=SEARCH),
    ] = None,
    max_price: Annotated[
        float | None,
        typer.Option(help="--search candidates: at most this many USD per hour.", metavar="USD",
                     rich_help_panel=SEARCH),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="sweep.toml with any of these options; flags override it.",
            metavar="FILE",
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
    plan: Annotated[
        bool,
        typer.Option(
            "--plan",
            help="Print the plan and its estimated time and cost, then stop: no VM, no "
            "credentials, no input generated, nothing run or written.",
            rich_help_panel=SWEEP,
        ),
    ] = False,
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
            metavar="NAME",
            autocompletion=_complete_workload,
            rich_help_panel=WORKLOAD,
        ),
    ] = None,
    frames: Annotated[
        int | None,
        typer.Option(help="Input frames (Parquet files).", metavar="N", rich_help_panel=WORKLOAD),
    ] = None,
    dim: Annotated[
        int | None, typer.Option(help="Cube side.", metavar="N", rich_help_panel=WORKLOAD)
    ] = None,
    rows: Annotated[
        int | None, typer.Option(help="Rows per frame.", metavar="N", rich_help_panel=WORKLOAD)
    ] = None,
    cols: Annotated[
        int | None,
        typer.Option(help="Columns per frame.", metavar="N", rich_help_panel=WORKLOAD),
    ] = None,
    strategy: Annotated[
        Strategy | None,  # type: ignore[valid-type]
        typer.Option(help="How the cube workload reads its inputs.", rich_help_panel=WORKLOAD),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Input generator seed.", metavar="N", rich_help_panel=WORKLOAD),
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            "-p",
            help="key=value for the workload (repeatable).",
            metavar="KEY=VALUE",
            rich_help_panel=WORKLOAD,
        ),
    ] = None,
    workdir: Annotated[
        str | None,  # not Path: Typer turns '' into the current directory
        typer.Option(
            help="Your project directory, shipped to every machine (honours .gitignore and "
            ".cloudprofignore); trials run in its copy.",
            metavar="DIR", rich_help_panel=JOB,
        ),
    ] = None,
    setup: Annotated[
        str | None,
        typer.Option(
            help="Shell command run in the copy once per (command, workdir, host) and reused "
            "by later sweeps there, e.g. "
            "'pip install -r requirements.txt'.",
            metavar="CMD", rich_help_panel=JOB,
        ),
    ] = None,
    command: Annotated[
        str | None,
        typer.Option(
            help="Profile this command at each worker count; {workers} {vcpus} {trial} "
            "{repeat} and grid names are filled in.",
            metavar="CMD", rich_help_panel=JOB,
        ),
    ] = None,
    shell: Annotated[
        bool | None,
        typer.Option("--shell/--no-shell", help="Run --command through sh -c.",
                     rich_help_panel=JOB),
    ] = None,
    grid: Annotated[
        list[str] | None,
        typer.Option(
            "--grid",
            help="A parameter swept on top of machines x workers (repeatable).",
            metavar="NAME=V1,V2,...", rich_help_panel=JOB,
        ),
    ] = None,
    provider: Annotated[
        ProviderChoice | None,  # type: ignore[valid-type]
        typer.Option(
            help="Where the machines come from (default: each machine's provider in the "
            "catalog, an SSH host's ssh: one sweep may span them).",
            rich_help_panel=CLOUD,
        ),
    ] = None,
    region: Annotated[
        str | None,
        typer.Option(help="Region (default: the catalog's first; one cloud only).",
                     metavar="REGION",
                     rich_help_panel=CLOUD),
    ] = None,
    zone: Annotated[
        str | None,
        typer.Option(help="Zone (sets the region).", metavar="ZONE", rich_help_panel=CLOUD),
    ] = None,
    project: Annotated[
        str | None, typer.Option(help="GCP project.", metavar="ID", rich_help_panel=CLOUD)
    ] = None,
    bucket: Annotated[
        str | None,
        typer.Option(
            help="gs://name, s3://name or a directory for the inputs.", metavar="URL",
            rich_help_panel=CLOUD,
        ),
    ] = None,
    spot: Annotated[
        bool | None,
        typer.Option("--spot/--no-spot", help="Spot/preemptible VMs.", rich_help_panel=CLOUD),
    ] = None,
    hosts: Annotated[
        str | None,  # not Path: Typer turns '' into the current directory
        typer.Option(
            "--hosts", help="TOML file of SSH hosts (provider ssh, or beside cloud machines).",
            metavar="FILE",
            rich_help_panel=CLOUD,
        ),
    ] = None,
    host: Annotated[
        list[str] | None,
        typer.Option(
            "--host", help="An SSH host (repeatable; provider ssh, or beside cloud machines).",
            metavar="USER@ADDRESS[:PORT]", rich_help_panel=CLOUD,
        ),
    ] = None,
    ssh_key: Annotated[
        str | None,  # not Path: Typer turns '' into the current directory
        typer.Option(
            help="Private key for --host (instead of a per-sweep key).", metavar="FILE",
            rich_help_panel=CLOUD,
        ),
    ] = None,
    max_cost: Annotated[
        float | None,
        typer.Option(
            help="Refuse to start when the estimate is above this many USD.", metavar="USD",
            rich_help_panel=LIMITS,
        ),
    ] = None,
    max_peak_memory: Annotated[
        str | None,
        typer.Option(
            help="Memory gate: exit 3 when a trial process peaks above this over its whole "
            "lifetime, loading included (2G, 512MiB); trial:SIZE gates the trial alone.",
            metavar="[trial:]SIZE",
            rich_help_panel=LIMITS,
        ),
    ] = None,
    sample_hz: Annotated[
        float | None,
        typer.Option(
            help=f"Profiling samples per second, {MIN_SAMPLE_HZ:g} to {MAX_SAMPLE_HZ:g} (0: only "
            f"the kernel's peak; default: {_DEFAULTS.sample_hz:g}).",
            metavar="HZ",
            rich_help_panel=LIMITS,
        ),
    ] = None,
    profile: Annotated[
        ProfileKind | None,  # type: ignore[valid-type]
        typer.Option(
            help="Also run one extra profiled trial per worker count: cpu (py-spy: top functions, "
            "~3 % cost), gil (py-spy with native frames: Python / native / GIL-wait shares, why "
            "scaling stops, ~20 % cost) or memory (memray: where the peak comes from). Kept out "
            "of throughput tables.",
            rich_help_panel=LIMITS,
        ),
    ] = None,
    prove_limit: Annotated[
        bool | None,
        typer.Option("--prove-limit", help="A --command job: after its trials, run one more per "
                     "worker count under a memory cgroup limit equal to the memory request; the "
                     "report says whether it ran unchanged or was OOM-killed.",
                     rich_help_panel=LIMITS),
    ] = None,
    find_limit: Annotated[
        bool | None,
        typer.Option("--find-limit", help="As --prove-limit, then bisect the smallest limit the "
                     "job runs under (about 5 more trials per worker count).",
                     rich_help_panel=LIMITS),
    ] = None,
    out: Annotated[
        str | None,  # not Path: Typer turns '' into the current directory
        typer.Option(help=f"Results directory (default: {_DEFAULTS.out}).", metavar="DIR",
                     rich_help_panel=LIMITS),
    ] = None,
) -> None:
    """Run a workload at several worker counts on each machine type and record the results."""
    from orchestrator.spec.config import build_spec, flag_name, load_run_spec

    values: dict[str, Any] = {
        "machines": machine, "workers": workers, "nodes": nodes, "repeats": repeats,
        "duration": duration,
        "warmup": warmup, "trial_timeout": trial_timeout,
        "adaptive": adaptive, "search": _value(search), "budget": budget,
        "family": family, "vcpus": vcpus, "max_price": max_price,
        "workload": workload, "frames": frames,
        "dim": dim, "rows": rows, "cols": cols, "strategy": _value(strategy), "seed": seed,
        "params": param,
        "provider": _value(provider),
        "region": region, "zone": zone, "project": project, "bucket": bucket, "spot": spot,
        "max_cost": max_cost, "max_peak_memory": max_peak_memory, "sample_hz": sample_hz,
        "out": out, "dry_run": dry_run, "hosts_file": hosts, "hosts": host, "ssh_key": ssh_key,
        "workdir": workdir, "setup": setup, "command": command, "shell": shell, "grid": grid,
        "profile": _value(profile), "prove_limit": prove_limit, "find_limit": find_limit,
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
    # prints the plan, then (unless --plan) the report and where the store is
    engine.run_sweep(spec, resume=resume, console=_console(), plan_only=plan)


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
    from orchestrator.spec import catalog as cat

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
    from orchestrator.spec import catalog as cat
    from orchestrator.spec.pricing import refresh as pricing

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
                   f"{done.path} (from {done.source}; fetched {done.rows[0].fetched_at})")
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
        console.print(f"  [{number}] {source}; price date {day}", highlight=False, markup=False)


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
) -> None:
    """Print a run's summary and write report.html, report.md and plots/ into it."""
    reports = _lazy("orchestrator.results.report", "reporting")
    if as_json:
        reports.print_json(run, sys.stdout)
        return
    console = _console()
    publish = _lazy("orchestrator.results.publish", "reporting")
    written = publish.report_run(run, console)
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
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the recommendation as JSON.")
    ] = False,
) -> None:
    """The cheapest measured machine and worker count that meets a deadline, a cost limit
    and memory with a margin; the runner-up, and why every other one lost."""
    from orchestrator.spec.config import parse_duration

    deciding = _lazy("orchestrator.results.recommend", "recommendation")
    deadline_s = parse_duration(deadline, "--deadline") if deadline is not None else None
    if total is not None and total <= 0:
        raise UsageError("--total must be more than 0")
    rec = deciding.recommend_runs(list(runs), deadline_s, max_cost,
                                  deciding.parse_margin(memory_margin), total)
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
    from orchestrator.results.store import recorded_buckets
    from orchestrator.spec.catalog import check_name
    from orchestrator.spec.config import check_bucket, parse_duration, read_config

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
