"""The cheapest measured configuration that finishes a job in time and fits in memory.

A sweep measures rates and peaks; the question a user brings is "what should I run this
on to be done by the deadline, for the least money". Every (machine, worker count) on
one VM that finished ok in the given runs — several runs may span clouds — is a
candidate, and each is judged on its measured figures alone:

* time: a fixed-work job's median time per run × the runs asked for (``--total``, 1 by
  default); a job that reports units, ``--total`` units ÷ its median units/s; plus the VM's
  start (create, boot, bootstrap, staging the inputs) where the store measured it
  (``sweep.json``'s ``vms``: ``requested_at`` to ``inputs_staged_at``), else said to be
  left out;
* cost: that time at the machine's price, billed per second with a one-minute minimum
  (both clouds bill Linux VMs so);
* memory: the measured whole-lifetime peak plus ``--memory-margin`` must fit the machine's
  memory (``memory_gib`` of the trials, else the catalog's); a leaking configuration does
  not fit any machine for a longer run and is rejected as such.

With ``--target rows=4000000`` every configuration is judged at that data size instead:
its time per run (or rate) and peak forecast from the sizes swept (``whole_job``,
``forecast``), each --nodes count a candidate of its own with every VM billed.

The cheapest candidate that meets every constraint wins (the faster on a tie); the next
is the runner-up, and every other candidate says in one line why it lost. A store measured
on another host than its machine (a dry run) says so: its times are that host's.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import CloudprofError, UsageError
from orchestrator.formatting import fmt_bytes, fmt_usd
from orchestrator.results.report.model import OK, RunData, load_run, one_node
from orchestrator.results.report.values import numeric
from orchestrator.results.whole_job import (
    MIN_BILLED_S,
    Question,
    billed_cost,
    duration,
    totals,
    vm_start_seconds,
)

GIB = 2**30
__all__ = ["MIN_BILLED_S", "billed_cost", "recommend", "recommend_runs", "render"]


class NothingFitsError(CloudprofError):
    """No candidate meets the constraints; the message says why, in one line."""


@dataclass
class Candidate:
    """One (run, machine, worker count) and how it fares against the constraints."""

    run: str
    provider: str
    machine: str  # the report's label
    ran_on: str
    workers: int
    trials: list[str]
    work_s: float  # the work at the measured rate
    start_s: float | None  # the VM's measured start (boot, bootstrap, staging); None: unknown
    seconds: float  # work_s + start_s (where measured)
    price_per_hour: float
    cost: float  # USD, billed per second with a one-minute minimum
    peak_bytes: float | None
    machine_bytes: float | None
    needs_bytes: float | None  # peak × (1 + margin)
    measured_elsewhere: bool
    reasons: list[str] = field(default_factory=list)  # why it was rejected; empty: it fits
    nodes: int = 1  # VMs (a --nodes sweep's cluster), each billed
    basis: str = "measured"  # "forecast": time and peak forecast at --target's size

    def to_dict(self) -> dict[str, Any]:
        """Base units (seconds, USD, bytes); unknown figures are null, never NaN."""
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in asdict(self).items()}


@dataclass
class Recommendation:
    choice: Candidate
    runner_up: Candidate | None
    rejected: list[Candidate]
    also_fit: list[Candidate]  # the rest that meet every constraint, cheapest first
    start_included: bool  # every candidate's time includes a measured VM start
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"choice": self.choice.to_dict(),
                "runner_up": self.runner_up.to_dict() if self.runner_up else None,
                "rejected": [c.to_dict() for c in self.rejected],
                "also_fit": [c.to_dict() for c in self.also_fit],
                "start_included": self.start_included, "notes": self.notes}


def parse_margin(text: str) -> float:
    """``20%`` or ``0.2`` → 0.2 (a share of the peak, at least 0)."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError(
            f"--memory-margin: expected a share such as 20% or 0.2, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"--memory-margin: must be 0 or more, got {text!r}")
    return value


