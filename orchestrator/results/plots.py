"""The report's figures as Vega-Lite charts, drawn with Altair.

A figure function returns an Altair chart: a small JSON spec that carries its data (one
row per point drawn) and says how to draw it. The HTML report embeds the specs, so a
browser draws them interactively (a tooltip on every point with its interval, zoom and pan
by dragging and scrolling, a click on the legend fades a series out); ``vl-convert`` renders
the same specs as SVG files for report.md. matplotlib would draw the static files as well
but gives a browser pictures, not data: no tooltip, no zoom, no series to hide.

The numbers plotted are the ones the tables show (``orchestrator.results.report``'s
summary, knees and Pareto front), so a figure never disagrees with a table. Data flows one
way: this module reads the report's data; the report never imports it.

Altair is imported with this module, which only drawing a report (or a notebook) imports,
so ``cloudprof --help`` and a sweep's start stay instant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

from orchestrator.formatting import is_finite
from orchestrator.results import report as rpt
from orchestrator.results.report.measure import UNITS, Measure
from orchestrator.results.series import MAX_POINTS_PER_TRIAL, frame, timeline_data

TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip
TAB20_LIGHT = ("#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
               "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")  # fmt: skip
"""tab10, then tab20's light shades: one colour per machine."""

WIDTH, HEIGHT = 560, 320
"""A figure's plotting area in pixels (the HTML page scales it down on a phone)."""
MAX_TIMELINE_POINTS = 60_000
MAX_TIMESERIES_FIGURES = 12
"""report.md draws the time series of the machines with the highest throughput, this many
at most (each is ~0.5 s to draw and a page of 200 is read by no one); the HTML's memory
timeline has every machine."""
FADED = 0.08
"""The opacity of a series whose legend entry was clicked away."""
MAX_REPEAT_DOTS = 2_000
"""The throughput figure draws every repeat as a dot up to this many; beyond, the medians
and their intervals carry the spread (10,000 dots draw no better and cost seconds to
encode, render and load)."""
USL_POINTS = 60
"""Points per USL curve, fewer when many machines share the figure (``usl_points``)."""


@dataclass
class Drawn:
    """One figure of a report: its file name in ``plots/``, its caption, its chart."""

    name: str
    caption: str
    chart: Any  # an Altair chart
    _spec: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def spec(self) -> dict[str, Any]:
        """The chart's spec, made once: the SVG file and the HTML page draw the same one."""
        if self._spec is None:
            self._spec = spec(self.chart, validate=False)
        return self._spec


def spec(chart: Any, validate: bool = True) -> dict[str, Any]:
    """The chart's Vega-Lite spec, its data inlined. Altair refuses more than 5,000 rows
    by default (a guard for notebooks); a report's data is already bounded (a thinned time
    series, one row per point), so the guard is lifted for this call only. ``validate``:
    check the spec against Vega-Lite's JSON schema (a second or more for a large one; a
    report's figures, checked by the tests, skip it)."""
    from altair.utils.schemapi import debug_mode

    # debug mode off: with it on, each object that to_dict makes on its way is checked
    # against the schema again (a tenth of a report's CPU); ``validate`` checks the result
    with alt.data_transformers.disable_max_rows(), debug_mode(False):
        return chart.to_dict(validate=validate)


def machine_colours(pairs) -> dict[str, str]:
    """One colour per machine label (``machine_label(machine, ran_on)``), the same in every figure.

    Labels are sorted before colours are handed out, so a machine keeps its colour between
    the figures of a report (and between reports of the same machines).
    """
    labels = sorted({rpt.machine_label(m, r) for m, r in pairs})
    palette = TAB10 + TAB20_LIGHT
    return {label: palette[i % len(palette)] for i, label in enumerate(labels)}


def _pairs(table: pd.DataFrame) -> list[tuple[str, str]]:
    return list(zip(table["machine"], table["ran_on"], strict=True))


def _labelled(table: pd.DataFrame, split_by: str | None = None) -> pd.DataFrame:
    """``table`` with a ``label`` column (the machine as the tables name it) and a ``split``
    column (``split_by``'s value, "" without it)."""
    out = table.copy()
    out["label"] = [rpt.machine_label(m, r) for m, r in _pairs(out)] if len(out) else []
    out["split"] = out[split_by].astype(str) if split_by else ""
    return out


_RATE_COLUMNS = ("units_per_s", "units_per_s_low", "units_per_s_high")


def in_measure(table: pd.DataFrame, measure: Measure) -> pd.DataFrame:
    """``table``'s rates and cost in ``measure``'s units (runs/h, $ per run for a fixed-work
    job), under the same column names, so a figure draws what the tables show."""
    out = frame(table).copy()
    if measure is UNITS:
        return out
    for name in _RATE_COLUMNS:
        if name in out:
            out[name] = [measure.rate(v) for v in out[name]]
    if "cost_per_million_units" in out:
        out["cost_per_million_units"] = [measure.cost(v) for v in out["cost_per_million_units"]]
    return out


