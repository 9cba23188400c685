"""The answer a report opens with: one card per machine, before any table.

A user asks four things of a sweep: how many workers, how fast (or how long one
run takes), what it costs, how much memory to ask for, and, when more workers
stop helping, why. The tables below hold every figure; the card picks, per
machine, the best measured worker count and says those answers in a few lines,
each figure taken from the same model functions the tables use (``summarise``,
``knees``, ``memory_rows``, the profiles), so the card and the tables never
disagree.

"Best" is the fastest measured worker count of the machine: the machine's price
is fixed, so the fastest is also the cheapest per unit (or per run). A job that
reports no units (a fixed-work job: one complete run per trial) is measured by
its median time to complete; every other job by its median units/s.

``AnswerCard`` holds numbers in base units (for ``report --json``) and
``AnswerCard.lines`` the same figures as (label, text) pairs, which every
renderer prints as they are.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from statistics import median
from typing import TYPE_CHECKING, Any

from orchestrator.analysis.model import KNEE_GAIN, spread
from orchestrator.formatting import (
    DASH,
    EST,
    fmt_bytes,
    fmt_pct,
    fmt_rate,
    fmt_usd,
    is_finite,
    n_workers,
)
from orchestrator.results.report.model import (
    LOCAL,
    OK,
    Knee,
    RunData,
    best_row,
    by_host,
    find_knee,
    knees,
    samples,
    summarise,
)
from orchestrator.results.report.values import missing, numeric

if TYPE_CHECKING:
    import pandas as pd

FIXED_WORK = "fixed_work"
SHARE_NAMES = {"gil_wait": "GIL wait", "idle": "idle", "native": "native", "python": "Python"}


@dataclass(frozen=True)
class AnswerCard:
    """The answer for one machine (one --grid point counts as a machine of its own).

    Rates are units/s and ``seconds_per_run`` the median time to complete one run
    (a fixed-work job); ``*_low``/``*_high`` bound the figure by ``interval``
    ("95% CI" or "IQR" of the repeats; None with one repeat). NaN where unknown.
    """

    machine: str
    ran_on: str
    host: str  # the host the trials ran on, with its vCPUs and CPU model when known
    measured_elsewhere: bool  # True: ran on another host than the machine (a dry run: local)
    fixed_work: bool
    unit: str  # "unit", or the job's own unit name ("row", "image")
    workers: int  # the best measured worker count
    repeats: int
    units_per_s: float
    seconds_per_run: float
    low: float  # the interval of units_per_s, or of seconds_per_run for a fixed-work job
    high: float
    interval: str | None
    price_per_hour: float
    cost_per_million_units: float
    cost_per_run: float
    cost_is_estimate: bool
    peak_bytes: float  # whole-lifetime peak at the best worker count (max over its repeats)
    request_bytes: float  # the memory request for it (memory.py)
    request_margin: str  # how the request's margin was chosen
    request_default_margin: bool
    leak_mb_per_s: float  # a leaking job's growth (memory.py): no request, its rate (nan: none)
    machine_peak_bytes: float  # the highest peak at any worker count of the machine
    machine_peak_workers: int | None
    runner_up: int | None  # the next best worker count
    runner_up_within_noise: bool  # True: the repeats cannot tell it from the best
    workers_tested: tuple[int, ...]
    knee_workers: int | None
    knee_reached: bool
    knee: str  # ``Knee.describe()``: the same text as the tables
    vcpus: int | None
    why: str  # why scaling stops, in words (the profile's shares where profiled)
    shares: dict[str, float] | None  # the profile's mean thread-time shares behind ``why``
    whole_job: str = ""  # --total / --target: the whole job's time and cost (whole_job.py)
    # the optimality gap: units/s a plain copy of each unit's bytes allows at ``workers`` on
    # the same host (workloads/bound.py; nan: no such bound), and the rate against
    # ``workers`` x the 1-worker rate (nan: no 1-worker trial)
    bound_units_per_s: float = math.nan
    linear_share: float = math.nan

    def lines(self) -> list[tuple[str, str]]:
        """(label, text) pairs: what every renderer prints, in this order."""
        out = [("Best", self._best()), ("Cost", self._cost()), ("Memory", self._memory()),
               ("Scaling", self._scaling())]
        if self.whole_job:
            out.append(("Whole job", self.whole_job))
        gap = self._gap()
        if gap:
            out.append(("Gap", gap))
        if self.measured_elsewhere:
            out.append(("Hardware", self._hardware()))
        return out

    @property
    def title(self) -> str:
        return f"Answer for {self.machine}"

    def to_dict(self) -> dict[str, Any]:
        """Base units for ``report --json``, with the printed lines beside them."""
        data = asdict(self)
        data["workers_tested"] = list(self.workers_tested)
        data["lines"] = {label.lower(): text for label, text in self.lines()}
        return data

    def _best(self) -> str:
        if self.fixed_work:
            figure = f"{_seconds(self.seconds_per_run)} per run"
        else:
            figure = f"{fmt_rate(self.units_per_s)} {_plural(self.unit)}/s"
        if self.interval is None:
            spread_text = "one repeat: no interval measured; --repeats 3 measures one"
        else:
            bounds = (f"{_seconds(self.low).removesuffix(' s')}–{_seconds(self.high)}"
                      if self.fixed_work else f"{fmt_rate(self.low)}–{fmt_rate(self.high)}")
            spread_text = f"{bounds}, {self.interval} of {self.repeats} repeats"
        text = f"{n_workers(self.workers)}: {figure} ({spread_text})"
        if self.runner_up is not None and self.runner_up_within_noise:
            text += (f"; {n_workers(self.runner_up)} is within noise of it (one more repeat "
                     "could swap them)")
        return text

    def _cost(self) -> str:
        if not is_finite(self.price_per_hour):
            return f"{DASH} (no price known for {self.machine})"
        est = EST if self.cost_is_estimate else ""
        if self.fixed_work:
            figure = f"{fmt_usd(self.cost_per_run)} per run"
        else:
            figure = f"{fmt_usd(self.cost_per_million_units)} per million {_plural(self.unit)}"
        return f"{figure}{est} at {fmt_usd(self.price_per_hour)}/hour"

    def _memory(self) -> str:
        if not is_finite(self.peak_bytes):
            return f"{DASH} (no peak measured)"
        text = f"peak {fmt_bytes(self.peak_bytes)} at {n_workers(self.workers)}"
        if is_finite(self.request_bytes):
            margin = ("default margin: one repeat" if self.request_default_margin
                      else "margin: " + self.request_margin.replace(": ", "; "))
            text += f"; memory request {fmt_bytes(self.request_bytes)} ({margin})"
        elif is_finite(self.leak_mb_per_s):
            text += (f"; no memory request: it leaks, growing {self.leak_mb_per_s:.1f} MB/s "
                     "(a longer run needs more)")
        if (self.machine_peak_workers not in (None, self.workers)
                and is_finite(self.machine_peak_bytes)
                and self.machine_peak_bytes > self.peak_bytes):
            text += (f"; the most at any count: {fmt_bytes(self.machine_peak_bytes)} at "
                     f"{n_workers(self.machine_peak_workers)}")
        return text

    def _scaling(self) -> str:
        if self.knee_reached and self.knee_workers is not None:
            return f"stops at {n_workers(self.knee_workers)}: {self.why}"
        if len(self.workers_tested) < 2:
            return self.why
        return f"not reached: {self.why}"

    def _gap(self) -> str:
        """How far the best rate is from what the hardware allows, where that is measured."""
        parts = []
        if is_finite(self.bound_units_per_s) and self.bound_units_per_s > 0 \
                and is_finite(self.units_per_s):
            parts.append(f"{fmt_pct(self.units_per_s / self.bound_units_per_s)} of the "
                         f"memory-copy bound ({fmt_rate(self.bound_units_per_s)} "
                         f"{_plural(self.unit)}/s: a plain copy of each {self.unit}'s bytes "
                         f"at {n_workers(self.workers)}, measured on the same host)")
        if is_finite(self.linear_share) and self.workers > 1:
            parts.append(f"{fmt_pct(self.linear_share)} of linear scaling from 1 worker "
                         f"(the gap to {self.workers} x the 1-worker "
                         f"{'rate' if not self.fixed_work else 'speed'})")
        return "; ".join(parts)

    def _hardware(self) -> str:
        where = f"this host, {self.host}" if self.ran_on == LOCAL else self.host
        planned = _machine_type(self.machine)
        return (f"measured on {where}, not on the planned {planned}, so times and rates are "
                f"that host's and costs price them at {planned}'s list price (est.). Run "
                "without --dry-run to measure the machine itself.")


def answer_cards(
    run: RunData,
    summary: pd.DataFrame | None = None,
    knee_of: dict[tuple[str, str], Knee] | None = None,
    by_machine: dict[tuple[str, str], dict[int, list[float]]] | None = None,
    memory_found: list[dict[str, Any]] | None = None,
) -> list[AnswerCard]:
    """One card per (machine, ran_on) with an ok trial, in the summary's order.

    ``summary``, ``knee_of``, ``by_machine`` and ``memory_found`` are ``summarise``,
    ``knees``, ``samples`` and ``memory_rows`` of ``run.trials``; a caller that has them
    passes them.
    """
    from orchestrator.results.profiles import load_profiles
    from orchestrator.results.report.memory import memory_rows

    trials = run.trials
    summary = summarise(trials) if summary is None else summary
    if summary.empty:
        return []
    by_machine = samples(trials) if by_machine is None else by_machine
    knee_of = knees(summary, by_machine) if knee_of is None else knee_of
    memory = {(str(r["machine"]), str(r["ran_on"]), int(r["workers"])): r
              for r in (memory_rows(trials) if memory_found is None else memory_found)}
    profiles = load_profiles(run.run_dir)
    ok = trials.loc[trials["status"] == OK, trials.columns.intersection(_CARD_COLUMNS)]
    # one grouping, not a scan per machine
    ok_of = dict(list(ok.groupby([ok["machine"].astype(str), ok["ran_on"].astype(str)])))
    cards = []
    for key, group in by_host(summary):
        mine = ok_of.get(key, ok.iloc[:0])
        card = _card(key, group, mine, knee_of.get(key), by_machine.get(key, {}), memory,
                     profiles)
        if card is not None and getattr(run, "question", None) is not None:
            from orchestrator.results.whole_job import card_text

            card = replace(card, whole_job=card_text(run, mine, card.workers))
        if card is not None:
            cards.append(card)
    return cards


_CARD_COLUMNS = ["machine", "ran_on", "workers", "job_kind", "seconds", "unit", "cpu_model",
                 "bound_units_per_s", "grid", "machine_type", "nodes"]  # what a card reads


def _card(
    key: tuple[str, str], group: pd.DataFrame, trials: pd.DataFrame, knee: Knee | None,
    by_workers: dict[int, list[float]],
    memory: dict[tuple[str, str, int], dict[str, Any]], profiles: list[dict[str, Any]],
) -> AnswerCard | None:
    machine, ran_on = key
    fixed = bool(len(trials)) and "job_kind" in trials.columns \
        and bool((trials["job_kind"] == FIXED_WORK).all())
    seconds = _seconds_by_workers(trials) if fixed else {}
    if fixed:
        if not seconds:
            return None
        workers = min(seconds, key=lambda w: (median(seconds[w]), w))
        best = group[group["workers"] == workers].to_dict("records")[0]
        sp = spread(seconds[workers])
        tested = sorted(seconds)
        # the knee of runs per second, the same rule as units/s (``knee_point``)
        knee = find_knee(tested, [1.0 / median(seconds[w]) for w in tested])
    else:
        if group["units_per_s"].isna().all():
            return None
        best = best_row(group)
        workers = int(best["workers"])
        sp = None
        tested = sorted(int(w) for w in group["workers"])
        knee = knee if knee is not None else find_knee(tested, group["units_per_s"].tolist())
    groups = seconds if fixed else {int(w): [float(u)] for w, u in zip(
        group["workers"], group["units_per_s"], strict=True) if is_finite(u)}
    if not fixed:
        groups.update(by_workers)
    runner_up, noise = _runner_up(groups, workers, higher_is_better=not fixed)
    if sp is not None:  # a fixed-work job: the spread of its times to complete
        repeats = sp.n
        low, high, interval = (sp.low, sp.high, sp.method) if sp.n > 1 else \
            (math.nan, math.nan, None)
    else:  # the results table's own spread of units/s
        repeats = int(best["repeats"])
        low, high = _num(best["units_per_s_low"]), _num(best["units_per_s_high"])
        interval = best["spread_method"] if repeats > 1 else None
    estimate = machine != ran_on
    price = float(best["price_per_hour"]) if is_finite(best["price_per_hour"]) else math.nan
    per_run = median(seconds[workers]) if fixed else math.nan
    mem = memory.get((machine, ran_on, workers)) or {}
    peaks = [(float(p), int(w)) for p, w in zip(group["peak_rss_bytes"], group["workers"],
                                                 strict=True) if is_finite(p)]
    top_peak, top_workers = max(peaks, key=lambda p: (p[0], -p[1])) if peaks else (math.nan, None)
    vcpus = int(best["vcpus"]) if is_finite(best["vcpus"]) else None
    shares, where = _profile_shares(profiles, machine, knee)
    units = sorted({str(u) for u in trials.get("unit", ()) if isinstance(u, str) and u})
    unit = units[0] if len(units) == 1 else "unit"
    return AnswerCard(
        machine=machine, ran_on=ran_on, host=_host(trials, ran_on, vcpus),
        measured_elsewhere=estimate, fixed_work=fixed,
        unit=unit,
        workers=workers, repeats=repeats,
        units_per_s=math.nan if fixed else float(best["units_per_s"]),
        seconds_per_run=per_run, low=low, high=high, interval=interval,
        price_per_hour=price,
        cost_per_million_units=math.nan if fixed else _num(best["cost_per_million_units"]),
        cost_per_run=price * per_run / 3600.0 if fixed else math.nan,
        cost_is_estimate=estimate,
        peak_bytes=_num(mem.get("peak_rss_bytes", best["peak_rss_bytes"])),
        request_bytes=_num(mem.get("request_bytes")),
        request_margin=str(mem.get("margin_method") or ""),
        request_default_margin=bool(mem.get("margin_is_default")),
        leak_mb_per_s=_num((mem.get("leak") or {}).get("slope_mb_per_s")),
        machine_peak_bytes=top_peak, machine_peak_workers=top_workers,
        runner_up=runner_up, runner_up_within_noise=noise,
        workers_tested=tuple(tested),
        knee_workers=knee.workers if knee.reached else None, knee_reached=knee.reached,
        knee=knee.describe(), vcpus=vcpus,
        why=_why(knee, shares, where, vcpus, group,
                 "runs per hour" if fixed else f"{_plural(unit)}/s"),
        shares=shares,
        bound_units_per_s=_bound(trials, workers),
        linear_share=_num(best["efficiency"]) if "efficiency" in group.columns else math.nan,
    )


def _bound(trials: pd.DataFrame, workers: int) -> float:
    """The median copy bound of the trials at ``workers`` (nan where none carries one)."""
    import numpy as np

    bound = numeric(trials, "bound_units_per_s")
    return float(bound[(trials["workers"] == workers) & np.isfinite(bound)].median())


def _runner_up(groups: dict[int, list[float]], best: int,
               higher_is_better: bool) -> tuple[int | None, bool]:
    """The next best worker count by median, and whether the repeats tell it from the best
    (:func:`orchestrator.analysis.model.within_noise`, as the headlines' runner-up)."""
    from orchestrator.analysis.model import within_noise

    others = {w: v for w, v in groups.items() if w != best and v}
    if best not in groups or not others:
        return None, False
    sign = -1.0 if higher_is_better else 1.0
    runner = min(others, key=lambda w: (sign * median(others[w]), w))
    return runner, bool(within_noise(groups[best], others[runner]))


def _seconds_by_workers(trials: pd.DataFrame) -> dict[int, list[float]]:
    """Worker count → time to complete of each ok fixed-work repeat."""
    out: dict[int, list[float]] = {}
    for w, s in zip(trials["workers"], numeric(trials, "seconds"), strict=True):
        if math.isfinite(s) and s > 0:
            out.setdefault(int(w), []).append(s)
    return dict(sorted(out.items()))


def _profile_shares(
    profiles: list[dict[str, Any]], machine: str, knee: Knee
) -> tuple[dict[str, float] | None, str]:
    """The mean thread-time shares of the machine's profiled trials above the knee (else at
    the largest profiled count), the rule of ``profiles.dominant_cause``; (None, "") without."""
    base = machine.split(" · ", 1)[0]  # a --grid point's profiled trial names the machine
    usable = [r for r in profiles
              if str(r.get("machine")) in (machine, base)
              and (r.get("profile") or {}).get("status") == "ok"
              and isinstance(r["profile"].get("shares"), dict)
              and all(k in r["profile"]["shares"] for k in SHARE_NAMES)]
    if not usable:
        return None, ""
    above = [r for r in usable if knee.reached and knee.workers is not None
             and int(r["workers"]) > knee.workers]
    if above:
        chosen, where = above, f"above {n_workers(int(knee.workers or 0))}"
    else:
        top = max(int(r["workers"]) for r in usable)
        chosen, where = [r for r in usable if int(r["workers"]) == top], f"at {n_workers(top)}"
    shares = {k: sum(float(r["profile"]["shares"][k]) for r in chosen) / len(chosen)
              for k in SHARE_NAMES}
    return shares, where


def _why(knee: Knee, shares: dict[str, float] | None, where: str, vcpus: int | None,
         group: pd.DataFrame, measure: str) -> str:
    """Why scaling stops: the profile's shares when profiled, else what the measurements say;
    ``measure`` names the rate the knee is found on ("cubes/s", "runs per hour")."""
    if len(knee.tested) < 2:
        return "one worker count tested: sweep several (--workers 1,2,4) to see where it stops"
    if not knee.reached or knee.workers is None:
        reason = (f"{measure} still rose up to {n_workers(max(knee.tested))}, the largest "
                  "tested; try larger counts")
    else:
        larger = [w for w in knee.tested if w > knee.workers]
        reason = (f"no larger count ({', '.join(map(str, larger))}) gains more than "
                  f"{KNEE_GAIN:.0%} in median {measure}")
        if vcpus is not None and knee.workers >= vcpus:
            reason += f"; the host has {vcpus} vCPUs"
        else:
            cpu = group.loc[group["workers"] == knee.workers, "cpu_utilisation"].dropna()
            if len(cpu):
                reason += f"; the host's CPUs were {fmt_pct(cpu.iloc[0])} busy there"
    r = knee.range
    if r is not None and not r.stable and (r.low is not None or r.high is not None):
        low = "1" if r.low is None else str(r.low)
        high = "beyond the largest count" if r.high is None else str(r.high)
        reason += (f" (not sure: in 95% of resamples of the repeats it stops anywhere from "
                   f"{low} to {high})")
    if shares is None:
        return reason + (". --profile gil shows where the thread time goes"
                         if knee.reached else "")
    parts = ", ".join(f"{SHARE_NAMES[k]} {fmt_pct(shares[k])}"
                      for k in ("gil_wait", "idle", "native"))
    return f"{reason}. Profiled {where}: {parts} of thread time (py-spy)"


def _host(trials: pd.DataFrame, ran_on: str, vcpus: int | None) -> str:
    """ "local (2 vCPUs, AMD EPYC 7B13)": the host behind the measurements."""
    facts = [f"{vcpus} vCPUs"] if vcpus is not None else []
    if "cpu_model" in trials.columns:
        models = trials["cpu_model"].dropna()
        if len(models):
            facts.append(str(models.iloc[0]))
    return f"{ran_on} ({', '.join(facts)})" if facts else ran_on


def _plural(unit: str) -> str:
    """ "cubes" for a unit named "cube" (a name already plural is kept)."""
    return unit if unit.endswith("s") else f"{unit}s"


def _machine_type(machine: str) -> str:
    return machine.split(" · ", 1)[0]


def _num(value: Any) -> float:
    return float(value) if not missing(value) and is_finite(value) else math.nan


def _seconds(value: Any) -> str:
    """ "4.21 s", "93.0 s", "2.5 min": a time to complete."""
    if not is_finite(value):
        return DASH
    s = float(value)
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"
