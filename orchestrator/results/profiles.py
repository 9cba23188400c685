"""Profiled trials in the store, and the report's "Why scaling stops" / "Where the peak comes from".

A ``--profile`` trial is an *extra* trial: the profiler slows it down, so its
throughput must never sit next to unprofiled ones. It is therefore not a row of
trials.parquet at all; it lives in ``profiles/<trial_id>/`` (its summary.json,
the profiler's files, ``record.json`` with the same columns a trial row has).
Everything here reads from that folder, so the report's tables and figures show
the figures the runner measured and nothing else.
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.formatting import fmt_bytes, fmt_pct
from workloads import protocol
from workloads.atomic import atomic_directory

if TYPE_CHECKING:
    from orchestrator.results.store import RunStore

PROFILES_DIR = "profiles"
RECORD_FILE = "record.json"
SHARE_LABELS = {"python": "Python", "native": "native", "gil_wait": "GIL wait",
                "lock_wait": "lock wait", "idle": "idle"}
CAUSES = {
    "gil_wait": "of thread time waits for the GIL",
    "lock_wait": "of thread time waits for a lock another thread holds (contention)",
    "idle": "of thread time is idle or blocked (I/O, locks, sleeping)",
    "native": "of thread time runs native code (GIL released)",
    "python": "of thread time runs Python",
}
TOP_SITES_SHOWN = 3


def record_profile(store: RunStore, row: dict[str, Any], summary: dict[str, Any] | None,
                   timeseries: Path | None) -> dict[str, Any]:
    """Keep a profiled trial under profiles/<trial_id>/ (never trials.parquet); returns its row
    (``trial_row``'s, marked as profiled).

    The files come from the trial's ``.incoming`` folder, are copied into a
    temporary folder and renamed into place: a reader sees all of them or none.
    """
    trial_id = row["trial_id"]
    row["profiled"] = True
    row["profile"] = (summary or {}).get("profile")
    incoming = store.run_dir / ".incoming" / trial_id
    # replaces an earlier record of the same trial (a re-run after --resume)
    with atomic_directory(store.run_dir / PROFILES_DIR / trial_id, lambda _: False) as tmp:
        for name in (protocol.SUMMARY_FILE, *protocol.PROFILE_FILES):
            if (incoming / name).is_file():
                shutil.copyfile(incoming / name, tmp / name)
        if timeseries is not None and timeseries.is_file():
            shutil.copyfile(timeseries, tmp / protocol.TIMESERIES_FILE)
        (tmp / RECORD_FILE).write_text(json.dumps(row, indent=2, default=str) + "\n", "utf-8")
    return row


def load_profiles(run_dir: Path) -> list[dict[str, Any]]:
    """Every profiled trial's record (with its ``profile`` section), by machine then workers."""
    records = []
    for path in sorted((run_dir / PROFILES_DIR).glob(f"*/{RECORD_FILE}")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            record["dir"] = str(path.parent.relative_to(run_dir))
            records.append(record)
    return sorted(records, key=lambda r: (str(r.get("machine")), int(r.get("workers") or 0)))


def profiled_trial_ids(run_dir: Path, done_only: bool = False) -> set[str]:
    """Ids of the profiled trials stored; ``done_only``: those ``--resume`` need not re-run."""
    from orchestrator.results.store import DONE_STATUSES

    return {str(r.get("trial_id")) for r in load_profiles(run_dir)
            if not done_only or r.get("status") in DONE_STATUSES}  # fmt: skip


@dataclass
class Section:
    """A report table, independent of the report module's classes (one hook converts it)."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def _no_profile(record: dict[str, Any]) -> str | None:
    if record.get("status") not in (None, "ok"):  # a failed trial's profile is not the job's
        return f"trial {record.get('status')}: {record.get('error') or 'no error recorded'}"
    prof = record.get("profile")
    if not prof:
        return record.get("error") or "the runner left no profile"
    if prof.get("status") != "ok":
        return f"no profile: {prof.get('reason')}"
    return None


def dominant_cause(records: list[dict[str, Any]], knee: int | None) -> str | None:
    """One sentence: what the thread time above the knee (or at the top count) goes to.

    Running Python is the work itself, so the cause is the largest of GIL wait,
    idle and native; the shares are averaged over the profiled trials above the
    knee (or the largest worker count when no knee is known).
    """
    usable = [r for r in records if _no_profile(r) is None and r["profile"].get("shares")]
    if not usable:
        return None
    if knee is not None and any(int(r["workers"]) > knee for r in usable):
        chosen = [r for r in usable if int(r["workers"]) > knee]
        where = f"above {knee} worker{'s' if knee != 1 else ''}"
    else:
        top = max(int(r["workers"]) for r in usable)
        chosen = [r for r in usable if int(r["workers"]) == top]
        where = f"at {top} worker{'s' if top != 1 else ''}"
    # profiles recorded before lock waits had a class of their own have no lock_wait share
    mean = {k: sum(r["profile"]["shares"].get(k) or 0.0 for r in chosen) / len(chosen)
            for k in CAUSES}
    cause = max(("gil_wait", "lock_wait", "idle", "native"), key=lambda k: mean[k])
    if mean[cause] < 0.05:
        return f"{where}, {fmt_pct(mean['python'])} of thread time runs Python: no waiting to blame"
    return f"{where}, {fmt_pct(mean[cause])} {CAUSES[cause]}"


def _where(record: dict[str, Any]) -> str:
    """The machine, and the trial's grid values where it has any."""
    try:
        grid = json.loads(record.get("grid") or "{}")
    except ValueError:
        grid = {}
    point = " ".join(f"{k}={v}" for k, v in grid.items()) if isinstance(grid, dict) else ""
    return f"{record['machine']} · {point}" if point else str(record["machine"])


def _rate(row: dict[str, Any]) -> float | None:
    """Work per second: units/s where the trial counted units, else runs/s (1 / its time)."""
    units, ups, seconds = row.get("units"), row.get("units_per_s"), row.get("seconds")
    if units and ups and float(ups) > 0:
        return float(ups)
    if seconds and float(seconds) > 0:
        return 1.0 / float(seconds)
    return None


def slowdowns(records: list[dict[str, Any]],
              trials: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Per profiled trial id: how much longer its work took than without the profiler,
    ``baseline / profiled - 1`` of the rates, against the median of the ok unprofiled trials
    of the same machine, host, worker count and grid values (one node)."""
    base: dict[tuple[str, str, int, str], list[float]] = {}
    for row in trials:
        rate = _rate(row)
        if row.get("status") == "ok" and rate is not None and int(row.get("nodes") or 1) == 1:
            # the report labels a grid point's machine "machine · rows=…" (machine_type keeps it)
            key = (str(row.get("machine_type") or row["machine"]), str(row.get("ran_on")),
                   int(row["workers"]), str(row.get("grid") or ""))
            base.setdefault(key, []).append(rate)
    out = {}
    for r in records:
        key = (str(r["machine"]), str(r.get("ran_on")), int(r["workers"]),
               str(r.get("grid") or ""))
        rate = _rate(r)
        if r.get("status") == "ok" and rate and base.get(key):
            out[str(r["trial_id"])] = statistics.median(base[key]) / rate - 1.0
    return out


def _slowdown(record: dict[str, Any], slow: dict[str, float] | None) -> str:
    value = (slow or {}).get(str(record.get("trial_id")))
    return "–" if value is None else f"{value:+.0%}"


SLOWDOWN_NOTE = ("Slowdown: how much longer the profiled trial's work took (per unit, or per "
                 "run of a fixed-work job) than the median unprofiled trial of the same "
                 "machine, workers and grid values in this sweep (both measured).")


def _top_text(prof: dict[str, Any]) -> str:
    """The job's own function first (the innermost frame in its files), then the leaf where
    that is a library's."""
    top = (prof.get("top_functions") or [{}])[0]
    own = (prof.get("own_functions") or [{}])[0]
    leaf = (f"{top['function']} ({top['site']}, {SHARE_LABELS.get(top['class'], top['class'])}) "
            f"{fmt_pct(top['share'])}" if top else "")  # fmt: skip
    if not own:
        return leaf or "–"
    text = f"{own['function']} ({own['site']}, your code) {fmt_pct(own['share'])}"
    if top and not top.get("own"):
        text += f"; innermost: {leaf}"
    return text


def scaling_section(
    records: list[dict[str, Any]], knees: dict[str, int | None] | None = None,
    slow: dict[str, float] | None = None,
) -> Section | None:
    """ "Why scaling stops": per machine, CPU shares against worker count, knee annotated."""
    cpu = [r for r in records if (r.get("profile") or {}).get("kind") == "cpu"
           or str(r.get("trial_id", "")).endswith(("-prof-cpu", "-prof-gil"))]  # fmt: skip
    if not cpu:
        return None
    rows, notes = [], []
    for machine in sorted({_where(r) for r in cpu}):  # a grid point is a machine of its own
        mine = [r for r in cpu if _where(r) == machine]
        for r in mine:
            missing = _no_profile(r)
            prof = r.get("profile") or {}
            shares = prof.get("shares") or {}
            cells = ["–" if missing else fmt_pct(shares.get(k)) for k in SHARE_LABELS]
            rows.append([machine, str(r["workers"]), *cells, _slowdown(r, slow),
                         missing or _top_text(prof)])
        sentence = dominant_cause(mine, (knees or {}).get(machine))
        if sentence:
            notes.append(f"{machine}: {sentence[0].upper()}{sentence[1:]}.")
    notes.append(
        "Shares of thread samples taken by py-spy in extra profiled trials (their "
        "throughput is not in the tables above); cloudprof's own threads left out. "
        "The top function is the job's own first (\"your code\": the innermost frame in "
        "its files), then the innermost frame where that is a library's."
    )
    notes.append(SLOWDOWN_NOTE)
    counted = [r["profile"] for r in cpu if _no_profile(r) is None]
    own = sum(int(p.get("cloudprof_samples") or 0) for p in counted)
    if own:
        every = own + sum(int(p.get("samples") or 0) for p in counted)
        notes.append(f"cloudprof's own unit counter (a workload's counter.add) took {own} of "
                     f"{every} thread samples ({fmt_pct(own / every)}), left out of the shares.")
    if any(_no_profile(r) is None and not r["profile"].get("shares") for r in cpu):
        notes.append("No shares where py-spy read Python frames only (--profile cpu, about 3 % "
                     "cost): the Python / native / GIL-wait split needs --profile gil (about "
                     "20 %; docs/benchmarks.md).")  # fmt: skip
    return Section("Why scaling stops", ["Machine", "Workers", *SHARE_LABELS.values(),
                   "Slowdown", "Top function"], rows, notes)  # fmt: skip


def memory_section(records: list[dict[str, Any]],
                   slow: dict[str, float] | None = None) -> Section | None:
    """ "Where the peak comes from": the top call sites at the high-water mark."""
    mem = [r for r in records if (r.get("profile") or {}).get("kind") == "memory"
           or str(r.get("trial_id", "")).endswith("-prof-memory")]  # fmt: skip
    if not mem:
        return None
    rows = []
    for r in mem:
        missing = _no_profile(r)
        if missing:
            rows.append([_where(r), str(r["workers"]), "–", missing, "–", _slowdown(r, slow)])
            continue
        prof = r["profile"]
        # the job's own call sites first (largest first), then the libraries'
        sites = sorted(prof.get("top_sites") or [], key=lambda s: not s.get("own"))
        text = (
            "; ".join(
                f"{fmt_bytes(s['bytes'])}: {s['function']} at {s['site']}"
                + (" (your code)" if s.get("own") else "")
                for s in sites[:TOP_SITES_SHOWN]
            )
            or "no allocations alive at the peak"
        )
        grown = prof.get("grown_sites") or []
        if r.get("leak_verdict") == "leak" and grown:  # the seeds' leak hunt, automated
            text += "; grew during the trial (leak): " + "; ".join(
                f"{fmt_bytes(g['bytes'])}: {g['function']} at {g['site']}" for g in grown[:2]
            )
        tool = "" if prof.get("tool") == "memray" else f" ({prof.get('tool')}, Python only)"
        if len(prof.get("processes") or []) > 1:  # a process tree: each at its own peak
            tool += f" (sum of {len(prof['processes'])} processes' peaks)"
        rows.append([_where(r), str(r["workers"]), fmt_bytes(prof.get("peak_bytes")) + tool,
                     text, _heap_text(prof.get("heap")), _slowdown(r, slow)])  # fmt: skip
    notes = ["Allocations alive at the profiled trial's high-water mark, by the job's call "
             "site, traced over the trial process's whole life (prepare() included; memray, "
             "native allocations included, unless marked otherwise); the job's own call "
             "sites (in its files) first.", HEAP_NOTE, SLOWDOWN_NOTE]  # fmt: skip
    headers = ["Machine", "Workers", "Peak (traced)", "Top call sites", "On the heap at the peak",
               "Slowdown"]
    return Section("Where the peak comes from", headers, rows, notes)


HEAP_NOTE = ("On the heap: Python objects alive at the highest resident memory a census saw "
             "(taken each time it grew by 5 % or 1 MiB), by type with sys.getsizeof; an array "
             "counts the buffer it owns. For a process tree, the process with the highest "
             "resident memory.")


def _heap_text(heap: dict[str, Any] | None) -> str:
    """The heap census's largest types, as "38 MiB dict ×200,000"; "–" when none was taken."""
    if not heap or not heap.get("top_types"):
        return "–"
    text = "; ".join(f"{fmt_bytes(t['bytes'])} {t['type']} ×{t['count']:,}"
                     for t in heap["top_types"][:TOP_SITES_SHOWN])
    if (heap.get("processes") or 1) > 1:
        text += f" (of {heap['processes']} processes, the largest)"
    return text


def profile_sections(run_dir: Path, knees: dict[str, int | None] | None = None,
                     trials: Iterable[dict[str, Any]] = ()) -> list[Section]:
    """The report's profile sections for a store (none when it has no profiled trial);
    ``trials`` (the unprofiled ones) give each profiled trial's slowdown."""
    records = load_profiles(run_dir)
    slow = slowdowns(records, trials)
    return [s for s in (scaling_section(records, knees, slow), memory_section(records, slow))
            if s]
