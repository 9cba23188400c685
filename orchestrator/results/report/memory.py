"""The report's memory view: peaks by phase, and the memory request a container should ask for.

The peak is on one basis: what a container's memory limit must allow. For a command's
process tree that is what the tree holds — anonymous memory plus the file pages it maps
(libraries, mmapped data), counted once across its processes, and not the page cache of
files it only read, which the kernel reclaims under a limit (``workloads.run`` says how it
is measured and with what error); for a workload in the runner's own process, that
process's resident set. Other bases (the cgroup's usage with page cache, the sampled sum of
the processes' RSS) are named beside it when they differ by more than ``BASES_DIFFER``.

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

The request is rounded up to a whole step: the largest power-of-two number of MiB
that is at most ``ROUND_SHARE`` of it (1 MiB to ``ROUND_TO``), so rounding adds at most
1 %, or 1 MiB below 100 MiB (what a person writes in a container spec, without asking for
64 MiB more than a 300 MiB job needs, as a fixed 64 MiB step did).

A job whose memory keeps growing (the leak verdict of any repeat is "leak") gets no
plain request: any fixed figure is too small for a longer run. It gets its growth rate
and the peak it reached at the trial's length instead. Spikes the runner found (short
excursions above the local median, ``workloads.memory.find_spikes``) are listed per row.
Pure functions on numbers, one table builder on the trials.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.formatting import DASH, fmt_bytes
from orchestrator.results.report.values import numeric

if TYPE_CHECKING:
    import pandas as pd

    from orchestrator.results.report.table import Table

MARGIN_SIGMAS = 3.0
MIN_MARGIN = 0.05  # of the peak
DEFAULT_MARGIN = 0.20  # of the peak, when one repeat measured no spread
ROUND_TO = 64 * 2**20  # the largest rounding step
ROUND_SHARE = 0.01  # a step is at most this share of the request
BASES_DIFFER = 0.10  # another basis this far from the headline peak is named
MIB = 2**20


def round_step(total: float) -> int:
    """The rounding step for a request of ``total`` bytes: a power-of-two MiB ≤ 1 % of it."""
    step = MIB
    while step * 2 <= min(ROUND_SHARE * total, ROUND_TO):
        step *= 2
    return step


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
    step = round_step(peak + margin)
    request = int(math.ceil((peak + margin) / step) * step)
    return MemoryRequest(peak, margin, request, method, default)


def memory_rows(trials: pd.DataFrame) -> list[dict[str, Any]]:
    """Per (machine, ran_on, workers) over ok trials: peaks by phase, source, the request."""
    ok = trials[trials["status"] == "ok"]
    if ok.empty:
        return []
    found = _by_workers(ok)
    rows = []
    for (machine, ran_on, workers), g in zip(found.index, found.to_dict("records"), strict=True):
        req = memory_request(g["peaks"])
        if req is None:
            continue
        leak = None if not g["leaking"] else {
            "slope_mb_per_s": _or_none(g["slope"]), "peak_bytes": req.peak_bytes,
            "at_s": _or_none(g["seconds"])}
        rows.append({
            "machine": machine, "ran_on": ran_on, "workers": int(workers),
            "repeats": g["repeats"], "peak_rss_bytes": req.peak_bytes,
            "peak_phase": g["phase"] if isinstance(g["phase"], str) else None,
            "load_peak_bytes": g["load"], "trial_peak_bytes": g["trial"],
            "peak_sources": g["sources"], "margin_bytes": req.margin_bytes,
            "margin_method": req.method, "margin_is_default": req.default,
            "request_bytes": None if leak else req.request_bytes,
            "leak": leak, "spikes": g["spikes"],
            "other_bases": _other_bases(g, req.peak_bytes),
        })  # fmt: skip
    return rows


def _by_workers(ok: pd.DataFrame) -> pd.DataFrame:
    """One row per (machine, ran_on, workers): what a memory row is made of."""
    import numpy as np
    import pandas as pd

    def column(name: str) -> pd.Series:
        return ok[name] if name in ok.columns else pd.Series(None, index=ok.index, dtype=object)

    life, source = numeric(ok, "peak_rss_bytes"), column("peak_rss_source")
    leaking = column("leak_verdict") == "leak"
    by = pd.DataFrame({
        "life": life,
        "top": life.fillna(-np.inf),  # the first largest peak; the first trial when none is known
        "load": numeric(ok, "peak_rss_before_trial_bytes"),
        "trial": numeric(ok, "peak_rss_trial_bytes").fillna(life),
        "leaking": leaking,
        "slope": numeric(ok, "leak_slope_mb_per_s").where(leaking),
        "seconds": numeric(ok, "seconds"),
        "usage": numeric(ok, "peak_usage_with_cache_bytes"),
        "sampled": numeric(ok, "peak_rss_sampled_bytes"),
        "held": source.map(lambda s: str(s).startswith("held")).astype(bool),
        "source": source,
        "spikes": column("spikes"),
    }).groupby([ok["machine"], ok["ran_on"], ok["workers"]], sort=True, dropna=False)
    top = by["top"].idxmax()
    return pd.DataFrame({
        "repeats": by.size(),
        "peaks": by["life"].agg(list),
        "phase": column("peak_phase").reindex(top).to_numpy(),
        "load": by["load"].max(), "trial": by["trial"].max(),
        "leaking": by["leaking"].any(), "slope": by["slope"].max(),
        "seconds": by["seconds"].max(),
        "usage_known": by["usage"].count() > 0, "usage": by["usage"].max(),
        "sampled": by["sampled"].max(), "held": by["held"].any(),
        "sources": by["source"].agg(lambda v: sorted({s for s in v if isinstance(s, str)})),
        "spikes": by["spikes"].agg(_spikes),
    })


def _or_none(value: float) -> float | None:
    return None if math.isnan(value) else value


def _spikes(values: Iterable[Any]) -> list[dict[str, Any]]:
    """Every repeat's spikes (from its summary), the highest first."""
    found = []
    for raw in values:
        if isinstance(raw, str) and raw:
            try:
                found.extend(s for s in json.loads(raw) if isinstance(s, dict))
            except ValueError:
                continue
    return sorted(found, key=lambda s: -float(s.get("rss_bytes") or 0))


