"""Errors a user can act on, each with its documented exit code.

Anything raised as a ``CloudprofError`` is shown by the CLI as one line
(``error: ...``) and exits with ``exit_code``; anything else is a bug and keeps
its traceback. Provider code translates SDK exceptions into these classes so
that the sweep engine can decide (go on with the next machine, retry, stop).
"""

from __future__ import annotations

import os
import signal
import threading

# Exit codes (docs/reference/commands.md "Exit codes" lists them).
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_MEMORY_GATE = 3
EXIT_BUDGET = 4
EXIT_CREDENTIALS = 5
EXIT_PARTIAL = 6  # the sweep finished but some machines or trials failed
EXIT_TEARDOWN = 7  # a VM or what was made for it could not be deleted: it may still bill
EXIT_INTERRUPTED = 130


class CloudprofError(Exception):
    """Base class: a one-line message for the user and an exit code."""

    exit_code = EXIT_ERROR

    def __str__(self) -> str:  # always one line, whatever a cloud SDK put in it
        return " ".join(super().__str__().split())


class UsageError(CloudprofError):
    """Bad flags, config, machine names, worker lists, paths."""

    exit_code = EXIT_USAGE


class UnknownMachineError(UsageError):
    """A machine type not in the catalog; the message suggests the nearest names."""


class MemoryGateError(CloudprofError):
    """A trial peaked above ``--max-peak-memory``."""

    exit_code = EXIT_MEMORY_GATE


class BudgetError(CloudprofError):
    """The estimated cost is above ``--max-cost``."""

    exit_code = EXIT_BUDGET


class CredentialsError(CloudprofError):
    """No usable credentials; the message says how to set them up."""

    exit_code = EXIT_CREDENTIALS


class ProviderError(CloudprofError):
    """A cloud call failed for one machine; the sweep goes on with the others."""


class CapacityError(ProviderError):
    """The zone has no capacity (ZONE_RESOURCE_POOL_EXHAUSTED, InsufficientInstanceCapacity).

    Worth one try in the next zone of the region: ``zone`` is the zone that
    refused (None when the cloud chose it) and ``next_zones`` the other zones
    of the region that offer the machine type, best first (may be empty).
    """

    def __init__(
        self, message: str, *, zone: str | None = None, next_zones: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.zone = zone
        self.next_zones = tuple(next_zones)


class QuotaError(ProviderError):
    """A quota is exhausted; retrying does not help."""


class PermissionDeniedError(ProviderError):
    """The credentials lack a permission; infra/iam lists what is needed."""


class UnreachableError(ProviderError):
    """A host did not answer on SSH in time, or refused the connection."""


class HostKeyError(ProviderError):
    """A host presented an SSH host key other than the one expected, or an unknown one.

    Never retried blindly and never auto-accepted: the message says how to check
    and add the key.
    """


class ConnectionLostError(ProviderError):
    """An SSH connection dropped mid-command or mid-copy; reconnecting and retrying may work.

    Distinct from RemoteCommandError (the command itself failed), so the sweep
    engine retries the trial on the same VM (after fetching a result the VM may
    already have put in the bucket).
    """


class RemoteCommandError(ProviderError):
    """A command on a host failed (bootstrap, fetch); the message has its last stderr line."""


class BucketError(CloudprofError):
    """Invalid bucket name, missing bucket, or no permission on it."""


class InputDataError(UsageError):
    """Corrupt, truncated or missing input files, or frames of different shapes."""


class SweepInterruptedError(CloudprofError):
    """Ctrl-C or SIGTERM: every VM was torn down and finished trials are in the store.

    The message says how to resume; ``run_dir`` is the store (None before it existed).
    """

    exit_code = EXIT_INTERRUPTED

    def __init__(self, message: str, run_dir: object = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir


class PartialSweepError(CloudprofError):
    """The sweep finished and wrote its report, but some machines or trials failed."""

    exit_code = EXIT_PARTIAL

    def __init__(self, message: str, run_dir: object = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir


class TeardownError(CloudprofError):
    """Deleting a VM (or its key pair, security group, firewall rule) failed after retries.

    The loudest error there is: something may still be billing. The message names each
    resource left and the ``cloudprof cleanup`` command that deletes them; it wins over
    every other outcome of the sweep (partial, memory gate) because it costs money.
    """

    exit_code = EXIT_TEARDOWN

    def __init__(self, message: str, run_dir: object = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir


class ResultsWriteError(CloudprofError):
    """The results directory stopped taking writes mid-sweep (disk full, permissions).

    The sweep stops, tears down, and keeps the bucket's copy of every result; the
    message says what failed and the command that resumes.
    """

    def __init__(self, message: str, run_dir: object = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir


def one_line(exc: BaseException) -> str:
    """An exception as the single line an error message may be (whitespace folded)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def interrupt_again(signum: int = signal.SIGINT, delay_s: float = 0.05) -> None:
    """Send this process ``signum`` again a moment later, from another thread.

    For a Ctrl-C that landed in a finalizer or ``__del__`` (garbage collection ran just
    then), which Python can only print as "Exception ignored" and drop: the CLI's and the
    sweep's ``sys.unraisablehook`` call this. Sent from the hook itself, the handler would
    run inside the hook and be swallowed again.

    Another signal can land while the timer's thread starts (a barrage as a sweep ends):
    its interrupt would escape the hook, which Python prints as a traceback. That newest
    signal is sent instead (twice at worst, which the handlers take as a repeat)."""
    while True:
        try:
            again = threading.Timer(delay_s, os.kill, (os.getpid(), signum))
            again.daemon = True
            again.start()
            return
        except KeyboardInterrupt as landed:  # a Terminated carries its signal
            signum = getattr(landed, "signum", signal.SIGINT)
