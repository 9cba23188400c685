"""One measure of work for every job: units/s for a job that counts units, runs/h for one that
does a fixed amount of work.

A ``--command`` job that prints no ``cloudprof:units`` lines is one complete run per trial
(``job_kind`` "fixed_work"): what a trial measures is its time to complete, the store's
``seconds`` column, and the runner records 0 units/s for it. Read as a rate, such a job does
one run per ``seconds``: with a run as the unit of work, ``units_per_s`` = 1 / seconds. That
is what :func:`with_measure` writes into the report's trials, so every figure that follows
from throughput (efficiency, the knee and its range, the USL fit and N*, the cost, the Pareto
front, the best rows, ``compare``, ``runs``) follows for a fixed-work job with no code of its
own, and none of them reads a zero where a time was measured.

Only how a figure is shown differs, and :class:`Measure` says how: runs per hour (3600 /
seconds to complete) and dollars per run (price/h × seconds / 3600) instead of units per
second and dollars per million units. The maths is unchanged by that scale: a knee, a Pareto
front or a ranking over runs/s is the one over runs/h, and a front over (runs/h, $/run) is
the front over (time to complete, $/run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.results.report.values import number, numeric

if TYPE_CHECKING:
    import pandas as pd

FIXED_WORK = "fixed_work"  # the trials table's job_kind of a job that reported no units


@dataclass(frozen=True)
class Measure:
    """How one sweep's work is counted and shown.

    The report's columns hold work per second (``units_per_s``) and dollars per million
    of it (``cost_per_million_units``) for every job; ``rate`` and ``cost`` turn them into
    this measure's own unit, ``name`` and ``cost_name`` say which it is.
    """

    kind: str  # "units" | "fixed-work"
    name: str  # the rate's unit: "units/s" | "runs/h"
    rate_scale: float  # shown rate = units_per_s × rate_scale
    cost_name: str  # "$/M units" | "$/run"
    cost_per: str  # "per million units" | "per run": after a dollar figure in a sentence
    cost_scale: float  # shown cost = cost_per_million_units × cost_scale
    rate_key: str  # the report --json key holding the rate in this unit
    cost_key: str  # ... and the cost

    @property
    def fixed_work(self) -> bool:
        return self.kind == "fixed-work"

    def rate(self, units_per_s: Any) -> float:
        """A ``units_per_s`` figure in this measure's unit (NaN stays NaN)."""
        return number(units_per_s) * self.rate_scale

    def cost(self, cost_per_million_units: Any) -> float:
        """A ``cost_per_million_units`` figure in this measure's unit."""
        return number(cost_per_million_units) * self.cost_scale

    def document(self) -> dict[str, Any]:
        """``report --json``'s ``measure``: which unit, and which keys hold figures in it."""
        doc: dict[str, Any] = {"name": self.name, "kind": self.kind,
                               "rate_key": self.rate_key, "cost_name": self.cost_name,
                               "cost_key": self.cost_key}
        if self.fixed_work:
            doc["time_key"] = "seconds_per_run"
            doc["note"] = ("one complete run per trial (the job reported no units): "
                           "runs_per_hour = 3600 / seconds_per_run; units_per_s counts a "
                           "run as one unit (1 / seconds_per_run)")
        return doc


UNITS = Measure("units", "units/s", 1.0, "$/M units", "per million units", 1.0,
                "units_per_s", "cost_per_million_units")
RUNS = Measure("fixed-work", "runs/h", 3600.0, "$/run", "per run", 1e-6,
               "runs_per_hour", "cost_per_run")


def is_fixed_work(row: dict[str, Any]) -> bool:
    return row.get("job_kind") == FIXED_WORK


def trial_rate(row: dict[str, Any]) -> float:
    """One trial's rate in base units: units/s, or for a fixed-work run 1 / its seconds (the
    runner records 0 units/s for it); NaN where nothing was measured. What the adaptive and
    search strategies compare, so they rank a fixed-work job by its time, not by zeros."""
    if is_fixed_work(row):
        return 1.0 / _seconds(row) if math.isfinite(_seconds(row)) else math.nan
    ups = number(row.get("units_per_s"))
    return ups if math.isfinite(ups) else math.nan


def measure_of(trials: pd.DataFrame) -> Measure:
    """RUNS when every ok trial (every trial, when none is ok) is a fixed-work run; else UNITS.

    A sweep whose trials mix both kinds keeps units/s: its fixed-work trials are left as
    the runner recorded them and shown in the report's fixed-work table.
    """
    if trials.empty or "job_kind" not in trials.columns:
        return UNITS
    ok = trials[trials["status"] == "ok"] if "status" in trials.columns else trials
    kinds = (ok if len(ok) else trials)["job_kind"]
    return RUNS if (kinds == FIXED_WORK).all() else UNITS


def _seconds(row: dict[str, Any]) -> float:
    s = number(row.get("seconds"))
    return s if math.isfinite(s) and s > 0 else math.nan


def with_measure(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials with a fixed-work job's rate filled in from its time to complete.

    For each ok fixed-work trial with a measured ``seconds``: ``units_per_s`` = 1 / seconds
    (runs per second), and the columns the store derives from it (per vCPU, cost per
    million, efficiency) recomputed, since the store derived them from the runner's 0.
    Efficiency is T(1) / (workers × T) with T the median time to complete at 1 worker of
    the same machine, host, grid point and node count. The same frame back when no trial
    is a fixed-work run of a fixed-work sweep (it is safe to call twice).
    """
    import numpy as np

    if measure_of(trials) is not RUNS:
        return trials
    keys = [trials[c].map(lambda v: "" if v is None or v != v else str(v))
            for c in ("machine", "ran_on", "grid", "nodes") if c in trials.columns]
    seconds = numeric(trials, "seconds")
    seconds = seconds.where(np.isfinite(seconds) & (seconds > 0))
    runs = (trials["status"] == "ok") & (trials["job_kind"] == FIXED_WORK)
    workers = numeric(trials, "workers")
    # T(1): the median time of the 1-worker runs with the same key, on every row of that key
    t1 = seconds.where(runs & (workers == 1)).groupby(keys, dropna=False).transform("median")
    timed = runs & seconds.notna()
    vcpus, price = numeric(trials, "vcpus"), numeric(trials, "price_per_hour")
    rate = 1.0 / seconds
    out = trials.copy()
    filled = {
        "units_per_s": rate,
        "units_per_s_per_vcpu": rate / vcpus.where(vcpus > 0),
        "cost_per_million_units": price * seconds / 3600.0 * 1e6,
        "efficiency": t1 / (workers * seconds).where(workers > 0),
    }
    for name, values in filled.items():
        column = numeric(out, name) if name in out.columns else values * math.nan
        out[name] = column.where(~timed, values)
    return out
