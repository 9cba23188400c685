"""A command job's memory request, proven on the host that measured it.

After a machine's trials, ``--prove-limit`` runs one more trial per worker count under a
memory cgroup limit equal to the request the report gives (``python -m workloads.run
--memory-limit``: the kernel kills the tree the moment it needs more); ``--find-limit``
then bisects the smallest limit the job runs under, between half the measured peak and
the request, to ``RESOLUTION`` of the limit or ``MAX_STEPS`` more trials. The request is
computed from the trials the store holds by then, with the report's own function, for
the grid point whose peak was highest. These trials are kept apart from the tables
(``orchestrator.results.limits``): a trial under a limit may run slower (the kernel
reclaims page cache) or die.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from orchestrator.plan.planner import TrialPlan, trial_request
from orchestrator.results.report.memory import memory_request
from orchestrator.spec.spec import SweepSpec

RESOLUTION = 0.03  # stop bisecting when the interval is this share of the limit
MAX_STEPS = 5  # bisection trials per worker count at most
LOWEST = 0.5  # bisect from this share of the measured peak
PAGE = 4096


def limit_trial_id(machine: str, workers: int, limit: int) -> str:
    """``<machine>-w<workers>-limit-<bytes>``: never equal to a throughput trial's id."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", machine)
    return f"{safe}-w{workers}-limit-{limit}"


def _requests(rows: list[dict[str, Any]], machine: str) -> dict[int, tuple[int, float, dict]]:
    """Per worker count: (request bytes, peak bytes, grid point of the highest peak), from
    the machine's ok trials; none for a leaking job (no plain request to prove)."""
    by_workers: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("machine") == machine and row.get("status") == "ok":
            by_workers.setdefault(int(row["workers"]), []).append(row)
    out = {}
    for w, group in sorted(by_workers.items()):
        if any(r.get("leak_verdict") == "leak" for r in group):
            continue
        peaks = [float(r["peak_rss_bytes"]) for r in group
                 if r.get("peak_rss_bytes") is not None and math.isfinite(r["peak_rss_bytes"])]
        req = memory_request(peaks)
        if req is None:
            continue
        top = max((r for r in group if r.get("peak_rss_bytes") is not None),
                  key=lambda r: float(r["peak_rss_bytes"]))
        raw = top.get("grid") or ""
        out[w] = (req.request_bytes, req.peak_bytes, json.loads(raw) if raw else {})
    return out


def prove_limits(spec: SweepSpec, machine: str, rows: list[dict[str, Any]],
                 run: Callable[[TrialPlan, dict[str, Any]], bool],
                 log: Callable[[str], None], stopped: Callable[[], bool]) -> None:
    """Run the limit trials of one machine. ``run(trial, meta)`` runs and records one and says
    whether the job ran unchanged under its limit; ``meta`` is what the record keeps."""
    requests = _requests(rows, machine)
    if not requests:
        log(f"{machine}: no memory request to prove (no ok trial, or the job leaks)")
    for w, (request, peak, grid) in requests.items():
        if stopped():
            return

        def one(limit: int, kind: str, w: int = w, request: int = request, peak: float = peak,
                grid: dict = grid) -> bool:
            tid = limit_trial_id(machine, w, limit)
            asked = replace(trial_request(spec, w, tid, 0, grid or None),
                            memory_limit_bytes=limit)
            trial = TrialPlan(tid, machine, w, 0, asked, grid=grid)
            return run(trial, {"kind": kind, "limit_bytes": limit, "request_bytes": request,
                               "peak_bytes": peak})

        ran = one(request, "request")
        if not spec.find_limit or stopped():
            continue
        lo = int(LOWEST * peak) // PAGE * PAGE  # not known to fail: never run itself
        hi = request if ran else None
        if hi is None:  # the request was not enough: look above it, once
            hi = int(1.5 * request) // PAGE * PAGE
            if not one(hi, "search"):
                log(f"{machine} × {w}: killed under the request and under 1.5× it")
                continue
            lo = request
        for _ in range(MAX_STEPS):
            if stopped() or hi - lo <= RESOLUTION * hi:
                break
            mid = (lo + hi) // 2 // PAGE * PAGE
            if one(mid, "search"):
                hi = mid
            else:
                lo = mid