# ---------------------------------------------------------------- encodings


def _legend_pick() -> Any:
    """A click on a legend entry keeps that series and fades the others (shift-click: more)."""
    return alt.selection_point(fields=["label"], bind="legend", name="pick")


def _colour(colours: dict[str, str]) -> Any:
    return alt.Color("label:N", title="machine",
                     scale=alt.Scale(domain=list(colours), range=list(colours.values())),
                     legend=alt.Legend(orient="bottom", columns=2, labelLimit=320))


def _faded(pick: Any, shown: float = 1.0, faded: float = FADED) -> Any:
    return _opacity(alt.condition(pick, alt.value(shown), alt.value(faded)))


def _opacity(condition: dict[str, Any]) -> Any:
    """``alt.condition``'s dict as the opacity channel's own class. Every channel here is
    given as its class, never as a string or dict: Altair turns those into classes with
    ``from_dict``, which hashes all of Vega-Lite's schema on each call (~12 ms, 0.5 s of
    CPU in a report's ~70 channels, more than the Python side of its figures' specs)."""
    return alt.OpacityValue(**condition)


def _workers_x(workers: Any) -> Any:
    """The worker counts as the x axis: log 2 when they span a factor of 4 or more."""
    counts = sorted({int(w) for w in workers if is_finite(w)})
    log = bool(counts) and counts[-1] / max(counts[0], 1) >= 4
    if not counts:
        return alt.X("workers:Q", title="workers")
    low, high = counts[0], counts[-1]  # a margin, so the end points are not cut in half
    domain = [low / 1.25, high * 1.25] if log else [low - 0.06 * (high - low or 1),
                                                   high + 0.06 * (high - low or 1)]
    scale = alt.Scale(type="log", base=2, domain=domain) if log else alt.Scale(
        domain=domain, nice=False)
    return alt.X("workers:Q", title="workers", scale=scale,
                 axis=alt.Axis(values=counts, format="d", grid=False))


def _title(title: str, subtitle: str | None = None) -> Any:
    return alt.TitleParams(title, subtitle=subtitle or "", anchor="start")


# ---------------------------------------------------------------- against workers


def _medians(summary: pd.DataFrame, y: str, interval: tuple[str, str] | None = None
             ) -> pd.DataFrame:
    """The per-count points a line joins: label, split, workers, value (and its interval),
    repeats, oversubscribed; sorted by workers, missing values dropped."""
    cols = {"label": summary["label"], "split": summary["split"],
            "workers": summary["workers"].astype(int), "value": summary[y].astype(float),
            "repeats": summary.get("repeats", pd.Series([None] * len(summary))).values,
            "oversubscribed": summary["oversubscribed"].astype(bool)}
    if interval:
        cols["low"] = np.fmin(summary[interval[0]].astype(float), summary[y].astype(float))
        cols["high"] = np.fmax(summary[interval[1]].astype(float), summary[y].astype(float))
    out = pd.DataFrame(cols)
    out = out[np.isfinite(out["value"])]
    return out.sort_values(["label", "split", "workers"], kind="stable").reset_index(drop=True)


def _lines(data: pd.DataFrame, colours: dict[str, str], x: Any, y: Any, pick: Any,
           tooltip: list[Any], split: bool) -> list[Any]:
    """Median lines with their points (hollow where oversubscribed), coloured per machine."""
    base = alt.Chart(data, description="median").encode(
        x=x, y=y, color=_colour(colours), opacity=_faded(pick), tooltip=tooltip,
        detail=alt.Detail("split:N"))
    if split:
        base = base.encode(strokeDash=alt.StrokeDash("split:N", title=None))
    line = base.mark_line(point=alt.OverlayMarkDef(filled=True, size=45)).add_params(pick)
    over = data[data["oversubscribed"]]
    layers = [line]
    if len(over):
        layers.append(alt.Chart(over, description="oversubscribed").mark_point(
            filled=False, size=160, strokeWidth=1.5).encode(
            x=x, y=y, color=_colour(colours), opacity=_faded(pick), tooltip=tooltip))
    return layers


def _zoomable(layers: list[Any], title: str, subtitle: str | None = None) -> Any:
    """The layers as one chart that zooms (scroll) and pans (drag); double-click resets.

    Made in one call: each of Altair's methods on a layered chart (``properties``,
    ``add_params``, ``resolve_scale``) builds it anew, deep-copying every layer, and
    ``properties`` checks its values against the schema: a third of a report's CPU."""
    zoom = alt.selection_interval(bind="scales", name="zoom")
    first = layers[0].add_params(zoom)  # where LayerChart.add_params puts it (then lifts it)
    return alt.layer(first, *layers[1:],
                     resolve=alt.Resolve(scale=alt.ScaleResolveMap(color="shared")),
                     width=WIDTH, height=HEIGHT, title=_title(title, subtitle))


