"""Ctrl-C ends cloudprof's own processes on a host quietly: no traceback, exit by SIGINT.

Why: the runner, its sampler, the warm runner and the transfer processes install their
signal handling only once their imports are done, and the runner hands SIGINT back at
its very end. A Ctrl-C (or the sweep stopping them) in those windows raised
KeyboardInterrupt through dozens of import frames, and the sweep showed that
traceback as the process's output. Here an uncaught KeyboardInterrupt, or one that
lands in a finalizer, prints nothing: the interpreter still dies of SIGINT (status
130 in a shell, -2 to ``Popen``), so whoever waits on the process sees what it sees
for any program stopped by Ctrl-C.

Only a process started as ``python -m workloads.X`` or ``python -c ...`` (the
sampler's and the warm client's programs) gets this, from ``workloads/__init__``,
before anything heavy is imported: the package imported into another program (the
control plane, a test) leaves that program's hooks alone.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing is not imported at run time: the sampler imports this too
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any


def _excepthook(kind: type[BaseException], value: BaseException,
                tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        return  # the interpreter then exits by re-raising SIGINT on itself
    sys.__excepthook__(kind, value, tb)


def _unraisablehook(unraisable: Any) -> None:
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        return  # a Ctrl-C that landed in a finalizer or at shutdown: nothing to say
    sys.__unraisablehook__(unraisable)


def quiet() -> None:
    """An uncaught KeyboardInterrupt ends this process without a traceback."""
    sys.excepthook = _excepthook
    sys.unraisablehook = _unraisablehook


def started_as_program() -> bool:
    """Whether this package is being imported to run one of its modules as the program
    (``-m``: ``sys.argv[0]`` is "-m" while the module is looked up) or from ``-c``, and
    not by the control plane (which has its own policy: ``orchestrator.engine.signals``)."""
    return sys.argv[:1] in (["-m"], ["-c"]) and "orchestrator" not in sys.modules
