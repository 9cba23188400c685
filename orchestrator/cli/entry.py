"""The console script's entry point: every ``CloudprofError`` and every Click usage error
becomes one ``error: ...`` line on stderr and the documented exit code, a Ctrl-C exit 130."""

from __future__ import annotations

import sys
import threading
from typing import Any

import typer

from orchestrator.cli.root import app
from orchestrator.engine import signals
from orchestrator.errors import EXIT_INTERRUPTED, EXIT_USAGE, CloudprofError, interrupt_again


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
