"""The live sweep display: one bar per machine, its current trial and units/s.

The running trial's column shows its elapsed time against its limit and, when
it goes quiet, how long it has produced no output (or, for a job that counts
units, no units): a stuck trial is visible before its limit stops it.

The engine's per-machine threads call into one :class:`SweepProgress`; rich's
``Progress`` does its own locking, and the units/s figure comes from the runner's
progress lines (``workloads.protocol.parse_progress``) as they stream in, so a
user sees a stalled trial while it stalls rather than after it ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from orchestrator.formatting import fmt_bytes
from workloads.protocol import parse_progress

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

    from orchestrator.plan.planner import TrialPlan


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def _count_column() -> Any:
    """Done/total of a task: trials for a machine, MiB for a transfer (``unit="bytes"``)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class CountColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            total = task.total or 0
            if task.fields.get("unit") == "bytes":
                return Text(f"{_mib(task.completed)}/{_mib(total)} MiB", style="progress.download")
            return Text(f"{int(task.completed)}/{int(total)}", style="progress.download")

    return CountColumn()


STALL_S = 10.0  # progress lines come once a second: this long without one is worth showing


class RunningTrial:
    """What the trial column shows while a trial runs, worked out at each refresh: its
    elapsed time against its limit, and how long it has gone without output or without
    units, so that a stuck trial shows it while it is stuck (not in the report, later)."""

    def __init__(self, label: str, limit_s: float | None, expects_units: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.limit_s, self.expects_units = label, limit_s, expects_units
        self.clock = clock
        self.started = self.last_line = self.units_at = clock()
        self.units = 0.0

    def saw(self, units: float | None) -> None:
        """A progress line arrived, with the trial's units so far."""
        now = self.clock()
        self.last_line = now
        if units is not None and units > self.units:
            self.units, self.units_at = units, now
            self.expects_units = True  # a job that reported units is expected to go on

    def text(self) -> tuple[str, str | None]:
        """(label and elapsed time against the limit, a warning or None)."""
        now = self.clock()
        elapsed = now - self.started
        limit = f" of {self.limit_s:,.0f}s" if self.limit_s else ""
        shown = f"{self.label} {elapsed:,.0f}s{limit}"
        silent = now - self.last_line
        if silent >= STALL_S:
            return shown, f"no output for {silent:,.0f}s"
        stalled = now - self.units_at
        if self.expects_units and stalled >= STALL_S:
            return shown, f"no progress for {stalled:,.0f}s"
        return shown, None


def _trial_column() -> Any:
    """The running trial: label, elapsed time of limit, and a stall warning in yellow."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class TrialColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            running = task.fields.get("running")
            if not isinstance(running, RunningTrial):
                return Text(str(task.fields.get("trial", "")))
            shown, warning = running.text()
            out = Text(shown)
            if warning:
                out.append(f" {warning}", style="yellow")
            return out

    return TrialColumn()


class _Counter:
    """Counts work into a rich task (from any thread) and keeps its average rate up to date."""

    def __init__(self, progress: Progress, task: TaskID, unit: str) -> None:
        self._progress, self._task, self._unit = progress, task, unit
        self._lock = threading.Lock()
        self._done = 0.0
        self._started = time.monotonic()

    def add(self, amount: float) -> None:
        with self._lock:
            self._done += amount
            done = self._done
        self._progress.update(self._task, completed=done, rate=self._rate(done))

    def set(self, done: float) -> None:
        with self._lock:
            self._done = done
        self._progress.update(self._task, completed=done, rate=self._rate(done))

    def _rate(self, done: float) -> str:
        if self._unit != "bytes":
            return ""
        elapsed = time.monotonic() - self._started
        return f"{done / 2**20 / elapsed:,.1f} MiB/s" if elapsed > 0 else ""

    def finish(self, state: str) -> None:
        self._progress.update(self._task, state=state)


@contextlib.contextmanager
def counting(console: Console, label: str, total: float, unit: str = "") -> Iterator[_Counter]:
    """A bar of its own for long work before the sweep's display starts (inputs generated)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=24),
                  _count_column(), TextColumn("[cyan]{task.fields[rate]}"),
                  TextColumn("[dim]{task.fields[state]}"), TimeElapsedColumn(),
                  console=console, refresh_per_second=4, transient=False) as progress:
        task = progress.add_task(label, total=total, unit=unit, rate="", state="")
        yield _Counter(progress, task, unit)


