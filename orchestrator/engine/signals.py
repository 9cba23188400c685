"""The control plane's one signal policy: every way a terminal ends a process tears down.

Ctrl-C (SIGINT), ``kill`` (SIGTERM), a closed terminal or a dropped SSH session (SIGHUP)
and Ctrl-\\ (SIGQUIT) all mean "stop now": each raises what Ctrl-C raises, in the main
thread, so that one teardown path deletes every VM, key pair and firewall rule, settles
sweep.json and exits 130. Left at their defaults, SIGHUP and SIGQUIT would kill the
process outright (SIGQUIT with a core dump) and leave billing VMs behind.

The terminal that sent SIGHUP is usually gone, and a sweep piped to ``head`` outlives its
reader: a write to stdout or stderr then fails (EIO, EPIPE). :func:`tolerate_closed_output`
makes such writes vanish, so that neither the teardown nor the exit code depends on
whether anyone still reads the output.

Two layers use it: the CLI's entry point (:func:`as_interrupt`, around every command)
and the sweep engine (:func:`sweep_signals`, which defers a signal during a sweep.json
write and turns later ones into a "still tearing down" warning).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from orchestrator.errors import interrupt_again

# Signals that end the control plane through its teardown (those this platform has).
TEARDOWN_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
    if hasattr(signal, name))


class Terminated(KeyboardInterrupt):
    """A teardown signal other than SIGINT, raised as what Ctrl-C raises so that all of
    them take the same path; ``signum`` says which one it was."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def interrupt_for(signum: int) -> KeyboardInterrupt:
    """What a teardown signal raises in the main thread."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def signum_of(exc: BaseException) -> int:
    """The signal an interrupt stands for (SIGINT for a plain KeyboardInterrupt)."""
    return exc.signum if isinstance(exc, Terminated) else int(signal.SIGINT)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _install(handler: Any) -> dict[int, Any]:
    """Set ``handler`` for every teardown signal; the previous handlers."""
    return {sig: signal.signal(sig, handler) for sig in TEARDOWN_SIGNALS}


def _restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def as_interrupt(restore: bool = True) -> Iterator[None]:
    """Every teardown signal raises an interrupt while the block runs (main thread only;
    elsewhere Python cannot install handlers and the block runs as is). ``restore=False``
    leaves the handlers the block ended with (the process's entry point ignores signals
    from the moment its exit code is known: restoring the defaults would reopen a window
    in which a late SIGHUP kills it with that code unsaid)."""
    if not _on_main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise interrupt_for(signum)

    previous = _install(handler)
    try:
        yield
    finally:
        if restore:
            _restore(previous)


def ignore_all() -> None:
    """The exit code is decided and the teardown done: a late signal changes nothing."""
    _install(signal.SIG_IGN)


# ---------------------------------------------------------------------- the sweep's own


class SweepSignals:
    """Teardown signals while a sweep runs: the first raises an interrupt in the main
    thread; any later one only warns, so nothing after the first can cut the teardown or
    the final status write short.

    Inside :meth:`deferred` (a sweep.json write) even the first one waits until the
    block ends, so a status write is never lost halfway.
    """

    def __init__(self) -> None:
        self.raised = False  # the sweep is being interrupted: later signals only warn
        self.signum: int | None = None  # the first teardown signal received
        self.pending: int | None = None
        self.depth = 0
        self.warn: Callable[[], None] | None = None  # set by the engine once it runs

    def handle(self, signum: int, frame: Any) -> None:
        if self.raised:
            if self.warn is not None:
                self.warn()
            return
        if self.depth:
            self.pending = signum
            return
        self._raise(signum)

    def _raise(self, signum: int) -> None:
        self.raised = True
        self.signum = signum
        raise interrupt_for(signum)

    def unraisable(self, hook: Callable[[Any], None], unraisable: Any) -> None:
        """The interrupt raised inside a finalizer or ``__del__`` (garbage collection ran
        just then), where Python can only print it and go on: the sweep would carry on and
        later signals only warn. Deliver it again, on the main thread's next step."""
        exc = unraisable.exc_value
        if isinstance(exc, KeyboardInterrupt) and self.raised:
            self.raised = False
            interrupt_again(signum_of(exc))
            return
        hook(unraisable)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        if not _on_main_thread():
            yield  # signals only ever interrupt the main thread
            return
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending is not None and not self.raised:
                signum, self.pending = self.pending, None
                self._raise(signum)


_CURRENT: SweepSignals | None = None  # the running sweep's, in this process


def deferred() -> contextlib.AbstractContextManager[None]:
    """What RunStore wraps its sweep.json writes in (a no-op outside a sweep)."""
    return _CURRENT.deferred() if _CURRENT is not None else contextlib.nullcontext()


def current() -> SweepSignals | None:
    """The running sweep's signal state, if a sweep runs in this process."""
    return _CURRENT


@contextlib.contextmanager
def sweep_signals() -> Iterator[SweepSignals]:
    """Install :class:`SweepSignals` for every teardown signal (main thread only)."""
    global _CURRENT
    signals = SweepSignals()
    if not _on_main_thread():
        yield signals
        return
    previous = _install(signals.handle)
    hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(signals.unraisable, hook)
    _CURRENT = signals
    try:
        yield signals
    finally:
        _CURRENT = None
        sys.unraisablehook = hook
        _restore(previous)


# ---------------------------------------------------------------------- a closed terminal

# What a write to a reader that went away fails with: its pipe closed (EPIPE), its
# terminal hung up (EIO), its socket reset.
_GONE = {errno.EPIPE, errno.EIO, errno.ECONNRESET, errno.ENXIO}


class _Tolerant:
    """A text stream whose writes vanish once its reader is gone, instead of raising into
    whatever was printing (rich answers a broken pipe with ``SystemExit(1)``; a teardown's
    progress line must not end the teardown). The first failure points the stream's file
    descriptor at /dev/null, so the interpreter's last flush at exit succeeds too."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._gone = False

    def _lost(self, exc: OSError) -> None:
        if exc.errno not in _GONE:
            raise exc
        self._gone = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)

    def write(self, text: str) -> int:
        if self._gone:
            return len(text)
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._lost(exc)
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self._gone:
            with contextlib.suppress(OSError, ValueError):
                self._stream.flush()  # into /dev/null now: empties the buffer
            return
        try:
            self._stream.flush()
        except OSError as exc:
            self._lost(exc)
            with contextlib.suppress(OSError, ValueError):
                self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def tolerate_closed_output() -> None:
    """Make writes to stdout and stderr survive their reader going away (see
    :class:`_Tolerant`); for the process's entry point only, never an in-process call."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Tolerant):
            setattr(sys, name, _Tolerant(stream))
