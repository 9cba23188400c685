"""The ``cloudprof`` group: its help, ``--version``, and a missing command as a usage error."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator import __version__
from orchestrator.cli.conventions import _Group
from orchestrator.errors import EXIT_USAGE

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