def candidates(run: RunData, total: float | None, margin: float) -> list[Candidate]:
    """Every (machine, workers) on one VM with an ok trial in ``run``, judged on time,
    cost and memory (``reasons`` left to :func:`recommend` for the deadline and cost)."""
    from orchestrator.results.report.memory import memory_rows

    trials = one_node(run.trials)
    ok = trials[trials["status"] == OK]
    memory = {(r["machine"], r["ran_on"], r["workers"]): r for r in memory_rows(ok)}
    starts = vm_start_seconds(run.sweep)
    out = []
    for (machine, ran_on, workers), group in ok.groupby(["machine", "ran_on", "workers"],
                                                        sort=True, dropna=False):
        fixed = "job_kind" in group.columns and bool((group["job_kind"] == "fixed_work").all())
        if fixed:
            per_run = [s for s in numeric(group, "seconds") if s == s and s > 0]
            if not per_run:
                continue
            work = statistics.median(per_run) * (total if total is not None else 1.0)
        else:
            if total is None:
                raise UsageError(f"{run.run_dir} measured a rate in units/s: say how many units "
                                 "the job has with --total N")
            rates = [u for u in numeric(group, "units_per_s") if u == u and u > 0]
            if not rates:
                continue
            work = total / statistics.median(rates)
        base = str(machine).split(" · ", 1)[0]
        # a dry run's host is not the machine: its start and memory are not the machine's
        elsewhere = str(ran_on) not in (str(machine), base)
        start = None if elsewhere else starts.get(base)
        seconds = work + (start or 0.0)
        prices = numeric(group, "price_per_hour").dropna().tolist()
        price = statistics.median(prices) if prices else math.nan
        mem = memory.get((machine, ran_on, int(workers)))
        peak = float(mem["peak_rss_bytes"]) if mem else None
        catalog = _catalog_row(base)
        machine_bytes = (catalog.memory_gib * GIB if catalog else None) if elsewhere \
            else _machine_bytes(group, catalog)
        provider = catalog.provider if elsewhere and catalog else _first_str(group, "provider")
        cand = Candidate(
            run=run.name, provider=provider, machine=str(machine),
            ran_on=str(ran_on), workers=int(workers),
            trials=sorted(str(t) for t in group["trial_id"] if t), work_s=work, start_s=start,
            seconds=seconds, price_per_hour=price,
            cost=billed_cost(seconds, price) if price == price else math.nan,
            peak_bytes=peak, machine_bytes=machine_bytes,
            needs_bytes=peak * (1.0 + margin) if peak is not None else None,
            measured_elsewhere=elsewhere)
        _judge_memory(cand, base, margin, leaks=mem is not None and mem["leak"] is not None)
        out.append(cand)
    return out


def _judge_memory(cand: Candidate, base: str, margin: float, leaks: bool) -> None:
    """Add why ``cand`` is out on memory or price: a leak, an unknown peak or memory, a peak
    plus margin over the machine's memory, no price."""
    peak, machine_bytes = cand.peak_bytes, cand.machine_bytes
    what = "forecast peak" if cand.basis == "forecast" else "peak"
    if leaks:
        cand.reasons.append("its memory grows (leak verdict): no fixed memory is enough "
                            "for a longer run")
    elif peak is None:
        cand.reasons.append("no peak memory measured" if what == "peak" else "no peak forecast")
    elif machine_bytes is None:
        cand.reasons.append(f"{base}'s memory is not in the catalog")
    elif cand.needs_bytes is not None and cand.needs_bytes > machine_bytes:
        cand.reasons.append(f"{what} {fmt_bytes(peak)} + {margin:.0%} = "
                            f"{fmt_bytes(cand.needs_bytes)} does not fit its "
                            f"{fmt_bytes(machine_bytes)}")
    if cand.price_per_hour != cand.price_per_hour:
        cand.reasons.append(f"no price known for {base}")