class SweepProgress:
    """Context manager around a rich Progress; a no-op display when ``console`` is None."""

    def __init__(self, console: Console | None) -> None:
        self.console = console
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._done: dict[str, int] = {}
        self._duration: dict[str, float] = {}
        self._running: dict[str, RunningTrial] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> SweepProgress:
        if self.console is None:
            return self
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            _count_column(),
            _trial_column(),
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
                    label, total=total, trial="", running=None, rate="", state="waiting"
                )

    def transfer(self, label: str, total_bytes: int) -> _Counter | None:
        """A bar counting bytes (staging the inputs), with its MiB/s; None with no display."""
        if self._progress is None:
            return None
        task = self._progress.add_task(label, total=total_bytes, unit="bytes", trial="",
                                       running=None, rate="", state="uploading")
        return _Counter(self._progress, task, "bytes")

    def _update(self, key: str, **fields: Any) -> None:
        if self._progress is not None and key in self._tasks:
            self._progress.update(self._tasks[key], **fields)

    def state(self, key: str, text: str) -> None:
        self._update(key, state=text)

    def trial_started(self, key: str, trial: TrialPlan, duration_s: float,
                      limit_s: float | None = None) -> None:
        """``limit_s``: the trial's time limit (engine/timeouts.py), shown next to its time."""
        # a --command job need not report units (one complete run): only a workload must
        running = RunningTrial(f"w={trial.workers} r{trial.repeat}", limit_s,
                               expects_units=not trial.request.is_command)
        with self._lock:
            self._duration[key] = max(duration_s, 0.001)
            self._running[key] = running
            done = self._done.get(key, 0)
        self._update(key, trial=running.label, running=running, rate="", state="running",
                     completed=done)

    def line(self, key: str, line: str) -> None:
        """One line of the runner's output: progress lines move the bar and the rate."""
        parsed = parse_progress(line)
        if parsed is None:
            return
        with self._lock:
            done = self._done.get(key, 0)
            frac = min(parsed.get("t", 0.0) / self._duration.get(key, 1.0), 0.99)
            running = self._running.get(key)
        if running is not None:
            running.saw(parsed.get("units"))
        rate = parsed.get("units_per_s")
        if running is not None and not running.expects_units:
            rate = None  # a job that counts no units: its time column is its progress
        self._update(key, completed=done + frac,
                     rate="" if rate is None else f"{rate:,.1f} units/s",
                     state=f"rss {fmt_bytes(parsed.get('rss_bytes'))}")

    def trial_done(self, key: str, row: dict[str, Any]) -> None:
        with self._lock:
            self._done[key] = self._done.get(key, 0) + 1
            done = self._done[key]
            self._running.pop(key, None)
        ups = row.get("units_per_s")
        status = row.get("status")
        self._update(key, completed=done, running=None, state=str(status))
        over = " (oversubscribed)" if row.get("oversubscribed") else ""
        # units/s, as in the live rate and the report (1 unit = 1 cube...); a fixed-work job
        # (no units) measures its time to complete, the report's time/run
        work = (f"{row['seconds']:,.2f} s to complete" if row.get("job_kind") == "fixed_work"
                and isinstance(row.get("seconds"), int | float) else f"{ups or 0:,.1f} units/s")
        if status == "ok":
            self.log(f"  [green]✓[/green] {row['trial_id']}: {work},"
                     f" peak {fmt_bytes(row.get('peak_rss_bytes'))}{over}")
        else:
            self.log(f"  [red]✗[/red] {row['trial_id']}: {status}: {row.get('error') or ''}")

    def machine_done(self, key: str, text: str) -> None:
        with self._lock:
            self._running.pop(key, None)
        self._update(key, trial="", running=None, rate="", state=text)

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
