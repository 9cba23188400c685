"""A job as the spec states it: the command line's placeholders and the workdir's size limit.

Checked when the spec is, before anything is planned or paid for; the engine's
``jobs`` module packs and ships the workdir under the same limit, and the planner
splits the command with the same rule.
"""

from __future__ import annotations

import shlex

from orchestrator import settings
from orchestrator.errors import UsageError

MAX_BYTES_ENV = settings.MAX_WORKDIR.name
MAX_BYTES = 256 * 2**20  # the archive goes to every VM: a job's code and small data, not a lake


def max_bytes() -> int:
    """The size limit: ``$CLOUDPROF_MAX_WORKDIR`` (a size such as 512M) or 256 MiB."""
    text = settings.MAX_WORKDIR.get()
    if not text:
        return MAX_BYTES
    from orchestrator.spec.values import parse_size

    return parse_size(text, MAX_BYTES_ENV)


def known_placeholders(grid: dict[str, list[str]]) -> list[str]:
    from workloads.job import BUILTIN_PLACEHOLDERS

    return [*BUILTIN_PLACEHOLDERS, *grid]


def check_command(command: str, shell: bool, grid: dict[str, list[str]]) -> list[str]:
    """The command's words (shlex-split unless ``shell``), every placeholder known.

    Raises UsageError before anything is planned or paid for.
    """
    from workloads.job import JobError, check_placeholders

    try:
        words = [command] if shell else shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"--command: cannot split {command!r}: {exc}") from None
    if not words or not words[0].strip():
        raise UsageError("--command: empty command")
    try:
        check_placeholders(command, known_placeholders(grid))
    except JobError as exc:
        raise UsageError(f"--command: {exc}") from None
    return words