def throughput_figure(
    summary: pd.DataFrame,
    trials: pd.DataFrame | None = None,
    split_by: str | None = None,
    colours: dict[str, str] | None = None,
    usl_models: dict[tuple[str, str], Any] | None = None,
    measure: Measure = UNITS,
    references: pd.DataFrame | None = None,
    log_y: bool = False,
) -> Any:
    """Median lines with their interval as error bars, each repeat a faint dot, ★ at the
    knee, and each machine's USL fit (dashed, with its 95 % band) when the fit is good.

    The interval is the summary's spread (IQR, or the bootstrap 95 % CI of the median from
    enough repeats). ``split_by`` names a column of both frames (the notebook's
    ``strategy``) that splits a machine into several lines: same colour, one dash per
    value. The y axis starts at 0, so a gain reads at its true size. ``measure``: the
    rate's unit (runs/h for a fixed-work job).
    """
    table = _labelled(in_measure(summary, measure), split_by)
    colours = colours if colours is not None else machine_colours(_pairs(table))
    data = _medians(table, "units_per_s", ("units_per_s_low", "units_per_s_high"))
    pick = _legend_pick()
    x = _workers_x(table["workers"])
    y = alt.Y("value:Q", title=f"{measure.name} (median)", scale=alt.Scale(zero=True))
    tooltip = [alt.Tooltip("label:N", title="machine"), alt.Tooltip("workers:Q"),
               alt.Tooltip("value:Q", title=f"{measure.name} (median)", format=",.4~g"),
               alt.Tooltip("low:Q", title="interval low", format=",.4~g"),
               alt.Tooltip("high:Q", title="interval high", format=",.4~g"),
               alt.Tooltip("repeats:Q"), alt.Tooltip("oversubscribed:N")]
    if split_by:
        tooltip.insert(1, alt.Tooltip("split:N", title=split_by))
    layers = _lines(data, colours, x, y, pick, tooltip, bool(split_by))
    spread = data.dropna(subset=["low", "high"])
    if len(spread):
        layers.append(alt.Chart(spread, description="interval").mark_rule(strokeWidth=1.5).encode(
            x=x, y=alt.Y("low:Q"), y2=alt.Y2("high:Q"), color=_colour(colours),
            opacity=_faded(pick),
            tooltip=tooltip))
    dots: list[Any] = []
    if trials is not None:
        dots = _repeat_dots(trials, table, colours, x, pick, measure)
        layers += dots
        if split_by is None:
            layers += _usl_layers(trials, data, colours, x, pick, usl_models,
                                  measure.rate_scale)
    knees = _knees(data)
    if len(knees):
        layers.append(alt.Chart(knees, description="knee").mark_point(
            shape="M0,-1L0.29,-0.4L0.95,-0.31L0.48,0.15L0.59,0.81L0,0.5L-0.59,0.81L-0.48,0.15"
                  "L-0.95,-0.31L-0.29,-0.4Z", filled=True, size=420).encode(
            x=x, y=alt.Y("value:Q"), color=_colour(colours), opacity=_faded(pick),
            tooltip=[alt.Tooltip("label:N", title="machine"),
                     alt.Tooltip("workers:Q", title="knee at workers")]))
    if references is not None and len(references):
        layers.append(alt.Chart(references, description="references").mark_point(
            color="black", filled=True, size=90).encode(
            x=x, y=alt.Y("value:Q"), shape=alt.Shape("label:N", title=None, legend=alt.Legend(
                orient="bottom", direction="vertical", labelLimit=480)),
            tooltip=[alt.Tooltip("label:N"), alt.Tooltip("workers:Q"),
                     alt.Tooltip("value:Q", format=",.4~g")]))
    shown = "median, interval, repeats" if dots or trials is None else (
        f"median, interval (repeats not drawn past {MAX_REPEAT_DOTS:,})")
    return _zoomable(layers, "Throughput vs workers", f"{shown}; ★ knee; dashed: USL fit")