def _other_bases(g: dict[str, Any], peak: float) -> list[str]:
    """The other bases that differ from the headline by more than BASES_DIFFER, in words:
    for a command's tree only (a runner that kept its cgroup's usage, or a held peak)."""
    if not g["usage_known"] and not g["held"]:
        return []
    out = []
    for value, name in ((g["usage"], "cgroup usage with page cache"),
                        (g["sampled"], "sampled RSS sum")):
        if value == value and abs(value - peak) > BASES_DIFFER * peak:
            out.append(f"{name} {fmt_bytes(value)} ({100.0 * (value / peak - 1):+.0f} %)")
    return out


def _request_cell(r: dict[str, Any]) -> str:
    leak = r["leak"]
    if leak is not None:
        rate = (f"grows {leak['slope_mb_per_s']:.1f} MB/s" if leak["slope_mb_per_s"] is not None
                else "grows")
        at = f" at {leak['at_s']:.0f} s" if leak["at_s"] is not None else ""
        return f"none (leak): {rate}, reached {fmt_bytes(leak['peak_bytes'])}{at}"
    return fmt_bytes(r["request_bytes"]) + (" (default margin)" if r["margin_is_default"]
                                            else "")


def _spikes_cell(spikes: list[dict[str, Any]]) -> str:
    if not spikes:
        return DASH
    top = spikes[0]
    where = ("between samples" if top.get("between_samples") or top.get("t") is None
             else f"at {float(top['t']):.1f} s")
    return f"{len(spikes)}: {fmt_bytes(top.get('rss_bytes'))} {where}"


def memory_table(trials: pd.DataFrame, found: list[dict[str, Any]] | None = None
                 ) -> Table | None:
    """The report's table: headline peak, its phase, the phases' peaks and the request.
    ``found``: ``memory_rows(trials)``, where the caller has them."""
    from orchestrator.results.report.model import machine_label
    from orchestrator.results.report.table import Row, Table

    found = memory_rows(trials) if found is None else found
    if not found:
        return None
    rows = []
    for r in found:
        margin = f"+{fmt_bytes(r['margin_bytes'])} ({r['margin_method']})"
        rows.append(Row([
            machine_label(r["machine"], r["ran_on"]), str(r["workers"]), str(r["repeats"]),
            fmt_bytes(r["peak_rss_bytes"]), r["peak_phase"] or DASH,
            fmt_bytes(r["load_peak_bytes"]), fmt_bytes(r["trial_peak_bytes"]),
            ", ".join(r["peak_sources"]) or DASH, margin, _spikes_cell(r["spikes"]),
            _request_cell(r),
        ]))  # fmt: skip
    headers = ["machine", "workers", "n", "peak", "peak in", "load peak", "trial peak",
               "measured by", "margin", "spikes", "memory request"]
    notes = [
        "peak = what a container's memory limit must allow, the highest whole-lifetime peak of "
        "the n ok repeats. A command's tree (measured by held): anonymous memory plus the file "
        "pages it maps (libraries, mmapped data) counted once across its processes, sampled; "
        "page cache of files it only read is not in it (the kernel reclaims that under a "
        "limit). A workload in the runner's process: that process's resident set, the trial "
        "process from "
        "its start (imports, loading data, prepare(), warm-up) to its end; load peak and trial "
        "peak are the two phases' own peaks (a job's own phases are in the phases table).",
        "measured by: held = the tree's samples of that basis (a peak shorter than the "
        "sampling interval can be missed); held_cgroup = a peak between samples, from the "
        "cgroup's high-water mark less the page cache and kernel memory it held besides; "
        "vmhwm / ru_maxrss = the kernel's high-water mark of "
        "one process (for a tree: its largest process was above every sample); cgroup-v1 / "
        "cgroup-v2 = the trial's memory cgroup's high-water mark (older runners: page cache it "
        "read included); sampled / sampled_tree = the agent's RSS samples.",
        f"memory request (for a container or batch job) = peak + margin, rounded up to a "
        f"power-of-two MiB of at most {ROUND_SHARE:.0%} of it (at least 1 MiB). margin = "
        f"{MARGIN_SIGMAS:g} standard deviations of the repeats' peaks, at least "
        f"{MIN_MARGIN:.0%} of the peak; with one repeat no spread was "
        f"measured and the margin is a default {DEFAULT_MARGIN:.0%} (labelled) — run with "
        "--repeats 3 for a measured one. A job that leaks gets no request: its growth rate and "
        "the peak it reached at the trial's length instead (a longer run needs more).",
        "spikes: how many short excursions above the local median the repeats had, and the "
        "highest.",
    ]
    for r in found:
        if r["other_bases"]:
            notes.append(f"{machine_label(r['machine'], r['ran_on'])} × {r['workers']}: other "
                         f"bases differ from the peak by more than {BASES_DIFFER:.0%}: "
                         + "; ".join(r["other_bases"]) + ". Usage with page cache counts files "
                         "it read (reclaimable) and not library pages another cgroup had "
                         "cached; the RSS sum counts shared libraries once per process, or "
                         "missed a peak between samples.")
    return Table("Memory per machine and worker count: peaks by phase, memory request",
                 headers, rows, notes)
