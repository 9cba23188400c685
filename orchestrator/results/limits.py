"""Limit trials in the store, and the report's "Memory request, proven" table.

A trial under a memory cgroup limit (``--prove-limit``, ``--find-limit``:
``orchestrator.engine.limits``) is not a row of trials.parquet: the kernel reclaims page
cache under a limit, so its time may not compare, and a limit below the need kills it,
which is the answer, not a failed measurement. Each one is kept as
``limits/<trial_id>.json``: the trial's row, its summary's ``memory_limit``
(``limit_bytes``, ``oom_kills``, ``ran_unchanged``) and what the engine asked (``kind``:
"request" for the proof, "search" for the bisection; the request and peak it came from).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.formatting import DASH, fmt_bytes
from workloads.atomic import atomic_path

if TYPE_CHECKING:
    from orchestrator.results.report.table import Table
    from orchestrator.results.store import RunStore

LIMITS_DIR = "limits"


def record_limit(store: RunStore, row: dict[str, Any], summary: dict[str, Any] | None,
                 meta: dict[str, Any]) -> dict[str, Any]:
    """Keep one limit trial under limits/<trial_id>.json; returns the record."""
    limit = (summary or {}).get("memory_limit") or {}
    record = {**row, **meta, "oom_kills": limit.get("oom_kills"),
              "ran_unchanged": bool(limit.get("ran_unchanged")),
              "summary": summary}  # fmt: skip
    path = store.run_dir / LIMITS_DIR / f"{row['trial_id']}.json"
    path.parent.mkdir(exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    return record


def load_limits(run_dir: Path) -> list[dict[str, Any]]:
    """Every limit trial's record, by machine, workers, then limit."""
    records = []
    for path in sorted((Path(run_dir) / LIMITS_DIR).glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return sorted(records, key=lambda r: (str(r.get("machine")), int(r.get("workers") or 0),
                                          int(r.get("limit_bytes") or 0)))


def limit_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Per (machine, workers): the proof's outcome and, after a search, the smallest limit
    the job ran under and the largest it was killed under."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in load_limits(run_dir):
        groups.setdefault((str(r.get("machine")), int(r.get("workers") or 0)), []).append(r)
    out = []
    for (machine, workers), records in groups.items():
        proof = next((r for r in records if r.get("kind") == "request"), None)
        ran = [int(r["limit_bytes"]) for r in records if r.get("ran_unchanged")]
        killed = [int(r["limit_bytes"]) for r in records if r.get("oom_kills")]
        request = proof.get("request_bytes") if proof else records[0].get("request_bytes")
        out.append({
            "machine": machine, "workers": workers, "request_bytes": request,
            "proof": None if proof is None else (
                "ran unchanged" if proof.get("ran_unchanged")
                else f"OOM-killed ({proof['oom_kills']} process(es))" if proof.get("oom_kills")
                else f"not run: {proof.get('error') or proof.get('status')}"),
            "proof_seconds": proof.get("seconds") if proof else None,
            "searched": any(r.get("kind") == "search" for r in records),
            "smallest_ran_bytes": min(ran) if ran else None,
            "largest_killed_bytes": max(killed) if killed else None,
            "trials": len(records),
        })  # fmt: skip
    return out


def limit_table(run_dir: Path) -> Table | None:
    """The report's table: did the job run under its memory request, and what is the least."""
    from orchestrator.results.report.table import Row, Table

    rows = []
    for r in limit_rows(run_dir):
        smallest, request = r["smallest_ran_bytes"], r["request_bytes"]
        above = (f"{100.0 * (request / smallest - 1):+.0f} %"
                 if r["searched"] and smallest and request else DASH)
        rows.append(Row([
            r["machine"], str(r["workers"]), fmt_bytes(request), r["proof"] or DASH,
            fmt_bytes(smallest) if r["searched"] and smallest else DASH,
            fmt_bytes(r["largest_killed_bytes"]) if r["largest_killed_bytes"] else DASH,
            above, str(r["trials"]),
        ]))  # fmt: skip
    if not rows:
        return None
    headers = ["machine", "workers", "memory request", "under the request", "smallest that ran",
               "killed at", "request vs smallest", "n"]
    notes = [
        "Each trial ran the job's process tree in a memory cgroup whose limit was set, as a "
        "container's is (no swap past it): 'ran unchanged' = no process was OOM-killed and the "
        "job exited as without a limit; 'killed at' = the largest limit under which the kernel "
        "killed one of its processes. 'smallest that ran' is bisected (--find-limit) between "
        "half the peak and the request, to 3 % or 5 trials. Kept apart from the tables: "
        "under a limit the kernel reclaims page cache, so times may differ.",
    ]
    return Table("Memory request, proven under a memory limit", headers, rows, notes)
