"""The report's figures as SVG files, drawn by ``orchestrator.results.svg``.

Vector files, written in milliseconds with no plotting library: matplotlib cost
~1.5 s to import and ~2–4 s to draw five PNGs at the end of every sweep
(``benchmarks/bench_sweep.py``, BENCHMARKS.md). A figure function returns an
``svg.Figure`` (plain data: panels and series) that tests inspect and
``savefig`` writes; Jupyter shows it inline.

The numbers plotted are the ones the tables show (``orchestrator.results.report``'s
summary, knees and Pareto front), so a figure never disagrees with a table.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.formatting import is_finite
from orchestrator.results import report as rpt
from orchestrator.results.report.measure import UNITS, Measure
from orchestrator.results.report.rows import (
    Frame,
    as_frame,
    float_array,
    known,
    missing,
    nanmax,
    nanmin,
)
from orchestrator.results.svg import Figure, LegendEntry, Panel

if TYPE_CHECKING:
    import pandas as pd  # a notebook's frames are accepted too (``as_frame``)

LINESTYLES = ("-", "--", ":", "-.")
"""One per repeat (or per ``split_by`` value): the colour already says which machine."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
"""One per ``split_by`` value, so a single-point line is told apart too."""

TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip
TAB20_LIGHT = ("#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
               "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")  # fmt: skip
"""matplotlib's tab10, then tab20's light shades: the palette the PNGs used."""


def machine_colours(pairs) -> dict[str, str]:
    """One colour per machine label (``machine_label(machine, ran_on)``), the same in every figure.

    Labels are sorted before colours are handed out, so a machine keeps its
    colour between the figures of a report (and between reports of the same
    machines). tab10 first, then tab20's light shades for sweeps of more than ten.
    """
    labels = sorted({rpt.machine_label(m, r) for m, r in pairs})
    palette = TAB10 + TAB20_LIGHT
    return {label: palette[i % len(palette)] for i, label in enumerate(labels)}


def _pairs(frame: Frame) -> list[tuple[str, str]]:
    return list(zip(frame["machine"], frame["ran_on"], strict=True))