def forecast_candidates(run: RunData, q: Question, margin: float) -> list[Candidate]:
    """Every configuration of ``run`` at ``q``'s target size: the whole job's time and cost
    (``whole_job.totals``: VM start as measured + the forecast work, every VM billed) and its
    forecast peak, judged like the measured candidates."""
    from orchestrator.results.whole_job import forecasts

    peaks = {(e["machine"], e["ran_on"], e["workers"], e["nodes"], e["grid"]): e
             for e in forecasts(run, q)}
    ok = run.trials[run.trials["status"] == OK]
    planned = ok["machine"].astype(str)
    if "machine_type" in ok.columns:  # a --grid point's machine: the planned one
        planned = ok["machine_type"].where(ok["machine_type"].astype(bool), planned).astype(str)
    out = []
    for t in totals(run, q):
        key = (t["machine"], t["ran_on"], t["workers"], t["nodes"], t["grid"])
        peak = peaks[key]["peak_rss_bytes"]
        base = str(t["machine"])
        mine = ok[planned == base]
        catalog = _catalog_row(base)
        machine_bytes = (catalog.memory_gib * GIB if catalog else None) if t["estimate"] \
            else _machine_bytes(mine, catalog)
        provider = catalog.provider if t["estimate"] and catalog else _first_str(mine, "provider")
        price = t["price_per_hour"] if t["price_per_hour"] is not None else math.nan
        cand = Candidate(
            run=run.name, provider=provider,
            machine=base + (f" · {t['grid']}" if t["grid"] else ""), ran_on=t["ran_on"],
            workers=t["workers"], trials=sorted(str(i) for i in mine["trial_id"] if i),
            work_s=t["work_s"], start_s=t["start_s"], seconds=t["seconds"],
            price_per_hour=price, cost=t["cost_usd"] if t["cost_usd"] is not None else math.nan,
            peak_bytes=peak, machine_bytes=machine_bytes,
            needs_bytes=peak * (1.0 + margin) if peak is not None else None,
            measured_elsewhere=bool(t["estimate"]), nodes=t["nodes"], basis="forecast")
        _judge_memory(cand, base, margin, leaks=False)
        out.append(cand)
    return out


def _first_str(group: Any, column: str) -> str:
    for value in group.get(column, ()):
        if isinstance(value, str) and value:
            return value
    return "-"


def _catalog_row(name: str) -> Any:
    """The catalog's row of a machine type (its first region), or None."""
    from orchestrator.catalog.machines import load_catalog

    return next((m for m in load_catalog() if m.name == name), None)


def _machine_bytes(group: Any, catalog: Any) -> float | None:
    """The machine's memory: the trials' ``memory_gib`` (what the VM reported), else the
    catalog's."""
    known = [g for g in numeric(group, "memory_gib") if g == g and g > 0]
    if known:
        return known[0] * GIB
    return catalog.memory_gib * GIB if catalog is not None else None


def recommend(runs: list[RunData], deadline_s: float | None, max_cost: float | None,
              margin: float, total: float | None,
              question: Question | None = None) -> Recommendation:
    """The cheapest candidate over ``runs`` meeting every constraint (see the module);
    with a target size in ``question``, at that size (``forecast_candidates``)."""
    _same_job(runs)
    if question is not None and question.target is not None:
        found = [c for run in runs
                 for c in forecast_candidates(run, Question(question.target, question.size,
                                                            total), margin)]
    else:
        found = [c for run in runs for c in candidates(run, total, margin)]
    if not found:
        raise NothingFitsError("no configuration finished ok in "
                               + ", ".join(str(r.run_dir) for r in runs))
    for c in found:
        if deadline_s is not None and c.seconds > deadline_s:
            c.reasons.append(f"{duration(c.seconds)} misses the {duration(deadline_s)} deadline")
        if max_cost is not None and c.cost == c.cost and c.cost > max_cost:
            c.reasons.append(f"{fmt_usd(c.cost)} is over the {fmt_usd(max_cost)} limit")
    fits = sorted((c for c in found if not c.reasons),
                  key=lambda c: (c.cost, c.seconds, c.machine, c.workers))
    rejected = sorted((c for c in found if c.reasons), key=lambda c: (c.cost, c.seconds))
    if not fits:
        cheapest = min(found, key=lambda c: (c.cost if c.cost == c.cost else math.inf))
        raise NothingFitsError(
            f"no configuration meets the constraints: all {len(found)} rejected; the cheapest, "
            f"{_name(cheapest)}, because {'; '.join(cheapest.reasons)}")
    notes = []
    start_included = all(c.start_s is not None for c in found)
    if not start_included:
        notes.append("VM start (boot, bootstrap, staging) is not included where the store did "
                     "not measure it" + (" (a dry run measures none)"
                                         if any(c.measured_elsewhere for c in found) else ""))
    if any(c.measured_elsewhere for c in found):
        notes.append("times measured on another host than the machine (a dry run) are that "
                     "host's: an estimate for the machine")
    return Recommendation(fits[0], fits[1] if len(fits) > 1 else None, rejected, fits[2:],
                          start_included, notes)


