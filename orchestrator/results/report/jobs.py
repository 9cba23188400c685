"""The report's view of a user's job: --grid points, fixed-work runs and phases.

Self-contained on purpose: ``report.py`` calls :func:`label_grid` once when it
loads a run and appends :func:`job_tables`; everything here reads only the
trials table (``grid``, ``job_kind``, ``phases``, ``cpu_seconds`` columns).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from orchestrator.results.report.values import numeric

if TYPE_CHECKING:
    import pandas as pd

    from orchestrator.results.report.table import Table


def grid_label(text: Any) -> str:
    """``rows=1000 features=10`` from the trial's JSON grid ("" without a grid)."""
    if not isinstance(text, str) or not text:
        return ""
    try:
        values = json.loads(text)
    except ValueError:
        return ""
    return " ".join(f"{k}={v}" for k, v in values.items()) if isinstance(values, dict) else ""


def label_grid(trials: pd.DataFrame) -> pd.DataFrame:
    """Make each --grid point a "machine" of its own in the report's tables.

    Every table groups by machine and host; a grid point is a separate scaling
    curve (its own knee, efficiency, peak), so it is shown as
    ``machine · rows=1000`` instead of being folded into the machine's medians.
    """
    if "grid" not in trials.columns:
        return trials
    labels = trials["grid"].map(grid_label)
    if not (labels != "").any():
        return trials
    # machine_type: the planned machine, before the label
    return trials.assign(machine_type=trials["machine"], machine=[
        f"{m} · {g}" if g else m for m, g in zip(trials["machine"], labels, strict=True)])


def _grid_values(text: Any) -> dict[str, str]:
    try:
        values = json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in values.items()} if isinstance(values, dict) else {}


def _grid_tables(ok: pd.DataFrame) -> list[Table]:
    """One table per --grid name: peak memory and speed against its values, per machine."""
    from orchestrator.formatting import fmt_bytes, fmt_rate
    from orchestrator.results.report.table import Row, Table

    if "machine_type" not in ok.columns or ok.empty:
        return []
    points = ok["grid"].map(_grid_values)
    names = list(dict.fromkeys(k for p in points for k in p))
    tables = []
    for name in names:
        frame = ok.assign(_value=points.map(lambda p, n=name: p.get(n))).dropna(subset=["_value"])
        rows = []
        for (machine, value), group in frame.groupby(["machine_type", "_value"], sort=False,
                                                      dropna=False):
            if (group["job_kind"] == "fixed_work").all():
                speed = _seconds(numeric(group, "seconds").median())
            else:
                speed = fmt_rate(numeric(group, "units_per_s").max())
            rows.append(Row([str(machine), str(value), str(len(group)),
                             fmt_bytes(numeric(group, "peak_rss_bytes").max()), speed]))
        rows.sort(key=lambda r: (r.cells[0], _number(r.cells[1])))
        tables.append(Table(
            f"Grid: {name}", ["machine", name, "trials", "peak RSS", "best units/s or time"],
            rows, ["Over every other grid value and worker count: peak RSS is the max; the last "
                   "column is the best units/s, or for a fixed-work job the median time to "
                   "complete."]))
    return tables


def _number(text: str) -> tuple[int, float | str]:
    try:
        return (0, float(text))
    except ValueError:
        return (1, text)


def describe_command(spec: dict[str, Any], trials: pd.DataFrame) -> str:
    """ "command `python fit.py {rows}`, 1 unit = 1 row, run to completion": a job's line."""
    text = f"command `{spec['command']}`"
    if spec.get("workdir"):
        text += f" in a copy of {spec['workdir']}"
    units = sorted({u for u in trials.get("unit", ()) if isinstance(u, str) and u})
    if len(units) == 1:
        text += f", 1 unit = 1 {units[0]}"
    stop = spec.get("stop_after_s")
    text += f", stopped after {float(stop):g} s" if stop else ", each trial one complete run"
    return text


