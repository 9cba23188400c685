"""What ``cloudprof cleanup`` prints: the table of leftovers, the selection in words
and the command that repeats it. Kept apart from the listing and deleting
(``cleanup.py``), which decide; this only shows."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from orchestrator.providers.base import Resource
from orchestrator.results.runs import fmt_age

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.engine.cleanup import Buckets, Leftover


def resource_table(items: list[Leftover], now: float, title: str | None = None) -> object:
    """A rich table: provider, kind, id/name, zone/region, sweep, created, expires, state."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in ("provider", "kind", "id / name", "zone / region", "sweep", "created",
                   "expires", "state"):
        table.add_column(column, overflow="fold")
    for item in items:
        res = item.resource
        table.add_row(*(escape(cell) for cell in (
            item.provider, res.kind, id_and_name(res), res.zone or res.region or "global",
            res.sweep_id or "-", _when(res.created_at, now), _when(res.expires_at, now),
            res.state or "-",
        )))
    return table


def id_and_name(res: Resource) -> str:
    return res.id if not res.name or res.name == res.id else f"{res.id} ({res.name})"


def _when(stamp: float | None, now: float) -> str:
    if stamp is None:
        return "-"
    text = dt.datetime.fromtimestamp(stamp, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    delta = now - stamp
    return f"{text} ({_span(delta)} ago)" if delta >= 0 else f"{text} (in {_span(-delta)})"


_span = fmt_age  # one age format for `cloudprof runs` and `cloudprof cleanup`


def _duration_arg(seconds: float) -> str:
    """``seconds`` as --older-than accepts it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def selection(older_than_s: float | None, sweep_id: str | None,
               ended: set[str] | frozenset[str] = frozenset()) -> str:
    parts = []
    if sweep_id:
        parts.append(f"of sweep {sweep_id}")
    if older_than_s is not None:
        parts.append(f"created more than {_duration_arg(older_than_s)} ago")
    elif not sweep_id:
        parts.append("past their expiry")
        if ended:
            parts.append("or of a sweep no longer running")
    return " ".join(parts)


def repeat_command(provider: str | None, older_than_s: float | None, sweep_id: str | None,
             buckets: Buckets) -> str:
    import shlex

    argv = ["cloudprof", "cleanup"]
    if provider:
        argv += ["--provider", provider]
    if older_than_s is not None:
        argv += ["--older-than", _duration_arg(older_than_s)]
    if sweep_id:
        argv += ["--sweep", sweep_id]
    return " ".join(shlex.quote(a) for a in [*argv, *buckets.argv()])


def count(items: list[Leftover]) -> str:
    return f"{len(items)} resource" + ("" if len(items) == 1 else "s")


def say_line(console: Console, text: str) -> None:
    """One plain line: no markup (cloud messages hold brackets), never wrapped."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)
