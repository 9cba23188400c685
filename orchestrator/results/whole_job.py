"""A run's answer at the user's own scale: the forecast at a data size, the whole job's time
and cost.

A sweep measures a job at a few sizes (``--grid rows=...``) for a short while; the user
asks what their real job will take: ``--target rows=4000000`` (the size they have) and
``--total 1000000`` (the units, or runs of a fixed-work job, they must get through). This
module reads the run's trials, groups them per configuration (the planned machine, the host
it ran on, workers, nodes and any other grid values) and asks ``forecast`` (the maths) for
time per run (a fixed-work job), seconds per unit (a job that reports units) and peak
memory at the target. The whole job is then, per configuration:

* its VM start as measured in this sweep (sweep.json's ``vms``: asking for the VM to its
  inputs staged; boot, bootstrap and staging; small on a dry run, which starts no VM);
* plus the work: the runs × time per run, or the units ÷ units/s, at the measured rate (its
  repeats' interval) or at the forecast one (its bootstrap interval);
* billed per second with a one-minute minimum for every VM of it (both clouds bill so).

Every figure is labelled with where it comes from: ``basis`` "measured" or "forecast".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UsageError
from orchestrator.formatting import fmt_bytes, fmt_usd
from orchestrator.results.report.jobs import _grid_values as _grid  # one reader of a grid
from orchestrator.results.report.model import OK, RunData
from orchestrator.results.report.values import missing, number

if TYPE_CHECKING:
    import pandas as pd

MIN_BILLED_S = 60.0  # per-second billing with a one-minute minimum (GCE and EC2 Linux)


@dataclass
class Question:
    """What the user asked beyond the sweep: a target size and/or the job's total work."""

    target: float | None = None
    size: str | None = None  # the size variable (--size, the target's NAME=, or inferred)
    total: float | None = None
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def asked(self) -> bool:
        return self.target is not None or self.total is not None