def _phases(text: Any) -> list[dict[str, Any]]:
    if not isinstance(text, str) or not text:
        return []
    try:
        data = json.loads(text)
    except ValueError:
        return []
    return data if isinstance(data, list) else []


def job_tables(trials: pd.DataFrame) -> list[Table]:
    """The fixed-work table and the phase table, when the run has such trials."""
    from orchestrator.formatting import fmt_bytes, fmt_usd
    from orchestrator.results.report.table import Row, Table

    if trials.empty or "job_kind" not in trials.columns:
        return []
    ok = trials[trials["status"] == "ok"]
    tables = _grid_tables(ok)
    fixed = ok[ok["job_kind"] == "fixed_work"]
    if len(fixed):
        rows = []
        for (machine, workers), group in fixed.groupby(["machine", "workers"], sort=True,
                                                       dropna=False):
            seconds = numeric(group, "seconds").median()
            price = group["price_per_hour"].dropna()
            cost = float(price.iloc[0]) * seconds / 3600.0 if len(price) else None
            estimate = (group["cost_is_estimate"].isna() | group["cost_is_estimate"].astype(bool)
                        ).any() if "cost_is_estimate" in group.columns else True
            cpu = numeric(group, "cpu_seconds").dropna()
            rows.append(Row([str(machine), str(int(workers)), str(len(group)),
                             _seconds(seconds),
                             f"{cpu.median():.1f} s" if len(cpu) else "–",
                             fmt_bytes(numeric(group, "peak_rss_bytes").max()),
                             fmt_usd(cost, estimate=estimate)]))
        tables.append(Table(
            "Fixed-work job: one complete run per trial (it reported no units)",
            ["machine", "workers", "n", "time to complete", "CPU time", "peak RSS",
             "cost per run"], rows,
            ["time to complete and CPU time are medians over repeats; peak RSS their max.",
             "cost per run = $/hour of the planned machine × time to complete; (est.) when "
             "the trial ran elsewhere (a dry run)."]))
    rows = []
    with_phases = ok.loc[ok["phases"].notna(), ["machine", "workers", "repeat", "phases",
                                                 "peak_rss_bytes"]] \
        if "phases" in ok.columns else ok.iloc[:0]
    for trial in with_phases.sort_values(["machine", "workers", "repeat"]).to_dict("records"):
        phases = _phases(trial.get("phases"))
        peak = float(trial["peak_rss_bytes"]) if trial.get("peak_rss_bytes") else None
        for phase in phases:
            p_peak = phase.get("peak_rss_bytes")
            share = f"{100.0 * p_peak / peak:.0f}%" if p_peak and peak else "–"
            cpu = phase.get("cpu_s")
            rate = phase.get("units_per_s")
            rows.append(Row([str(trial["machine"]), str(int(trial["workers"])),
                             str(int(trial["repeat"])), str(phase.get("name")),
                             _seconds(phase.get("wall_s")),
                             f"{cpu:.2f} s" if cpu is not None else "–",
                             fmt_bytes(p_peak), share,
                             f"{rate:,.1f}" if phase.get("units") else "–"]))
    if rows:
        tables.append(Table(
            "Phases (from the job's cloudprof:phase lines)",
            ["machine", "workers", "repeat", "phase", "wall time", "CPU time", "peak RSS",
             "% of trial peak", "units/s"], rows,
            ["A phase's peak RSS is the highest sample of the process tree while it ran "
             "(and a reading at its start); % of trial peak compares it with the trial's "
             "peak, so the phase that sets the peak shows ~100%.",
             "CPU time: the tree's CPU at the phase's end minus at its start (/proc); "
             "units/s: the units reported during the phase over its wall time."]))
    return tables


def _seconds(value: Any) -> str:
    try:
        s = float(value)
    except (TypeError, ValueError):
        return "–"
    if s != s:
        return "–"
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"