def render_plots(
    run: rpt.RunData,
    summary: Frame,
    out_dir: Path,
    usl_models: dict[tuple[str, str], Any] | None = None,
) -> list[tuple[str, str]]:
    """Write every figure into ``out_dir``; returns (path relative to the store, caption) pairs.

    ``usl_models``: the report's own USL fits per (machine, ran_on), drawn as they are
    (fitted here when not given)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rel = out_dir.relative_to(run.run_dir) if out_dir.is_relative_to(run.run_dir) else out_dir
    written: list[tuple[str, str]] = []
    colours = machine_colours(_pairs(run.trials))
    measure = run.measure  # units/s, or runs/h and $ per run for a fixed-work job

    def save(fig: Figure, name: str, caption: str) -> None:
        fig.savefig(out_dir / name)
        written.append(((rel / name).as_posix(), caption))

    if not summary.empty:
        estimated = any(summary["estimate"])
        est = " (costs are estimates)" if estimated else ""
        save(
            throughput_figure(summary, run.trials, colours=colours, usl_models=usl_models,
                              measure=measure),
            "throughput.svg",
            "Throughput vs workers per machine (median over repeats with its spread as error "
            "bars; dots are single repeats, hollow markers oversubscribed, ★ the knee; dashed: "
            "the USL fit with its 95% band, drawn only when the fit is good)",
        )
        save(
            efficiency_figure(summary, colours=colours),
            "efficiency.svg",
            "Scaling efficiency vs workers (1.0 = perfectly linear from 1 worker)",
        )
        save(
            cost_figure(summary, colours=colours, measure=measure),
            "cost_vs_throughput.svg",
            f"Cost {measure.cost_per} vs throughput ({measure.name}), Pareto front marked{est}",
        )
        save(
            memory_figure(summary, colours=colours),
            "peak_memory.svg",
            "Peak RSS vs workers per machine",
        )
    trials = run.trials
    for (machine, ran_on), group in trials.group_by(["machine", "ran_on"]):
        label = rpt.machine_label(machine, ran_on)
        fig = timeseries_figure(run, group, colour=colours[label])
        if fig is None:
            continue
        name = "timeseries_" + _safe(
            f"{machine}" if machine == ran_on else f"{machine}_on_{ran_on}"
        )
        save(
            fig,
            f"{name}.svg",
            f"Memory (RSS), CPU and throughput over time, every trial: {label} "
            "(one row per worker count, one line style per repeat, ▼ each trial's peak)",
        )
    return written


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _groups(summary: Frame, split_by: str | None = None):
    """(label, machine label, rows, keys, split index) per machine, and per ``split_by`` value."""
    keys = [split_by, "machine", "ran_on"] if split_by else ["machine", "ran_on"]
    splits = sorted({str(v) for v in summary[split_by]}) if split_by else []
    for values, group in summary.group_by(keys):
        *split, machine, ran_on = values
        machine_name = rpt.machine_label(machine, ran_on)
        label = machine_name + (f" [{split[0]}]" if split else "")
        index = splits.index(str(split[0])) if split else 0
        yield (
            label,
            machine_name,
            group.sort_by(["workers"]),
            dict(zip(keys, values, strict=True)),
            index,
        )


def _colours_for(summary: Frame, colours: dict[str, str] | None) -> dict[str, str]:
    return colours if colours is not None else machine_colours(_pairs(summary))


def _workers_axis(ax: Panel, summary: Frame) -> None:
    workers = sorted(set(int(w) for w in summary["workers"]))
    if workers and workers[-1] / max(workers[0], 1) >= 4:
        ax.xscale = "log2"
    ax.xticks = [(float(w), str(w)) for w in workers]
    ax.xlabel = "workers"


def _line_with_oversubscription(
    ax: Panel,
    group: Frame,
    y: str,
    label: str,
    colour: str,
    linestyle: str = "-",
    marker: str = "o",
) -> None:
    """One line per machine in its colour; oversubscribed points drawn hollow."""
    ax.line(group["workers"], group[y], colour, label=label, linestyle=linestyle, marker=marker)
    over = group.where(lambda r: r["oversubscribed"])
    if not over.empty:
        ax.points(over["workers"], over[y], colour, size=10, hollow=True)


_RATE_COLUMNS = ("units_per_s", "units_per_s_low", "units_per_s_high")


def in_measure(frame: Frame, measure: Measure) -> Frame:
    """``frame``'s rates and cost in ``measure``'s units (runs/h, $ per run for a fixed-work
    job), under the same column names, so a figure draws what the tables show."""
    if measure is UNITS:
        return frame
    out = frame
    for name in _RATE_COLUMNS:
        if name in out:
            out = out.with_column(name, [measure.rate(v) for v in out[name]])
    if "cost_per_million_units" in out:
        out = out.with_column("cost_per_million_units",
                              [measure.cost(v) for v in out["cost_per_million_units"]])
    return out


def _one_panel(title: str) -> tuple[Figure, Panel]:
    fig = Figure(width=720, height=405)
    ax = fig.panel()
    ax.title = title
    return fig, ax


def throughput_figure(
    summary: Frame | pd.DataFrame,
    trials: Frame | None = None,
    split_by: str | None = None,
    colours: dict[str, str] | None = None,
    usl_models: dict[tuple[str, str], Any] | None = None,
    measure: Measure = UNITS,
) -> Figure:
    """Median lines with spread bars, each repeat a faint dot, ★ at the knee, the USL fit.

    The error bars are the summary's spread (IQR, or the bootstrap 95 % CI of the
    median from enough repeats). With ``trials`` and no ``split_by``, each
    machine's USL fit is drawn dashed with its 95 % band, over the tested range
    and a little past it; a poor fit is not drawn (the report's table says why).

    ``split_by`` names a column of both frames (the notebook's ``strategy``) that
    splits a machine into several lines: same colour (the machine), one line
    style per value. The y axis starts at 0, so a gain reads at its true size.
    ``measure``: the rate's unit (runs/h for a fixed-work job).
    """
    summary = in_measure(as_frame(summary), measure)
    shown = None if trials is None else in_measure(as_frame(trials), measure)
    trials = None if trials is None else as_frame(trials)
    colours = _colours_for(summary, colours)
    fig, ax = _one_panel("Throughput vs workers")
    for label, machine, group, keys, index in _groups(summary, split_by):
        colour = colours[machine]
        style, marker = LINESTYLES[index % len(LINESTYLES)], MARKERS[index % len(MARKERS)]
        _line_with_oversubscription(ax, group, "units_per_s", label, colour, style, marker)
        spread = group.where(lambda r: not (missing(r["units_per_s_low"])
                                            or missing(r["units_per_s_high"])))
        if not spread.empty:
            ax.errorbar(
                spread["workers"],
                [nanmin((r["units_per_s_low"], r["units_per_s"])) for r in spread],
                [nanmax((r["units_per_s_high"], r["units_per_s"])) for r in spread],
                colour,
            )
        if trials is not None and split_by is None:
            _usl_curve(ax, trials, keys, colour, usl_models, measure.rate_scale)
        if shown is not None:
            mine = shown.where(lambda r, k=keys: r["status"] == rpt.OK and all(
                str(r[c]) == str(v) for c, v in k.items()))
            ax.points(mine["workers"], mine["units_per_s"], colour, size=3.5, alpha=0.4)
        knee = rpt.find_knee(list(group["workers"]), list(group["units_per_s"]))
        if knee.reached and knee.workers is not None:
            ax.points([knee.workers], [knee.units_per_s], colour, marker="*", size=16)
    ax.ylabel = f"{measure.name} (median)"
    ax.ylim = (0, None)
    _workers_axis(ax, summary)
    return fig


def _usl_curve(
    ax: Panel,
    trials: Frame,
    keys: dict[str, Any],
    colour: str,
    usl_models: dict[tuple[str, str], Any] | None = None,
    scale: float = 1.0,
) -> None:
    """The machine's fitted USL curve (dashed) and its 95 % band, when the fit is good.

    The fit is the report's own when ``usl_models`` has it (the table's numbers, not a
    second bootstrap), else fitted here from ``trials``; ``scale`` turns its units/s into
    the figure's unit."""
    import numpy as np

    from orchestrator.analysis.model import fit_usl_with_intervals
    from orchestrator.results.report.model import samples

    key = (str(keys["machine"]), str(keys["ran_on"]))
    data = samples(trials).get(key)
    if usl_models is not None and key in usl_models:
        model = usl_models[key]
    else:
        model = fit_usl_with_intervals(data) if data else None
    if model is None or model.fit.poor:
        return
    top = max(data)
    ns = np.geomspace(max(min(data), 1), top * 1.25, 60)
    band = model.band(list(ns))
    ax.band(ns, [b[1] * scale for b in band], [b[2] * scale for b in band], colour)
    ax.line(ns, [b[0] * scale for b in band], colour, label="_usl", linestyle="--", width=1.0)


def efficiency_figure(
    summary: Frame | pd.DataFrame, colours: dict[str, str] | None = None
) -> Figure:
    summary = as_frame(summary)
    colours = _colours_for(summary, colours)
    fig, ax = _one_panel("Scaling efficiency vs workers")
    for label, machine, group, _, _ in _groups(summary):
        measured = group.where(lambda r: not missing(r["efficiency"]))
        if not measured.empty:
            _line_with_oversubscription(ax, measured, "efficiency", label, colours[machine])
    if not any(s.label for s in ax.series):
        ax.note = "no 1-worker baseline: efficiency unknown"
    ax.hline(1.0)
    ax.ylim = (0, None)
    ax.ylabel = "efficiency (median)"
    _workers_axis(ax, summary)
    return fig


def cost_figure(
    summary: Frame | pd.DataFrame, colours: dict[str, str] | None = None,
    measure: Measure = UNITS,
) -> Figure:
    """$ per million units against units/s (from 0), each point numbered with its workers;
    for a fixed-work job (``measure``), $ per run against runs/h."""
    summary = in_measure(as_frame(summary), measure)
    colours = _colours_for(summary, colours)
    fig, ax = _one_panel("Cost vs throughput (numbers: workers)")
    priced = summary.where(lambda r: not (missing(r["cost_per_million_units"])
                                          or missing(r["units_per_s"])))
    if priced.empty:
        ax.note = "no price known: cost unavailable"
    for label, machine, group, _, _ in _groups(priced):
        ax.points(group["units_per_s"], group["cost_per_million_units"], colours[machine],
                  label=label)  # fmt: skip
        ax.labels(group["units_per_s"], group["cost_per_million_units"],
                  [str(w) for w in group["workers"]])  # fmt: skip
    front = priced.where(lambda r: r["pareto"]).sort_by(["units_per_s"])
    if not front.empty:
        ax.line(front["units_per_s"], front["cost_per_million_units"], "#000000",
                label="Pareto front", marker="D", size=10, face="none", width=1.2)  # fmt: skip
    estimated = any(priced["estimate"])
    ax.xlabel = f"{measure.name} (median)"
    ax.xlim = (0, None)
    ax.ylim = (0, None)
    ax.ylabel = f"USD {measure.cost_per}" + (" (estimate)" if estimated else "")
    return fig


def memory_figure(
    summary: Frame | pd.DataFrame, colours: dict[str, str] | None = None
) -> Figure:
    summary = as_frame(summary)
    colours = _colours_for(summary, colours)
    fig, ax = _one_panel("Peak memory vs workers")
    for label, machine, group, _, _ in _groups(summary):
        mib = group.with_column("peak_mib", [p / 2**20 for p in group["peak_rss_bytes"]])
        _line_with_oversubscription(ax, mib, "peak_mib", label, colours[machine])
    ax.ylabel = "peak RSS (MiB, max over repeats)"
    ax.ylim = (0, None)
    _workers_axis(ax, summary)
    return fig


# ---------------------------------------------------------------- over time


def cpu_percent_clipped(cpu_percent, cores: int | None):
    """CPU % per sample, at most 100 × cores: a short last interval can divide a few
    clock ticks by a tiny time and read as more cores than the host has."""
    import numpy as np

    values = np.asarray(cpu_percent, dtype=float)
    if cores and cores > 0:
        values = np.minimum(values, 100.0 * cores)
    return values


def units_per_s_over_time(t, units, window_s: float = 1.0):
    """Throughput over time from the cumulative ``units`` column: units done in the last
    ``window_s`` (shorter at the start), so a 10 Hz sampler's steps do not read as spikes."""
    import numpy as np

    t = np.asarray(t, dtype=float)
    units = np.asarray(units, dtype=float)
    if len(t) < 2:
        return t[:0], units[:0]
    window = min(window_s, max((t[-1] - t[0]) / 4, 1e-9))
    earlier = np.interp(t - window, t, units)
    span = np.minimum(t - t[0], window)
    keep = span > 0
    return t[keep], (units[keep] - earlier[keep]) / span[keep]


SERIES_COLUMNS = ("t", "rss_bytes", "cpu_percent", "units")  # what the time-series figure draws


def _series(run: rpt.RunData, group: Frame):
    """(trial row, time series) of every trial of the group that has a readable series.

    The series is a dict of float arrays, one per column of ``SERIES_COLUMNS`` the
    file has, read with pyarrow alone: a pandas frame per trial (and dropping the
    rows without ``units`` through it) was a third of drawing the figure.
    """
    import pyarrow.parquet as pq

    ordered = group.sort_by(["workers", "repeat"])
    for r in ordered:
        path = run.timeseries_path(str(r["trial_id"]))
        if not path.exists():
            continue
        try:
            file = pq.ParquetFile(path)
            names = set(file.schema_arrow.names)
            if not {"t", "rss_bytes", "cpu_percent"} <= names:
                continue
            table = file.read(columns=[c for c in SERIES_COLUMNS if c in names])
        except Exception:  # a corrupt series must not cost the whole report
            continue
        if table.num_rows:
            # nulls become NaN, as in the frame read_parquet gives
            yield r, {c: float_array(table.column(c)) for c in table.column_names}


def timeseries_figure(
    run: rpt.RunData, group: Frame | pd.DataFrame, colour: str | None = None
) -> Figure | None:
    """Every trial of one machine over time: one row per worker count, three panels per row.

    RSS (MiB), CPU % (clipped to 100 × the host's cores) and units/s (from the
    cumulative ``units`` column). Every repeat is drawn, in the machine's colour,
    one line style per repeat; ▼ marks each trial's sampled peak. Like ``mprof
    plot``, the process's life before the trial is drawn left of t = 0: a shaded
    span as long as the load phase (interpreter start, imports, input loading,
    warm-up: ``load_s``) with a dotted line at its peak RSS, both recorded by the
    runner; the agent does not sample that phase, so no curve is drawn there.
    Rows share their y axes, so worker counts compare at a glance.
    """
    import numpy as np

    group = as_frame(group)
    series = list(_series(run, group))
    if not series:
        return None
    colour = colour or machine_colours(_pairs(group)).popitem()[1]
    workers = sorted({int(r["workers"]) for r, _ in series})
    repeats = sorted({int(r["repeat"]) for r, _ in series if r.get("repeat") is not None})
    fig = Figure(width=900, height=108 + 180 * len(workers), rows=len(workers), cols=3,
                 legend_below=True)  # fmt: skip
    before_shown = load_shown = False
    for r, frame in series:
        row = [fig.panel(workers.index(int(r["workers"])), c) for c in range(3)]
        style = LINESTYLES[repeats.index(int(r["repeat"])) % len(LINESTYLES)] if repeats else "-"
        alpha = 1.0 if r["status"] == rpt.OK else 0.45
        t = frame["t"]
        rss = frame["rss_bytes"] / 2**20
        row[0].line(t, rss, colour, linestyle=style, width=1.2, alpha=alpha)
        if len(rss):
            peak = int(rss.argmax())
            row[0].points([t[peak]], [rss[peak]], colour, marker="v", size=8)
        before, load_s = r.get("peak_rss_before_trial_bytes"), r.get("load_s")
        if is_finite(load_s) and float(load_s) > 0:  # like mprof: the process before the trial
            for ax in row:
                ax.span(-float(load_s), 0.0, colour)
            load_shown = True
        if is_finite(before):
            start = -float(load_s) if is_finite(load_s) else t[0] if len(t) else 0.0
            end = 0.0 if is_finite(load_s) else t[-1] if len(t) else 0.0
            row[0].segment(start, end, float(before) / 2**20, colour)
            before_shown = True
        cores = r.get("vcpus")
        cpu = cpu_percent_clipped(frame["cpu_percent"], int(cores) if is_finite(cores) else None)
        row[1].line(t, cpu, colour, linestyle=style, width=1.2, alpha=alpha)
        has_units = ~np.isnan(frame["units"]) if "units" in frame else None
        if has_units is not None and has_units.any():
            tt, rate = units_per_s_over_time(t[has_units], frame["units"][has_units])
            row[2].line(tt, rate, colour, linestyle=style, width=1.2, alpha=alpha)
    cores = known(group["vcpus"])
    cpu_note = f" (100 = one core, ≤ {100 * int(cores[0])})" if cores else ""
    for i, w in enumerate(workers):
        statuses = [
            f"repeat {r['repeat']} {r['status']}"
            for r, _ in series
            if int(r["workers"]) == w and r["status"] != rpt.OK
        ]
        rss_ax, cpu_ax, units_ax = (fig.panel(i, c) for c in range(3))
        rss_ax.ylabel = f"{rpt.n_workers(w)}\nRSS (MiB)"
        cpu_ax.ylabel = "CPU %"
        units_ax.ylabel = "units/s"
        if statuses:
            rss_ax.title = "not ok (faint): " + ", ".join(statuses)
        for ax in (rss_ax, cpu_ax, units_ax):
            ax.ylim = (0, None)
    fig.panel(0, 1).title = fig.panel(0, 1).title or "CPU %" + cpu_note
    no_units = all(r.get("job_kind") == "fixed_work" for r, _ in series)  # one run per trial
    fig.panel(0, 2).title = fig.panel(0, 2).title or (
        "no units/s: a fixed-work job (one run per trial)" if no_units
        else "units/s over time (1 s window)")
    fig.xlabel = (  # one label under the middle panel: three would overlap
        "seconds since the trial started" + (" (the load phase before 0)" if load_shown else "")
    )
    fig.share(x=True, y_by_column=True)
    legend = [
        LegendEntry(f"repeat {rep}", colour, LINESTYLES[k % len(LINESTYLES)])
        for k, rep in enumerate(repeats)
    ]
    legend.append(LegendEntry("peak", colour, "none", marker="v"))
    if load_shown:
        legend.append(LegendEntry("load phase before t=0 (not sampled)", colour, patch=True,
                                  alpha=0.15))  # fmt: skip
    if before_shown:
        legend.append(LegendEntry("peak RSS before t=0", colour, ":"))
    fig.extra_legend = legend
    fig.title = "Memory, CPU and throughput over time: " + rpt.machine_label(
        group.rows[0]["machine"], group.rows[0]["ran_on"]
    )
    return fig