def _knees(data: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (label, split), group in data.groupby(["label", "split"], sort=True):
        knee = rpt.find_knee(list(group["workers"]), list(group["value"]))
        if knee.reached and knee.workers is not None:
            rows.append({"label": label, "split": split, "workers": knee.workers,
                         "value": knee.units_per_s})
    return pd.DataFrame(rows, columns=["label", "split", "workers", "value"])


def _repeat_dots(trials: pd.DataFrame, summary: pd.DataFrame,
                 colours: dict[str, str], x: Any, pick: Any, measure: Measure) -> list[Any]:
    """Every successful repeat as a faint dot at its own rate; none past
    ``MAX_REPEAT_DOTS`` (the medians' intervals show the spread)."""
    if len(trials) > MAX_REPEAT_DOTS:
        return []
    shown = _labelled(in_measure(trials, measure))
    shown = shown[(shown["status"] == rpt.OK) & shown["label"].isin(set(summary["label"]))]
    dots = pd.DataFrame({"label": shown["label"], "workers": shown["workers"].astype(int),
                         "value": shown["units_per_s"].astype(float),
                         "repeat": shown.get("repeat")})
    dots = dots[np.isfinite(dots["value"])]
    if not len(dots):
        return []
    return [alt.Chart(dots, description="repeats").mark_circle(size=22).encode(
        x=x, y=alt.Y("value:Q"), color=_colour(colours), opacity=_faded(pick, 0.4, FADED / 2),
        tooltip=[alt.Tooltip("label:N", title="machine"), alt.Tooltip("workers:Q"),
                 alt.Tooltip("repeat:Q"),
                 alt.Tooltip("value:Q", title=measure.name, format=",.4~g")])]


def usl_curves(trials: pd.DataFrame, labels: set[str],
               usl_models: dict[tuple[str, str], Any] | None = None,
               scale: float = 1.0,
               ranges: dict[str, tuple[float, float]] | None = None) -> pd.DataFrame:
    """Each machine's fitted USL curve and its 95 % band, where the fit is good.

    The fit is the report's own when ``usl_models`` has it (the table's numbers, not a
    second bootstrap), else fitted here from ``trials``; drawn over the tested range and a
    quarter past it; ``scale`` turns its units/s into the figure's unit. ``ranges``: the
    tested worker counts' (lowest, highest) per label, when the caller has them with the
    report's fits (the trials are not read again)."""
    from orchestrator.results.report.model import samples

    if ranges is not None and usl_models is not None:
        found = {(m, r): ranges[rpt.machine_label(m, r)] for m, r in usl_models
                 if rpt.machine_label(m, r) in ranges}
        fits = {key: usl_models[key] for key in found}
    else:
        by_machine = samples(trials)
        found = {key: (min(data), max(data)) for key, data in by_machine.items() if data}
        fits = {key: _fit_of(key, by_machine[key], usl_models) for key in found}
    points = usl_points(len(found))
    drawn: list[str] = []
    parts = []  # (workers, fit, low, high) rows: one frame at the end, not one per machine
    for key in sorted(found):
        label, model = rpt.machine_label(*key), fits[key]
        if label not in labels or model is None or model.fit.poor:
            continue
        low, high = found[key]
        ns = np.geomspace(max(low, 1), high * 1.25, points)
        band = np.asarray(model.band(list(ns)), dtype=float).reshape(-1, 3) * scale
        drawn += [label] * len(ns)
        parts.append(np.column_stack([ns, band]))
    if not parts:
        return pd.DataFrame(columns=["label", "workers", "fit", "low", "high"])
    rows = np.concatenate(parts)
    return pd.DataFrame({"label": drawn, "workers": rows[:, 0], "fit": rows[:, 1],
                         "low": rows[:, 2], "high": rows[:, 3]})


def usl_points(curves: int) -> int:
    """Points per curve: ``USL_POINTS`` for a few machines, fewer (at least 16) for many, so
    200 curves stay a few thousand rows."""
    return max(16, min(USL_POINTS, 4_000 // max(curves, 1)))


def _fit_of(key: tuple[str, str], data: dict[int, list[float]],
            usl_models: dict[tuple[str, str], Any] | None) -> Any:
    from orchestrator.analysis.model import fit_usl_with_intervals

    if usl_models is not None and key in usl_models:
        return usl_models[key]
    return fit_usl_with_intervals(data)


def _usl_layers(trials: pd.DataFrame, medians: pd.DataFrame,
                colours: dict[str, str], x: Any, pick: Any,
                usl_models: dict[tuple[str, str], Any] | None, scale: float) -> list[Any]:
    workers = medians.groupby("label")["workers"]
    ranges = {label: (float(lo), float(hi))
              for label, lo, hi in zip(workers.min().index, workers.min(), workers.max(),
                                       strict=True)}
    curves = usl_curves(trials, set(medians["label"]), usl_models, scale, ranges)
    if not len(curves):
        return []
    band = alt.Chart(curves, description="usl_band").mark_area(opacity=0.15).encode(
        x=x, y=alt.Y("low:Q"), y2=alt.Y2("high:Q"), color=_colour(colours),
        opacity=_faded(pick, 0.15, 0.0))
    line = alt.Chart(curves, description="usl").mark_line(strokeDash=[6, 4], strokeWidth=1).encode(
        x=x, y=alt.Y("fit:Q"), color=_colour(colours), opacity=_faded(pick),
        tooltip=[alt.Tooltip("label:N", title="machine"),
                 alt.Tooltip("workers:Q", format=".3~g"),
                 alt.Tooltip("fit:Q", title="USL fit", format=",.4~g"),
                 alt.Tooltip("low:Q", title="95% band low", format=",.4~g"),
                 alt.Tooltip("high:Q", title="95% band high", format=",.4~g")])
    return [band, line]


def _per_worker_figure(table: pd.DataFrame, colours: dict[str, str] | None, column: str,
                       axis: str, name: str, fmt: str) -> tuple[Any, list[Any], pd.DataFrame]:
    """(the legend pick, the layers of ``column``'s median lines, their data) against
    workers, with ``axis`` the y title and ``name`` its tooltip's."""
    colours = colours if colours is not None else machine_colours(_pairs(table))
    data = _medians(table, column)
    pick = _legend_pick()
    y = alt.Y("value:Q", title=axis, scale=alt.Scale(zero=True))
    tooltip = [alt.Tooltip("label:N", title="machine"), alt.Tooltip("workers:Q"),
               alt.Tooltip("value:Q", title=name, format=fmt), alt.Tooltip("repeats:Q"),
               alt.Tooltip("oversubscribed:N")]
    return pick, _lines(data, colours, _workers_x(table["workers"]), y, pick, tooltip,
                        False), data


def efficiency_figure(
    summary: pd.DataFrame, colours: dict[str, str] | None = None
) -> Any:
    """Scaling efficiency per worker count (1.0 = linear from one worker)."""
    _, layers, data = _per_worker_figure(_labelled(frame(summary)), colours, "efficiency",
                                         "efficiency (median)", "efficiency", ".2f")
    layers.append(alt.Chart(pd.DataFrame({"value": [1.0]}), description="linear").mark_rule(
        color="#888", strokeDash=[2, 3]).encode(y=alt.Y("value:Q")))
    note = None if len(data) else "no 1-worker baseline: efficiency unknown"
    return _zoomable(layers, "Scaling efficiency vs workers",
                     note or "1.0 = perfectly linear from 1 worker")


def memory_figure(
    summary: pd.DataFrame, colours: dict[str, str] | None = None
) -> Any:
    """Peak RSS (MiB, the largest over the repeats) per worker count."""
    table = _labelled(frame(summary))
    table["peak_mib"] = table["peak_rss_bytes"].astype(float) / 2**20
    _, layers, _ = _per_worker_figure(table, colours, "peak_mib",
                                      "peak RSS (MiB, max over repeats)", "peak RSS (MiB)",
                                      ",.1f")
    return _zoomable(layers, "Peak memory vs workers")


def cost_figure(
    summary: pd.DataFrame, colours: dict[str, str] | None = None,
    measure: Measure = UNITS,
) -> Any:
    """$ per million units against units/s (both from 0), each point labelled with its
    workers, the Pareto front joined; for a fixed-work job, $ per run against runs/h."""
    table = _labelled(in_measure(summary, measure))
    colours = colours if colours is not None else machine_colours(_pairs(table))
    data = pd.DataFrame({"label": table["label"], "workers": table["workers"].astype(int),
                         "rate": table["units_per_s"].astype(float),
                         "cost": table["cost_per_million_units"].astype(float),
                         "pareto": table["pareto"].astype(bool),
                         "estimate": table["estimate"].astype(bool)})
    data = data[np.isfinite(data["rate"]) & np.isfinite(data["cost"])].reset_index(drop=True)
    estimated = bool(data["estimate"].any())
    pick = _legend_pick()
    x = alt.X("rate:Q", title=f"{measure.name} (median)", scale=alt.Scale(zero=True))
    y = alt.Y("cost:Q", title=f"USD {measure.cost_per}" + (" (estimate)" if estimated else ""),
              scale=alt.Scale(zero=True))
    tooltip = [alt.Tooltip("label:N", title="machine"), alt.Tooltip("workers:Q"),
               alt.Tooltip("rate:Q", title=measure.name, format=",.4~g"),
               alt.Tooltip("cost:Q", title=f"USD {measure.cost_per}", format="$,.4~g"),
               alt.Tooltip("pareto:N", title="on the Pareto front"),
               alt.Tooltip("estimate:N", title="estimated cost")]
    points = alt.Chart(data, description="points").mark_circle(size=70).encode(
        x=x, y=y, color=_colour(colours), opacity=_faded(pick), tooltip=tooltip
    ).add_params(pick)
    labels = alt.Chart(data, description="workers").mark_text(dx=7, dy=-7, fontSize=10).encode(
        x=x, y=y, text=alt.Text("workers:Q"), opacity=_faded(pick))
    front = data[data["pareto"]].sort_values("rate", kind="stable")
    layers = [points, labels]
    if len(front):
        layers.append(alt.Chart(front, description="pareto").mark_line(
            color="black", strokeWidth=1.2,
            point=alt.OverlayMarkDef(shape="diamond", filled=False, size=140, color="black"),
        ).encode(x=x, y=y, tooltip=tooltip))
    note = "no price known: cost unavailable" if not len(data) else (
        "numbers: workers; black: the Pareto front" + (" (costs are estimates)" if estimated
                                                        else ""))
    return _zoomable(layers, "Cost vs throughput", note)


# ---------------------------------------------------------------- over time


PANELS = ("RSS (MiB)", "CPU %", "units/s")


def timeseries_figure(
    run: rpt.RunData, group: pd.DataFrame, colour: str | None = None,
    data: pd.DataFrame | None = None,
) -> Any | None:
    """Every trial of one machine over time: one row per worker count, three panels per row
    (RSS, CPU %, units/s), one dash per repeat, ▼ each trial's sampled peak.

    Like ``mprof plot``, the process's life before the trial is drawn left of t = 0: a
    shaded span as long as the load phase with a dotted line at its peak RSS. A trial that
    did not finish ok is drawn faint. Rows share their y axes per panel, so worker counts
    compare at a glance. None when no trial has a readable series. ``data``: the
    group's ``timeline_data`` when the caller has it.
    """
    data = timeline_data(run, group) if data is None else data
    if not len(data):
        return None
    table = frame(group)
    label = rpt.machine_label(table["machine"].iloc[0], table["ran_on"].iloc[0])
    colour = colour or machine_colours(_pairs(table))[label]
    workers = sorted(set(int(w) for w in data["workers"]))
    cores = [c for c in table.get("vcpus", pd.Series(dtype=float)) if is_finite(c)]
    fixed = (table.get("job_kind", pd.Series(dtype=object)) == "fixed_work").all()
    titles = {"RSS (MiB)": "RSS (MiB)",
              "CPU %": "CPU %" + (f" (100 = one core, ≤ {100 * int(cores[0])})" if cores else ""),
              "units/s": "no units/s: a fixed-work job (one run per trial)" if fixed
              else "units/s over time (1 s window)"}
    row = alt.Row("workers:O", sort=workers, title=None,
                  header=alt.Header(labelAngle=0, labelAlign="left", labelAnchor="start",
                                    labelExpr="datum.value == 1 ? '1 worker' "
                                              ": datum.value + ' workers'"))
    # each chart made in one call, as _zoomable's are (a third of the CPU otherwise)
    panels = [alt.FacetChart(data=data[data["panel"] == panel], facet=alt.FacetMapping(row=row),
                             spec=alt.layer(*_panel_layers(panel, colour), width=260,
                                            height=120, title=titles[panel]))
              for panel in PANELS]
    title = alt.TitleParams(f"Memory, CPU and throughput over time: {label}",
                            subtitle="seconds since the trial started; ▼ each trial's peak; "
                            "shaded: the load phase before 0 (not sampled); dotted: its peak RSS",
                            anchor="start")
    return alt.hconcat(*panels, title=title,
                       resolve=alt.Resolve(scale=alt.ScaleResolveMap(x="shared")))


def _panel_layers(panel: str, colour: str) -> list[Any]:
    x = alt.X("t:Q", title="seconds since the trial started")
    tooltip = [alt.Tooltip("t:Q", title="t (s)", format=".2f"),
               alt.Tooltip("value:Q", title=panel, format=",.1f"), alt.Tooltip("workers:Q"),
               alt.Tooltip("repeat:Q"), alt.Tooltip("status:N")]
    ok = _opacity(alt.condition(alt.datum.status == rpt.OK, alt.value(1.0), alt.value(0.45)))
    samples = alt.Chart(description="samples").mark_line(color=colour, strokeWidth=1.2).encode(
        x=x, y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=True)),
        detail=alt.Detail("trial:N"),
        strokeDash=alt.StrokeDash("repeat:N", title="repeat"), opacity=ok, tooltip=tooltip,
    ).transform_filter(alt.datum.kind == "sample")
    load = alt.Chart(description="load").mark_rect(color=colour, opacity=0.12).encode(
        x=alt.X("t:Q"), x2=alt.X2("t_end:Q")).transform_filter(alt.datum.kind == "load")
    layers = [load, samples]
    if panel == "RSS (MiB)":
        layers.append(alt.Chart(description="peak").mark_point(
            shape="triangle-down", filled=True, size=50, color=colour).encode(
            x=alt.X("t:Q"), y=alt.Y("value:Q"), tooltip=tooltip,
        ).transform_filter(alt.datum.kind == "peak"))
        layers.append(alt.Chart(description="before").mark_rule(
            color=colour, strokeDash=[2, 2]).encode(
            x=alt.X("t:Q"), x2=alt.X2("t_end:Q"), y=alt.Y("value:Q"),
            tooltip=[alt.Tooltip("value:Q", title="peak RSS before t=0 (MiB)", format=",.1f")],
        ).transform_filter(alt.datum.kind == "before"))
    return layers


def timeline_budget(trials: int) -> int:
    """Samples per trial and panel: ``MAX_TIMELINE_POINTS`` shared, 20 to 300 each."""
    return max(20, min(MAX_POINTS_PER_TRIAL, MAX_TIMELINE_POINTS // max(trials, 1)))


def memory_timeline(data: pd.DataFrame) -> Any | None:
    """One interactive chart of every trial's RSS over time, one machine at a time (a
    dropdown picks it), one colour per worker count: the HTML's memory timeline.
    ``data``: ``timeline_data`` of every trial."""
    data = data[(data["panel"] == "RSS (MiB)") & (data["kind"] == "sample")]
    if not len(data):
        return None
    data = data[["label", "workers", "repeat", "status", "t", "value"]].copy()
    data["trial"] = [f"{w} workers, repeat {r}" for w, r in zip(data["workers"],
                                                                 data["repeat"], strict=True)]
    labels = sorted(set(data["label"]))
    machine = alt.param(name="machine", value=labels[0], bind=alt.binding_select(
        options=labels, name="machine "))
    pick = alt.selection_point(fields=["workers"], bind="legend", name="pick_workers")
    head = _title("Memory over time", f"every trial's RSS, one machine at a time "
                  f"({len(labels)} machines: pick one below the chart)")
    return alt.Chart(data, description="rss", width=WIDTH, height=HEIGHT, title=head).mark_line(
        strokeWidth=1.3).encode(
        x=alt.X("t:Q", title="seconds since the trial started"),
        y=alt.Y("value:Q", title="RSS (MiB)", scale=alt.Scale(zero=True)),
        color=alt.Color("workers:O", title="workers", scale=alt.Scale(scheme="viridis"),
                        legend=alt.Legend(orient="bottom", columns=8)),
        strokeDash=alt.StrokeDash("repeat:N", title="repeat",
                                  legend=alt.Legend(orient="bottom")),
        detail=alt.Detail("trial:N"), opacity=_faded(pick),
        tooltip=[alt.Tooltip("label:N", title="machine"), alt.Tooltip("workers:Q"),
                 alt.Tooltip("repeat:Q"), alt.Tooltip("t:Q", title="t (s)", format=".2f"),
                 alt.Tooltip("value:Q", title="RSS (MiB)", format=",.1f"),
                 alt.Tooltip("status:N")],
    ).transform_filter(alt.datum.label == machine).add_params(
        machine, pick, alt.selection_interval(bind="scales", name="zoom"))


# ---------------------------------------------------------------- profiles


def shares_figure(records: list[dict[str, Any]], machine: str) -> Any | None:
    """Stacked bars of the CPU shares (py-spy) against worker count for one machine."""
    from orchestrator.results.profiles import SHARE_LABELS, _no_profile, _where

    mine = [r for r in records if _where(r) == machine and _no_profile(r) is None
            and (r["profile"].get("shares") or None)]  # fmt: skip
    if not mine:
        return None
    data = pd.DataFrame([
        {"workers": str(r["workers"]), "order": i, "share": label,
         "percent": 100 * float(r["profile"]["shares"].get(key) or 0.0)}
        for r in mine for i, (key, label) in enumerate(SHARE_LABELS.items())])
    labels = list(SHARE_LABELS.values())
    pick = alt.selection_point(fields=["share"], bind="legend", name="pick")
    head = alt.TitleParams(f"Why scaling stops — {machine}", anchor="start")
    return alt.Chart(data, description="shares", width=WIDTH * 3 // 4, height=HEIGHT * 3 // 4,
                     title=head).mark_bar().encode(
        x=alt.X("workers:O", title="workers", sort=[str(r["workers"]) for r in mine]),
        y=alt.Y("percent:Q", title="% of thread samples (py-spy)", stack="zero"),
        color=alt.Color("share:N", title=None, sort=labels, scale=alt.Scale(
            domain=labels, range=list(TAB10[:len(labels)])),
            legend=alt.Legend(orient="bottom")),
        order=alt.Order("order:Q"), opacity=_faded(pick),
        tooltip=[alt.Tooltip("workers:N"), alt.Tooltip("share:N"),
                 alt.Tooltip("percent:Q", format=".1f")],
    ).add_params(pick)


def profile_figures(run_dir: Path) -> list[Drawn]:
    """One stacked-bar figure per profiled machine (a grid point: a machine of its own)."""
    from orchestrator.results.profiles import _where, load_profiles

    records = [r for r in load_profiles(run_dir) if (r.get("profile") or {}).get("kind") == "cpu"]
    drawn = []
    for machine in sorted({_where(r) for r in records}):
        chart = shares_figure(records, machine)
        if chart is not None:
            drawn.append(Drawn(
                f"why-scaling-stops-{re.sub(r'[^A-Za-z0-9._-]+', '-', machine)}.svg",
                f"{machine}: where thread time goes per worker count (profiled trials, py-spy)",
                chart))
    return drawn


# ---------------------------------------------------------------- a report's figures


def report_figures(
    run: rpt.RunData,
    summary: pd.DataFrame,
    usl_models: dict[tuple[str, str], Any] | None = None,
) -> tuple[list[Drawn], list[Drawn]]:
    """(the figures a page shows, one time-series figure per machine for report.md).

    The page's list: throughput and efficiency vs workers, $ per unit vs rate with the
    Pareto front, peak memory vs workers, the memory timeline (every machine, one picked
    at a time), then the profiles' bars. ``usl_models``: the report's own USL fits per
    (machine, ran_on), drawn as they are (fitted here when not given).

    Built with Altair's debug mode off: in it every chart object is turned into a dict
    with its data and checked against the schema as it is made, seconds for a report of
    200 machines; the tests build the same figures with it on."""
    from altair.utils.schemapi import debug_mode

    with debug_mode(False):
        return _report_figures(run, summary, usl_models)


def _report_figures(
    run: rpt.RunData,
    summary: pd.DataFrame,
    usl_models: dict[tuple[str, str], Any] | None,
) -> tuple[list[Drawn], list[Drawn]]:
    table = frame(summary)
    trials = frame(run.trials)
    colours = machine_colours(_pairs(trials))
    measure = run.measure  # units/s, or runs/h and $ per run for a fixed-work job
    page: list[Drawn] = []
    if len(table):
        est = " (costs are estimates)" if table["estimate"].astype(bool).any() else ""
        page += [
            Drawn("throughput.svg", "Throughput vs workers per machine (median over repeats "
                  "with its interval; dots are single repeats, hollow markers oversubscribed, "
                  "★ the knee; dashed: the USL fit with its 95% band, drawn only when the "
                  "fit is good)",
                  throughput_figure(table, trials, colours=colours, usl_models=usl_models,
                                    measure=measure)),
            Drawn("efficiency.svg", "Scaling efficiency vs workers (1.0 = perfectly linear "
                  "from 1 worker)", efficiency_figure(table, colours=colours)),
            Drawn("cost_vs_throughput.svg", f"Cost {measure.cost_per} vs throughput "
                  f"({measure.name}), Pareto front marked{est}",
                  cost_figure(table, colours=colours, measure=measure)),
            Drawn("peak_memory.svg", "Peak RSS vs workers per machine",
                  memory_figure(table, colours=colours)),
        ]
    timeline = timeline_data(run, trials, timeline_budget(len(trials)))
    chart = memory_timeline(timeline)
    if chart is not None:
        page.append(Drawn("", "Memory (RSS) over time, every trial of the machine picked",
                          chart))
    page += profile_figures(run.run_dir)
    per_machine = []
    groups = list(trials.groupby(["machine", "ran_on"], sort=True))
    chosen = _fastest(table, MAX_TIMESERIES_FIGURES) if len(groups) > MAX_TIMESERIES_FIGURES \
        else None
    for (machine, ran_on), group in groups:
        label = rpt.machine_label(machine, ran_on)
        if chosen is not None and label not in chosen:
            continue
        chart = timeseries_figure(run, group, colour=colours[label],
                                  data=timeline[timeline["label"] == label])
        if chart is not None:
            name = _safe(f"{machine}" if machine == ran_on else f"{machine}_on_{ran_on}")
            per_machine.append(Drawn(
                f"timeseries_{name}.svg",
                f"Memory (RSS), CPU and throughput over time, every trial: {label} (one row "
                "per worker count, one line style per repeat, ▼ each trial's peak)", chart))
    return page, per_machine


def _fastest(summary: pd.DataFrame, n: int) -> set[str]:
    """The labels of the ``n`` machines with the highest median throughput."""
    if not len(summary):
        return set()
    table = _labelled(summary)
    best = table.groupby("label")["units_per_s"].max().fillna(-1.0)
    return set(best.sort_values(ascending=False, kind="stable").index[:n])


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)
