"""What every ``cloudprof`` command shares: help and usage as Click writes them, choices from
their one definition, the console, lazy imports, JSON for scripts.

Imported by every invocation, ``--help`` included, so it imports only Typer and cloudprof's
light modules at the top; rich, the reports and the SDKs are imported on use.
"""

from __future__ import annotations

import copy
import enum
import importlib
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

import typer

from orchestrator.errors import CloudprofError
from orchestrator.spec.spec import SweepSpec

if TYPE_CHECKING:
    from rich.console import Console


def _choices(name: str, values: object) -> type[enum.Enum]:
    """An Enum of the names another module defines, so that ``--help`` lists them and the
    shell completes them, from that module's one definition."""
    return enum.Enum(name, {str(v): str(v) for v in values}, type=str)  # type: ignore[return-value]


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


def _print_json(data: Any) -> None:
    """JSON for scripts on stdout: one document, keys as stored, no colours or wrapping."""
    import json

    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _question(target: str | None, size: str | None, total: float | None) -> Any:
    """--target/--size/--total as a ``whole_job.Question`` (None when none given)."""
    if target is None and size is None and total is None:
        return None
    return _lazy("orchestrator.results.whole_job", "forecasts").question(target, size, total)