def _same_job(runs: list[RunData]) -> None:
    """Runs compete only when they measured the same kind of job in the same unit: a
    rate in cubes/s and one in rows/s, or a time per run, say nothing of each other."""
    def kind(run: RunData) -> str:
        ok = run.trials[run.trials["status"] == OK]
        if len(ok) and "job_kind" in ok.columns and (ok["job_kind"] == "fixed_work").all():
            return "runs (fixed work)"
        units = sorted({str(u) for u in ok.get("unit", ()) if isinstance(u, str) and u})
        return "/".join(units) or "units"

    kinds = {str(run.run_dir): kind(run) for run in runs}
    if len(set(kinds.values())) > 1:
        shown = ", ".join(f"{path} measures {k}" for path, k in kinds.items())
        raise UsageError(f"the runs measured different jobs ({shown}): recommend compares "
                         "runs of one job")


def _name(c: Candidate) -> str:
    return f"{c.machine} × {c.workers}" + (f" × {c.nodes} VMs" if c.nodes > 1 else "")


def describe(c: Candidate) -> str:
    """One line: the configuration, its time (with the start where measured), cost, memory."""
    start = (f" incl. {duration(c.start_s)} VM start" if c.start_s is not None
             else " (VM start not included)")
    est = " (est.: measured on " + c.ran_on + ")" if c.measured_elsewhere else ""
    if c.basis == "forecast":
        est += " (forecast)"
    memory = (f"; peak {fmt_bytes(c.peak_bytes)} of {fmt_bytes(c.machine_bytes)}"
              if c.peak_bytes is not None and c.machine_bytes is not None else "")
    cloud = f"{c.provider} " if c.provider != "-" else ""
    return (f"{cloud}{_name(c)}: {duration(c.seconds)}{start}, {fmt_usd(c.cost)}{est}"
            f"{memory} [run {c.run}]")


def render(rec: Recommendation) -> str:
    """The terminal text of ``cloudprof recommend``."""
    lines = [f"Choice:    {describe(rec.choice)}"]
    lines.append(f"Runner-up: {describe(rec.runner_up)}" if rec.runner_up
                 else "Runner-up: none: no other configuration meets the constraints")
    if rec.also_fit:
        lines.append(f"Also fit:  {len(rec.also_fit)} more, dearer: "
                     + ", ".join(_name(c) for c in rec.also_fit))
    if rec.rejected:
        lines.append("Rejected:")
        lines.extend(f"  {_name(c)} [{c.run}]: {'; '.join(c.reasons)}" for c in rec.rejected)
    lines.extend(f"Note: {n}" for n in rec.notes)
    return "\n".join(lines) + "\n"


def recommend_runs(paths: list[Path], deadline_s: float | None, max_cost: float | None,
                   margin: float, total: float | None,
                   question: Question | None = None) -> Recommendation:
    """:func:`recommend` over the stores at ``paths``."""
    return recommend([load_run(p) for p in paths], deadline_s, max_cost, margin, total,
                     question)
