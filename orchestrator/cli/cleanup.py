"""``cloudprof cleanup``: which buckets and runs to look in, from the flags, ``sweep.toml``
and the runs under ``--out``; the listing and deleting is ``engine/cleanup.py``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.conventions import _DEFAULTS, _choices, _console, _lazy, _value
from orchestrator.errors import UsageError

CleanupProvider = _choices("CleanupProvider", ("gcp", "aws"))


_CLEANUP_HELP = (
    "List (and with --yes delete) leftover resources carrying cloudprof's labels.\n\n"
    "Due by default: what is past its expiry label, and every instance, key pair, security "
    "group and firewall rule of a sweep whose run directory (under --out) no process is "
    "running, a killed one included (its sweep.json may still say running; the run's lock "
    "tells). A sweep running here deletes its own; one with no run directory here waits "
    "for its expiry. Bucket prefixes keep their retention (--resume reads them)."
)


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
