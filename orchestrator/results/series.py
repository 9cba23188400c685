"""A trial's time series as the figures draw it: read, thinned, in long form.

Data only (pandas and numpy, no plotting library), so ``plots`` draws it and a notebook or
a test reads the very numbers a figure shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.formatting import is_finite
from orchestrator.results import report as rpt

MAX_POINTS_PER_TRIAL = 300
"""A time series is thinned to at most this many samples per trial (its peak always kept),
and fewer when a run has many trials (``MAX_TIMELINE_POINTS`` in all): a 10 Hz sampler's
thousands of samples draw no better than a few hundred, and a report must open at once."""


def frame(table: pd.DataFrame) -> pd.DataFrame:
    """A report table (or a notebook's frame) as a pandas frame."""
    return pd.DataFrame(table)


def cpu_percent_clipped(cpu_percent, cores: int | None):
    """CPU % per sample, at most 100 × cores: a short last interval can divide a few
    clock ticks by a tiny time and read as more cores than the host has."""
    values = np.asarray(cpu_percent, dtype=float)
    if cores and cores > 0:
        values = np.minimum(values, 100.0 * cores)
    return values


def units_per_s_over_time(t, units, window_s: float = 1.0):
    """Throughput over time from the cumulative ``units`` column: units done in the last
    ``window_s`` (shorter at the start), so a 10 Hz sampler's steps do not read as spikes."""
    t = np.asarray(t, dtype=float)
    units = np.asarray(units, dtype=float)
    if len(t) < 2:
        return t[:0], units[:0]
    window = min(window_s, max((t[-1] - t[0]) / 4, 1e-9))
    earlier = np.interp(t - window, t, units)
    span = np.minimum(t - t[0], window)
    keep = span > 0
    return t[keep], (units[keep] - earlier[keep]) / span[keep]


SERIES_COLUMNS = ("t", "rss_bytes", "cpu_percent", "units")  # what the time series draw


def read_series(path: Path) -> pd.DataFrame | None:
    """One trial's time series (``SERIES_COLUMNS`` it has), or None when it has no
    samples or cannot be read: a corrupt series must not cost the whole report."""
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
        names = set(file.schema_arrow.names)
        if not {"t", "rss_bytes", "cpu_percent"} <= names:
            return None
        table = file.read(columns=[c for c in SERIES_COLUMNS if c in names]).to_pandas()
    except Exception:
        return None
    return table.astype(float) if len(table) else None


def thinned(n: int, keep: int, budget: int) -> np.ndarray:
    """Indices of at most ``budget`` of ``n`` samples, evenly spread, ``keep`` (the peak)
    always among them."""
    if n <= budget:
        return np.arange(n)
    return np.union1d(np.linspace(0, n - 1, max(budget, 2)).round().astype(int), [keep])


def _trial_rows(run: rpt.RunData, group: pd.DataFrame) -> list[tuple[dict[str, Any],
                                                                    pd.DataFrame]]:
    """(trial row, series) of every trial of ``group`` whose series is readable.

    The series directory is listed once and only the trials with a file become rows: a
    run of 10,000 trials without series costs a listing, not 10,000 look-ups."""
    from orchestrator.results.store import TIMESERIES_DIR

    try:
        names = {p.stem for p in (run.run_dir / TIMESERIES_DIR).iterdir()
                 if p.suffix == ".parquet"}
    except OSError:
        return []
    group = group[group["trial_id"].astype(str).isin(names)]
    out = []
    ordered = group.sort_values(["workers", "repeat"], kind="stable", na_position="last")
    for r in ordered.to_dict("records"):
        path = run.timeseries_path(str(r["trial_id"]))
        series = read_series(path)
        if series is not None:
            out.append((r, series))
    return out


_TIMELINE_COLUMNS = ("label", "workers", "repeat", "status", "trial", "panel", "kind", "t",
                     "t_end", "value")


def timeline_data(run: rpt.RunData, group: pd.DataFrame,
                  budget: int = MAX_POINTS_PER_TRIAL) -> pd.DataFrame:
    """The samples a time-series figure draws, in long form: one row per trial, panel and
    (thinned) sample, ``kind`` = sample | peak | load | before.

    Panels: RSS (MiB), CPU % (clipped to 100 × the host's cores) and units/s (from the
    cumulative ``units`` column, 1 s window). ``load`` rows span the process's load phase
    before t = 0 and ``before`` rows its peak RSS then, both recorded by the runner (the
    agent does not sample that phase). Built as columns of arrays joined once: a frame
    per trial and panel cost seconds at a few thousand trials."""
    parts: dict[str, list[Any]] = {c: [] for c in _TIMELINE_COLUMNS}

    def add(ident: dict[str, Any], panel: str, kind: str, t: Any, value: Any,
            t_end: Any = None) -> None:
        n = len(t)
        parts["t"].append(np.asarray(t, dtype=float))
        parts["value"].append(np.asarray(value, dtype=float))
        parts["t_end"].append(np.full(n, np.nan) if t_end is None
                              else np.asarray(t_end, dtype=float))
        for name, v in (*ident.items(), ("panel", panel), ("kind", kind)):
            parts[name].append(np.full(n, v, dtype=object))

    for r, series in _trial_rows(run, frame(group)):
        ident = {"label": rpt.machine_label(r["machine"], r["ran_on"]),
                 "workers": int(r["workers"]), "repeat": _int_or_none(r.get("repeat")),
                 "status": r["status"], "trial": str(r["trial_id"])}
        t = series["t"].to_numpy()
        rss = series["rss_bytes"].to_numpy() / 2**20
        peak = int(np.nanargmax(rss)) if np.isfinite(rss).any() else 0
        keep = thinned(len(t), peak, budget)
        cores = r.get("vcpus")
        cpu = cpu_percent_clipped(series["cpu_percent"], int(cores) if is_finite(cores) else None)
        add(ident, "RSS (MiB)", "sample", t[keep], rss[keep])
        add(ident, "CPU %", "sample", t[keep], cpu[keep])
        if len(t):
            add(ident, "RSS (MiB)", "peak", t[[peak]], rss[[peak]])
        units = series["units"].to_numpy() if "units" in series else None
        if units is not None and np.isfinite(units).any():
            has = np.isfinite(units)
            tt, rate = units_per_s_over_time(t[has], units[has])
            sub = thinned(len(tt), 0, budget)
            add(ident, "units/s", "sample", tt[sub], rate[sub])
        _load_phase(add, ident, r, t)
    if not parts["t"]:
        return pd.DataFrame(columns=list(_TIMELINE_COLUMNS))
    data = pd.DataFrame({c: np.concatenate(v) for c, v in parts.items()})
    data["workers"] = data["workers"].astype(int)
    return data


def _int_or_none(value: Any) -> int | None:
    return int(value) if is_finite(value) else None


def _load_phase(add: Any, ident: dict[str, Any], r: dict[str, Any], t: np.ndarray) -> None:
    """The load phase (a span from -load_s to 0 in each panel) and its peak RSS (a segment)."""
    load_s, before = r.get("load_s"), r.get("peak_rss_before_trial_bytes")
    if is_finite(load_s) and float(load_s) > 0:
        for panel in ("RSS (MiB)", "CPU %", "units/s"):
            add(ident, panel, "load", [-float(load_s)], [0.0], [0.0])
    if is_finite(before):
        start = -float(load_s) if is_finite(load_s) else (t[0] if len(t) else 0.0)
        end = 0.0 if is_finite(load_s) else (t[-1] if len(t) else 0.0)
        add(ident, "RSS (MiB)", "before", [start], [float(before) / 2**20], [end])
