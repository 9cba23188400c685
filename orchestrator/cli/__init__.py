"""The ``cloudprof`` command line, one module per command or group of commands.

This package is imported by every invocation, including ``--help``, so its modules
import only Typer/Click and cloudprof's light modules at the top; the sweep
engine, reports, pandas and the cloud SDKs are imported inside the command
that needs them. ``main`` (``entry.py``) turns every ``CloudprofError`` and every
Click usage error into one ``error: ...`` line on stderr and the documented exit code.
The commands are registered here, in the order ``cloudprof --help`` lists them.
"""

from __future__ import annotations

from orchestrator.cli.catalog import catalog_app
from orchestrator.cli.cleanup import _CLEANUP_HELP, cleanup
from orchestrator.cli.conventions import _Command, _lazy
from orchestrator.cli.entry import main
from orchestrator.cli.reports import compare, export, recommend, report
from orchestrator.cli.root import app
from orchestrator.cli.runs import runs
from orchestrator.cli.sweep import sweep

__all__ = ["_lazy", "app", "main"]

app.command(cls=_Command)(sweep)
app.add_typer(catalog_app, name="catalog")
for _command in (report, compare, export, recommend, runs):
    app.command(cls=_Command)(_command)
app.command(cls=_Command, help=_CLEANUP_HELP)(cleanup)
