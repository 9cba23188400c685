"""The live sweep display: one bar per machine, its current trial and units/s.

The engine's per-machine threads call into one :class:`SweepProgress`; rich's
``Progress`` does its own locking, and the units/s figure comes from the runner's
progress lines (``workloads.protocol.parse_progress``) as they stream in, so a
user sees a stalled trial while it stalls rather than after it ends.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from workloads.protocol import parse_progress

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

    from orchestrator.plan.planner import TrialPlan


def _gib(n: float | None) -> str:
    return "-" if not n else f"{n / 2**30:.2f} GiB"


class SweepProgress:
    """Context manager around a rich Progress; a no-op display when ``console`` is None."""

    def __init__(self, console: Console | None) -> None:
        self.console = console
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._done: dict[str, int] = {}
        self._duration: dict[str, float] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> SweepProgress:
        if self.console is None:
            return self
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[trial]}"),
            TextColumn("[cyan]{task.fields[rate]}"),
            TextColumn("[dim]{task.fields[state]}"),
            TimeElapsedColumn(),
            console=self.console,
            refresh_per_second=4,
        )
        self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()

    def add_machine(self, key: str, label: str, total: int) -> None:
        with self._lock:
            self._done[key] = 0
            if self._progress is not None:
                self._tasks[key] = self._progress.add_task(
                    label, total=total, trial="", rate="", state="waiting"
                )

    def _update(self, key: str, **fields: Any) -> None:
        if self._progress is not None and key in self._tasks:
            self._progress.update(self._tasks[key], **fields)

    def state(self, key: str, text: str) -> None:
        self._update(key, state=text)

    def trial_started(self, key: str, trial: TrialPlan, duration_s: float) -> None:
        with self._lock:
            self._duration[key] = max(duration_s, 0.001)
            done = self._done.get(key, 0)
        self._update(key, trial=f"w={trial.workers} r{trial.repeat}", rate="", state="running",
                     completed=done)

    def line(self, key: str, line: str) -> None:
        """One line of the runner's output: progress lines move the bar and the rate."""
        parsed = parse_progress(line)
        if parsed is None:
            return
        with self._lock:
            done = self._done.get(key, 0)
            frac = min(parsed.get("t", 0.0) / self._duration.get(key, 1.0), 0.99)
        rate = parsed.get("units_per_s")
        self._update(key, completed=done + frac,
                     rate="" if rate is None else f"{rate:,.1f} units/s",
                     state=f"rss {_gib(parsed.get('rss_bytes'))}")

    def trial_done(self, key: str, row: dict[str, Any]) -> None:
        with self._lock:
            self._done[key] = self._done.get(key, 0) + 1
            done = self._done[key]
        ups = row.get("units_per_s")
        status = row.get("status")
        self._update(key, completed=done, state=str(status))
        over = " (oversubscribed)" if row.get("oversubscribed") else ""
        if status == "ok":
            unit = row.get("unit") or "units"
            self.log(f"  [green]✓[/green] {row['trial_id']}: {ups or 0:,.1f} {unit}/s,"
                     f" peak {_gib(row.get('peak_rss_bytes'))}{over}")
        else:
            self.log(f"  [red]✗[/red] {row['trial_id']}: {status}: {row.get('error') or ''}")

    def machine_done(self, key: str, text: str) -> None:
        self._update(key, trial="", rate="", state=text)

    def tearing_down(self) -> None:
        """Shown on Ctrl-C/SIGTERM: the user must see that VMs are being deleted."""
        for key in list(self._tasks):
            self._update(key, state="[bold red]tearing down")
        self.log("[bold red]Interrupted: tearing down every VM of this sweep "
                 "(finished trials are already saved)...")

    def log(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, highlight=False)
        elif self.console is not None:
            self.console.print(text, highlight=False)
