"""The report's memory view: peaks by phase, and the memory request a container should ask for.

"What does your code need at peak?" is asked before a job is deployed in a
container or a batch system, and its answer is the whole-lifetime peak: loading
data is often the highest point, so the trial's own peak is not enough. Per
machine and worker count this module takes the highest whole-lifetime peak over
the repeats that finished ok, shows the load and trial peaks beside it (and
which kernel counter or sampler measured it), and adds a margin:

* from two repeats on, ``MARGIN_SIGMAS`` standard deviations of the repeats'
  peaks (the spread a new run of the same trial showed), at least
  ``MIN_MARGIN`` of the peak — the run-to-run spread of a steady job's peak is
  often a few pages, and allocator and kernel versions move it more than that;
* with one repeat no spread was measured: a default ``DEFAULT_MARGIN`` of the
  peak, labelled as a default.

The request is rounded up to a whole ``ROUND_TO`` (what a person writes in a
container spec). Pure functions on numbers, one table builder on the trials.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.formatting import DASH, fmt_bytes
from orchestrator.results.report.rows import Frame, as_frame, idx_max, nanmax

if TYPE_CHECKING:
    from orchestrator.results.report.tables import Table

MARGIN_SIGMAS = 3.0
MIN_MARGIN = 0.05  # of the peak
DEFAULT_MARGIN = 0.20  # of the peak, when one repeat measured no spread
ROUND_TO = 64 * 2**20  # a request is a whole number of 64 MiB


@dataclass(frozen=True)
class MemoryRequest:
    """What to ask for: ``request_bytes`` = ``peak_bytes`` + ``margin_bytes``, rounded up."""

    peak_bytes: float
    margin_bytes: float
    request_bytes: int
    method: str  # how the margin was chosen, in words ("3σ of 3 repeats", "default 20 %")
    default: bool  # True: no spread was measured (one repeat); the margin is a default


def memory_request(peaks: Sequence[float]) -> MemoryRequest | None:
    """The request for one machine and worker count from its repeats' whole-lifetime peaks."""
    known = [float(p) for p in peaks if p is not None and math.isfinite(float(p)) and p > 0]
    if not known:
        return None
    peak = max(known)
    if len(known) == 1:
        margin, method, default = DEFAULT_MARGIN * peak, f"default {DEFAULT_MARGIN:.0%}", True
    else:
        sigma = statistics.stdev(known)
        floor = MIN_MARGIN * peak
        margin = max(MARGIN_SIGMAS * sigma, floor)
        method = (f"{MARGIN_SIGMAS:g}σ of {len(known)} repeats" if margin > floor
                  else f"{MIN_MARGIN:.0%} floor: 3σ of {len(known)} repeats is less")
        default = False
    request = int(math.ceil((peak + margin) / ROUND_TO) * ROUND_TO)
    return MemoryRequest(peak, margin, request, method, default)


def memory_rows(trials: Frame) -> list[dict[str, Any]]:
    """Per (machine, ran_on, workers) over ok trials: peaks by phase, source, the request."""
    ok = as_frame(trials).where(lambda r: r["status"] == "ok")
    if ok.empty:
        return []
    rows = []
    for (machine, ran_on, workers), group in ok.group_by(["machine", "ran_on", "workers"]):
        life = group.numbers("peak_rss_bytes")
        load = group.numbers("peak_rss_before_trial_bytes")
        trial = [t if t == t else w for t, w in zip(group.numbers("peak_rss_trial_bytes"), life,
                                                   strict=True)]
        req = memory_request(life)
        if req is None:
            continue
        top = group.rows[idx_max(life)]
        phase = top.get("peak_phase")
        sources = sorted({str(s) for s in group.get("peak_rss_source", []) if isinstance(s, str)})
        rows.append({
            "machine": machine, "ran_on": ran_on, "workers": int(workers),
            "repeats": len(group), "peak_rss_bytes": req.peak_bytes,
            "peak_phase": phase if isinstance(phase, str) else None,
            "load_peak_bytes": nanmax(load), "trial_peak_bytes": nanmax(trial),
            "peak_sources": sources, "margin_bytes": req.margin_bytes,
            "margin_method": req.method, "margin_is_default": req.default,
            "request_bytes": req.request_bytes,
        })  # fmt: skip
    return rows


def memory_table(trials: Frame) -> Table | None:
    """The report's table: headline peak, its phase, the phases' peaks and the request."""
    from orchestrator.results.report.model import machine_label
    from orchestrator.results.report.tables import Row, Table

    found = memory_rows(trials)
    if not found:
        return None
    rows = []
    for r in found:
        margin = f"+{fmt_bytes(r['margin_bytes'])} ({r['margin_method']})"
        rows.append(Row([
            machine_label(r["machine"], r["ran_on"]), str(r["workers"]), str(r["repeats"]),
            fmt_bytes(r["peak_rss_bytes"]), r["peak_phase"] or DASH,
            fmt_bytes(r["load_peak_bytes"]), fmt_bytes(r["trial_peak_bytes"]),
            ", ".join(r["peak_sources"]) or DASH, margin,
            fmt_bytes(r["request_bytes"]) + (" (default margin)" if r["margin_is_default"]
                                             else ""),
        ]))  # fmt: skip
    headers = ["machine", "workers", "n", "peak RSS", "peak in", "load peak", "trial peak",
               "measured by", "margin", "memory request"]
    notes = [
        "peak RSS = the highest whole-lifetime peak of the n ok repeats: the trial process from "
        "its start (imports, loading data, prepare(), warm-up) to its end; load peak and trial "
        "peak are the two phases' own peaks (a job's own phases are in the phases table).",
        "measured by: vmhwm / ru_maxrss = the kernel's high-water mark of one process; "
        "cgroup-v1 / cgroup-v2 = the kernel's high-water mark of the trial's memory cgroup "
        "(a whole process tree, page cache it read included); sampled / sampled_tree = the "
        "agent's samples (a tree's short peaks between samples can be missed).",
        f"memory request (for a container or batch job) = peak RSS + margin, rounded up to "
        f"{fmt_bytes(ROUND_TO)}. margin = {MARGIN_SIGMAS:g} standard deviations of the "
        f"repeats' peaks, at least {MIN_MARGIN:.0%} of the peak; with one repeat no spread was "
        f"measured and the margin is a default {DEFAULT_MARGIN:.0%} (labelled) — run with "
        "--repeats 3 for a measured one.",
    ]
    return Table("Memory per machine and worker count: peaks by phase, memory request",
                 headers, rows, notes)
