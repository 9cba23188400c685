"""``cloudprof runs``: one line per run under a results directory, read from the store.

Read-only: a listing never writes into a run (``RunStore.open`` would create a
missing trials table), never takes a run's lock, and a run it cannot read is
listed as such rather than stopping the listing — a directory of runs is where
half-written and foreign directories end up.
"""

from __future__ import annotations

import json
import statistics
import time
from calendar import timegm
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.results.store import DONE_STATUSES, SWEEP_FILE, TRIALS_FILE, compact_parts


@dataclass
class Best:
    """The fastest machine × worker count of a run: median units/s over its ok repeats.

    A fixed-work job (no units reported: one complete run per trial) is fastest where
    its median time to complete is shortest; ``rate`` is then runs/h (3600 / that time)
    and ``units_per_s`` one run over that time, as the report has them.
    """

    machine: str
    workers: int
    units_per_s: float
    repeats: int
    measure: str = "units/s"  # or "runs/h": the unit of ``rate``
    rate: float | None = None  # in ``measure``: units/s, or runs/h
    seconds_per_run: float | None = None  # a fixed-work job's median time to complete


@dataclass
class RunSummary:
    """What ``cloudprof runs`` shows of one run (``--json`` prints these fields)."""

    id: str
    path: str
    status: str  # as recorded in sweep.json; "unreadable" when it cannot be read
    machines: list[str] = field(default_factory=list)
    trials_planned: int = 0
    trials_ok: int = 0
    trials_failed: int = 0  # recorded with a status other than ok
    best: Best | None = None
    estimated_cost_usd: float | None = None  # the plan's estimate at launch, not a bill
    dry_run: bool = False
    created_at: str | None = None
    age_s: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.best is not None and self.best.measure == "units/s":  # its keys as they were
            for name in ("measure", "rate", "seconds_per_run"):
                del out["best"][name]
        return out


def list_runs(out: Path, *, now: float | None = None) -> list[RunSummary]:
    """Every run directly under ``out`` (a directory holding sweep.json), newest first."""
    out = Path(out)
    if not out.is_dir():
        return []
    now = time.time() if now is None else now
    runs = [read_run(d, now=now) for d in out.iterdir() if (d / SWEEP_FILE).is_file()]
    return sorted(runs, key=lambda r: (r.created_at or "", r.id), reverse=True)


def read_run(run_dir: Path, *, now: float | None = None) -> RunSummary:
    """One run's summary; problems reading it become ``status="unreadable"`` and ``error``."""
    run = RunSummary(id=run_dir.name, path=str(run_dir), status="unreadable")
    try:
        sweep = json.loads((run_dir / SWEEP_FILE).read_text(encoding="utf-8"))
        if not isinstance(sweep, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        run.error = f"{SWEEP_FILE}: {exc}"
        return run
    run.id = str(sweep.get("sweep_id") or run_dir.name)
    run.status = str(sweep.get("status") or "unknown")
    run.dry_run = bool(sweep.get("dry_run"))
    plan = sweep.get("plan") if isinstance(sweep.get("plan"), dict) else {}
    vms = [vm for vm in plan.get("vms") or [] if isinstance(vm, dict)]
    run.machines = [str((vm.get("machine") or {}).get("name", "?")) for vm in vms]
    run.trials_planned = sum(len(vm.get("trials") or []) for vm in vms)
    cost = plan.get("estimated_total_cost_usd")
    run.estimated_cost_usd = float(cost) if isinstance(cost, int | float) else None
    run.created_at = sweep.get("created_at")
    created = _epoch(run.created_at)
    if created is not None:
        run.age_s = max(0.0, (time.time() if now is None else now) - created)
    try:
        compact_parts(run_dir)  # a running or crashed sweep's latest trials
        rows = _trial_rows(run_dir / TRIALS_FILE)
    except Exception as exc:  # pyarrow raises many kinds for a broken file
        run.error = f"{TRIALS_FILE}: {' '.join(str(exc).split())}"
        return run
    from orchestrator.results.profiles import load_profiles

    # profiled trials are planned trials too, kept under profiles/ (not in the table)
    statuses = [r["status"] for r in rows] + [r.get("status") for r in load_profiles(run_dir)]
    run.trials_ok = sum(1 for s in statuses if s == "ok")
    run.trials_failed = sum(1 for s in statuses if s not in DONE_STATUSES)
    run.best = best_result(rows)
    return run


def _trial_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    import pyarrow.parquet as pq

    wanted = ["status", "machine", "workers", "units_per_s", "job_kind", "seconds"]
    # the single-file reader: pq.read_table goes through pyarrow's dataset layer and
    # imports pandas (0.5-0.7 s of `cloudprof runs`)
    with pq.ParquetFile(path) as file:
        names = file.schema_arrow.names
        return file.read(columns=[c for c in wanted if c in names]).to_pylist()


def best_result(rows: list[dict[str, Any]]) -> Best | None:
    """The machine × workers with the highest median units/s over its ok trials (the
    report's "best by throughput"), or for a fixed-work job the shortest median time to
    complete; None when no trial finished ok."""
    ok = [r for r in rows if r.get("status") == "ok"]
    if ok and all(r.get("job_kind") == "fixed_work" for r in ok):
        return _fastest_run(ok)
    groups: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("units_per_s") is not None:
            groups.setdefault((str(r["machine"]), int(r["workers"])), []).append(
                float(r["units_per_s"]))
    if not groups:
        return None
    medians = {key: statistics.median(values) for key, values in groups.items()}
    (machine, workers), rate = max(medians.items(), key=lambda kv: kv[1])
    return Best(machine, workers, rate, len(groups[(machine, workers)]), rate=rate)


def _fastest_run(ok: list[dict[str, Any]]) -> Best | None:
    """A fixed-work job's best: the shortest median time to complete (the report's rule)."""
    groups: dict[tuple[str, int], list[float]] = {}
    for r in ok:
        seconds = r.get("seconds")
        if isinstance(seconds, int | float) and seconds > 0:
            groups.setdefault((str(r["machine"]), int(r["workers"])), []).append(float(seconds))
    if not groups:
        return None
    medians = {key: statistics.median(values) for key, values in groups.items()}
    (machine, workers), seconds = min(medians.items(), key=lambda kv: kv[1])
    return Best(machine, workers, 1.0 / seconds, len(groups[(machine, workers)]),
                measure="runs/h", rate=3600.0 / seconds, seconds_per_run=seconds)


def _epoch(iso: Any) -> float | None:
    """Seconds since the epoch of the store's UTC timestamps (``2026-01-01T00:00:00Z``)."""
    try:
        return float(timegm(time.strptime(str(iso), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def fmt_age(seconds: float | None) -> str:
    """A short age: 45s, 12m, 2h05m, 3d04h (also what ``cloudprof cleanup`` prints)."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