def parse_target(text: str) -> tuple[str | None, float]:
    """``rows=4000000`` → ("rows", 4e6); ``4e6`` → (None, 4e6). One line on bad input."""
    name, _, raw = str(text).rpartition("=")
    try:
        value = float(raw.replace(",", "").replace("_", ""))
    except ValueError:
        raise UsageError(f"--target: expected NAME=SIZE or SIZE such as rows=4000000, got "
                         f"{text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"--target: the size must be more than 0, got {text!r}")
    return (name.strip() or None), value


def question(target: str | None, size: str | None, total: float | None) -> Question | None:
    """The report's question from its flags (None when none was given), checked up front."""
    if target is None and total is None:
        if size is not None:
            raise UsageError("--size names the variable of --target: give --target SIZE too")
        return None
    if total is not None and (not math.isfinite(total) or total <= 0):
        raise UsageError("--total must be more than 0")
    name, value = parse_target(target) if target is not None else (None, None)
    if name and size and name != size:
        raise UsageError(f"--target names {name} but --size says {size}: give one")
    return Question(target=value, size=name or size, total=total)


def billed_cost(seconds: float, price_per_hour: float) -> float:
    """USD for ``seconds`` of VMs costing ``price_per_hour`` together (a --nodes trial's price
    is that of all its VMs), each billed per second with a one-minute minimum."""
    return math.ceil(max(seconds, MIN_BILLED_S)) * price_per_hour / 3600.0


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def size_name(run: RunData, asked: str | None) -> str:
    """The grid variable that is a size: the one named, else the only numeric one."""
    grids = [_grid(g) for g in run.trials.get("grid", ())]
    names = list(dict.fromkeys(k for g in grids for k in g))
    numeric = [n for n in names if all(_number(g[n]) is not None for g in grids if n in g)]
    if asked is not None:
        if asked not in names:
            shown = ", ".join(names) or "none"
            raise UsageError(f"--target: {run.run_dir} has no --grid variable {asked} "
                             f"(its grid: {shown})")
        if asked not in numeric:
            raise UsageError(f"--target: --grid {asked} has values that are not sizes "
                             "(positive numbers)")
        return asked
    if len(numeric) == 1:
        return numeric[0]
    if not numeric:
        raise UsageError(f"--target: {run.run_dir} swept no numeric --grid variable to forecast "
                         "along (sweep with e.g. --grid rows=1000,2000,4000)")
    raise UsageError(f"--target: several --grid variables are numbers ({', '.join(numeric)}): "
                     "say which is the size, e.g. --target rows=4000000 or --size rows")


def _nodes(row: dict[str, Any]) -> int:
    value = row.get("nodes")
    return 1 if missing(value) else int(value)


def _config(row: dict[str, Any], size: str | None) -> tuple[str, str, int, int, str]:
    """(machine, ran_on, workers, nodes, other grid values): one configuration."""
    machine = row.get("machine_type") if not missing(row.get("machine_type")) else row["machine"]
    grid = _grid(row.get("grid"))
    if size is None:  # each grid point is a configuration of its own, as the report shows
        machine = row["machine"]
        grid = {}
    other = " ".join(f"{k}={v}" for k, v in grid.items() if k != size)
    return str(machine), str(row["ran_on"]), int(row["workers"]), _nodes(row), other


def _label(key: tuple[str, str, int, int, str]) -> str:
    machine, _ran_on, workers, nodes, other = key
    text = f"{machine}{' · ' + other if other else ''} × {workers}"
    return text + (f" × {nodes} VMs" if nodes > 1 else "")


def _fixed_work(rows: list[dict[str, Any]]) -> bool:
    return bool(rows) and all(r.get("job_kind") == "fixed_work" for r in rows)


def _per_unit_seconds(rows: list[dict[str, Any]], fixed: bool) -> list[float]:
    """Each ok repeat's seconds per run (a fixed-work job) or per unit (1 / units/s)."""
    if fixed:
        return [s for r in rows if math.isfinite(s := number(r.get("seconds"))) and s > 0]
    return [1.0 / u for r in rows if math.isfinite(u := number(r.get("units_per_s"))) and u > 0]


def _ok_rows(run: RunData) -> list[dict[str, Any]]:
    """The trials that finished ok, a row at a time: a configuration's key reads the grid."""
    trials = run.trials
    columns = trials.columns.intersection(["machine", "machine_type", "ran_on", "workers", "nodes",
                                           "grid", "job_kind", "seconds", "units_per_s",
                                           "peak_rss_bytes", "price_per_hour"])
    return trials.loc[trials["status"] == OK, columns].to_dict("records")


def forecasts(run: RunData, q: Question) -> list[dict[str, Any]]:
    """One entry per configuration: time and peak memory at ``q.target`` (see the module)."""
    if q.target is None:
        return []
    if "forecasts" in q._cache:
        return q._cache["forecasts"]
    from orchestrator.results import forecast as maths

    size = size_name(run, q.size)
    q.size = size
    groups: dict[tuple[str, str, int, int, str], dict[float, list[dict[str, Any]]]] = {}
    for r in _ok_rows(run):
        if size not in _grid(r.get("grid")):
            continue
        n = _number(_grid(r.get("grid"))[size])
        if n is not None:
            groups.setdefault(_config(r, size), {}).setdefault(n, []).append(r)
    out = []
    for key, by_size in sorted(groups.items()):
        rows = [r for rs in by_size.values() for r in rs]
        fixed = _fixed_work(rows)
        times, peaks = {}, {}
        for n, rs in by_size.items():
            per = _per_unit_seconds(rs, fixed)
            if per:
                times[n] = median(per)
            peak = max((p for r in rs if (p := number(r.get("peak_rss_bytes"))) == p),
                       default=math.nan)
            if math.isfinite(peak) and peak > 0:
                peaks[n] = peak
        entry = _entry(key, size, q.target, fixed, maths, times, peaks, rows)
        if entry is not None:
            out.append(entry)
    q._cache["forecasts"] = out
    return out


def _entry(key: tuple[str, str, int, int, str], size: str, target: float, fixed: bool,
           maths: Any, times: dict[float, float], peaks: dict[float, float],
           rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One configuration's forecast as report --json holds it (None: under two sizes)."""
    if len(times) < 2 and len(peaks) < 2:
        return None
    machine, ran_on, workers, nodes, other = key
    t = maths.forecast(list(times), list(times.values()), target) if len(times) > 1 else None
    p = maths.forecast(list(peaks), list(peaks.values()), target) if len(peaks) > 1 else None
    measured = sorted(set(times) | set(peaks))
    extrapolation = target / max(measured)
    prices = [float(r["price_per_hour"]) for r in rows if not missing(r.get("price_per_hour"))]
    entry: dict[str, Any] = {
        "machine": machine, "ran_on": ran_on, "workers": workers, "nodes": nodes,
        "grid": other or None, "label": _label(key), "size_name": size, "size": target,
        "sizes_measured": measured, "fixed_work": fixed,
        # what was fitted: per size, the median time (per run or per unit) and the max peak
        "points": [{"size": n, ("seconds" if fixed else "seconds_per_unit"): times.get(n),
                    "peak_rss_bytes": peaks.get(n)} for n in measured],
        "seconds": t.value if t and fixed else None,
        "seconds_low": t.low if t and fixed else None,
        "seconds_high": t.high if t and fixed else None,
        "units_per_s": 1.0 / t.value if t and not fixed else None,
        "units_per_s_low": 1.0 / t.high if t and not fixed else None,
        "units_per_s_high": 1.0 / t.low if t and not fixed else None,
        "peak_rss_bytes": p.value if p else None,
        "peak_rss_low": p.low if p else None,
        "peak_rss_high": p.high if p else None,
        "model": t.fit.describe() if t else None,
        "peak_model": p.fit.describe() if p else None,
        "cv_error": t.cv_error if t else None,
        "peak_cv_error": p.cv_error if p else None,
        "cross_validated": bool(t and t.cross_validated),
        "extrapolation": extrapolation,
        "beyond_10x": extrapolation > maths.FAR,
        "price_per_hour": prices[0] if prices else None,
        "estimate": str(machine) != str(ran_on),
    }
    return entry


def vm_start_seconds(sweep: dict[str, Any]) -> dict[str, float]:
    """Machine type → median measured seconds from asking for a VM to its inputs staged
    (boot, bootstrap, staging), from sweep.json's ``vms``."""
    from orchestrator.results.report.model import parse_time

    spans: dict[str, list[float]] = {}
    for vm in (sweep.get("vms") or {}).values():
        if not isinstance(vm, dict):
            continue
        start = parse_time(vm.get("requested_at") or vm.get("created_at"))
        staged = parse_time(vm.get("inputs_staged_at"))
        if start is not None and staged is not None and staged >= start and vm.get("machine"):
            spans.setdefault(str(vm["machine"]), []).append((staged - start).total_seconds())
    return {m: median(s) for m, s in spans.items()}


def _work(run: RunData, q: Question) -> list[dict[str, Any]]:
    """Per configuration: seconds per run or per unit (value, low, high), measured or forecast."""
    from orchestrator.analysis.model import spread

    if q.target is not None:
        out = []
        for e in forecasts(run, q):
            if e["fixed_work"] and e["seconds"] is not None:
                per = (e["seconds"], e["seconds_low"], e["seconds_high"])
            elif e["units_per_s"] is not None:
                per = (1.0 / e["units_per_s"], 1.0 / e["units_per_s_high"],
                       1.0 / e["units_per_s_low"])
            else:
                continue
            out.append({**{k: e[k] for k in ("machine", "ran_on", "workers", "nodes", "grid",
                                             "label", "fixed_work", "price_per_hour",
                                             "estimate")}, "per": per, "basis": "forecast"})
        return out
    groups: dict[tuple[str, str, int, int, str], list[dict[str, Any]]] = {}
    for r in _ok_rows(run):
        groups.setdefault(_config(r, None), []).append(r)
    out = []
    for key, rows in sorted(groups.items()):
        fixed = _fixed_work(rows)
        sp = spread(_per_unit_seconds(rows, fixed))
        if sp is None:
            continue
        low, high = (sp.low, sp.high) if sp.n > 1 else (sp.median, sp.median)
        prices = [p for r in rows if math.isfinite(p := number(r.get("price_per_hour")))]
        machine, ran_on, workers, nodes, _ = key
        base = next((str(r["machine_type"]) for r in rows
                     if not missing(r.get("machine_type"))), machine)
        out.append({"machine": machine, "ran_on": ran_on, "workers": workers, "nodes": nodes,
                    "grid": None, "label": _label(key), "fixed_work": fixed,
                    "price_per_hour": prices[0] if prices else None,
                    "estimate": base != ran_on, "base": base,
                    "per": (sp.median, low, high), "basis": "measured"})
    return out


def totals(run: RunData, q: Question) -> list[dict[str, Any]]:
    """One entry per configuration: the whole job's wall time and dollars (see the module).

    The amount is ``q.total`` (units, or runs of a fixed-work job; one run at the target size
    when only a target was given). A job that reports units needs ``--total``: without it
    there is no whole job to price, and the list is empty.
    """
    if not q.asked:
        return []
    if "totals" in q._cache:
        return q._cache["totals"]
    starts = vm_start_seconds(run.sweep)
    out = []
    for w in _work(run, q):
        if not w["fixed_work"] and q.total is None:
            continue
        amount = q.total if q.total is not None else 1.0
        base = w.pop("base", w["machine"])
        start = starts.get(str(base).split(" · ", 1)[0])
        per, per_low, per_high = w.pop("per")
        lead = start or 0.0
        seconds = (lead + amount * per, lead + amount * per_low, lead + amount * per_high)
        price = w["price_per_hour"]  # a --nodes trial's is the price of all its VMs
        cost = [billed_cost(s, price) if price is not None else None for s in seconds]
        out.append({**w, "amount": amount,
                    "amount_unit": "runs" if w["fixed_work"] else _unit(run),
                    "size_name": q.size if q.target is not None else None,
                    "size": q.target, "start_s": start, "work_s": amount * per,
                    "seconds": seconds[0], "seconds_low": seconds[1], "seconds_high": seconds[2],
                    "cost_usd": cost[0], "cost_low": cost[1], "cost_high": cost[2]})
    q._cache["totals"] = out
    return out


def _unit(run: RunData) -> str:
    units = sorted({str(u) for u in run.trials.get("unit", ()) if isinstance(u, str) and u})
    return f"{units[0]}s" if len(units) == 1 and not units[0].endswith("s") else \
        (units[0] if len(units) == 1 else "units")


def duration(seconds: float) -> str:
    """ "4.21 s", "93.0 s", "8.4 min", "2.5 h": a time in the unit that reads best."""
    if seconds < 120:
        return f"{seconds:.1f} s" if seconds >= 10 else f"{seconds:.2f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _span(low: float, high: float) -> str:
    """ "[8.1–8.8 min]" in one unit: the unit of the high end."""
    text = duration(high)
    value, unit = text.split(" ", 1)
    scale = {"s": 1.0, "min": 60.0, "h": 3600.0}[unit]
    digits = len(value.split(".")[1]) if "." in value else 0
    shown = f"{low / scale:.{digits}f}"
    return "(no spread measured)" if shown == value else f"[{shown}–{value} {unit}]"


def _amount(t: dict[str, Any]) -> str:
    """ "1,000,000 cubes", "20 runs", "1 run at n=100,000"."""
    amount = t["amount"]
    unit = t["amount_unit"]
    if unit == "runs" and amount == 1:
        unit = "run"
    text = f"{amount:,.0f} {unit}" if float(amount).is_integer() else f"{amount:,g} {unit}"
    if t.get("size") is not None:
        text += f" at {t['size_name']}={t['size']:,.0f}"
    return text


def total_text(t: dict[str, Any]) -> str:
    """ "1,000,000 cubes: 8.4 min [8.1–8.8 min], $0.62 on n2-highcpu-80 × 60": one line."""
    cost = DASH_COST
    if t["cost_usd"] is not None:
        low, high = fmt_usd(t["cost_low"]), fmt_usd(t["cost_high"])
        cost = fmt_usd(t["cost_usd"]) + ("" if low == high else f" [{low}–{high}]") \
            + (" (est.)" if t["estimate"] else "")
    start = (f"incl. {duration(t['start_s'])} VM start" if t["start_s"] is not None
             else "VM start not measured")
    return (f"{_amount(t)}: {duration(t['seconds'])} {_span(t['seconds_low'], t['seconds_high'])}"
            f", {cost} on {t['label']} ({t['basis']}; {start})")


DASH_COST = "– (no price known)"


def forecast_text(e: dict[str, Any]) -> str:
    """One configuration's forecast in a line, with where it comes from."""
    parts = []
    if e["seconds"] is not None:
        parts.append(f"{duration(e['seconds'])} per run "
                     f"{_span(e['seconds_low'], e['seconds_high'])}")
    elif e["units_per_s"] is not None:
        parts.append(f"{e['units_per_s']:,.4g} units/s [{e['units_per_s_low']:,.4g}–"
                     f"{e['units_per_s_high']:,.4g}]")
    if e["peak_rss_bytes"] is not None:
        parts.append(f"peak {fmt_bytes(e['peak_rss_bytes'])} [{fmt_bytes(e['peak_rss_low'])}–"
                     f"{fmt_bytes(e['peak_rss_high'])}]")
    models = f"time: {e['model'] or '–'}, peak: {e['peak_model'] or '–'}"
    checked = "" if e["cross_validated"] else "; too few sizes to cross-validate"
    return (f"{e['size_name']}={e['size']:,.0f} on {e['label']}: {', '.join(parts)} "
            f"({models}; {e['extrapolation']:.1f}× the largest measured size{checked})")


def warnings(run: RunData, q: Question) -> list[str]:
    """The loud lines: a target far beyond the measured sizes."""
    from orchestrator.results.forecast import FAR

    far = [e for e in forecasts(run, q) if e["beyond_10x"]]
    if not far:
        return []
    worst = max(far, key=lambda e: e["extrapolation"])
    return [f"WARNING: {q.size}={q.target:,.0f} is {worst['extrapolation']:.0f}× the largest "
            f"measured size ({max(worst['sizes_measured']):,.0f}), beyond the {FAR:.0f}× a "
            "forecast can be trusted to: a growth law seen over the measured sizes need not "
            "hold that far (caches, swapping, a different algorithm). Sweep a larger size."]


def render_lines(run: RunData, q: Question) -> list[str]:
    """What the terminal prints after the report: forecasts, warnings, whole-job figures."""
    lines = []
    fc = forecasts(run, q)
    if q.target is not None:
        lines.append("Forecast (fitted to the measured sizes; intervals: bootstrap 95%):")
        lines.extend(f"  {forecast_text(e)}" for e in fc)
        if not fc:
            lines.append("  none: no configuration was measured at two sizes or more")
        lines.extend(warnings(run, q))
    tot = totals(run, q)
    if tot:
        lines.append("Whole job (VM start as measured + the work, billed per second, "
                     "one-minute minimum per VM):")
        lines.extend(f"  {total_text(t)}" for t in sorted(tot, key=lambda t: t["cost_usd"]
                                                           if t["cost_usd"] is not None
                                                           else math.inf))
    elif q.total is None and any(not e["fixed_work"] for e in fc):
        lines.append("Whole job: give --total N (the units the job has) to price it")
    return lines


def card_text(run: RunData, trials: pd.DataFrame, workers: int) -> str:
    """The answer card's "Whole job" line for the card's machine at ``workers``: its
    configuration's total on one VM and on each measured node count; "" when not asked.

    With a target size the card of the largest measured size carries the forecast's total.
    """
    q = run.question
    if q is None or not q.asked or not len(trials):
        return ""
    row = {**trials.iloc[:1].to_dict("records")[0], "workers": workers}
    fc = forecasts(run, q)  # resolves q.size
    size = q.size if q.target is not None else None
    machine, ran_on, _, _, other = _config(row, size)
    if size is not None:
        entry = next((e for e in fc if (e["machine"], e["ran_on"], e["workers"], e["grid"] or "")
                      == (machine, ran_on, workers, other)), None)
        if entry is None or _number(_grid(row.get("grid")).get(size, "")) \
                != max(entry["sizes_measured"]):
            return ""  # the card of the largest measured size carries the forecast
    mine = sorted((t for t in totals(run, q)
                   if (t["machine"], t["ran_on"], t["workers"], t["grid"] or "")
                   == (machine, ran_on, workers, other)), key=lambda t: t["nodes"])
    return "; ".join(total_text(t) for t in mine)
