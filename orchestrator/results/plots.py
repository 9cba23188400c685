"""The report's figures as PNG files, drawn with matplotlib's Agg canvas.

Figures are built with ``matplotlib.figure.Figure`` rather than pyplot: no
global state and no GUI backend, so a report can be written from the sweep
engine's thread or a headless CI box. matplotlib is imported inside the
functions; importing this module costs nothing.

The numbers plotted are the ones the tables show (``orchestrator.results.report``'s
summary, knees and Pareto front), so a figure never disagrees with a table.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.formatting import is_finite
from orchestrator.results import report as rpt

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 90

LINESTYLES = ("-", "--", ":", "-.")
"""One per repeat (or per ``split_by`` value): the colour already says which machine."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
"""One per ``split_by`` value, so a single-point line is told apart too."""


def machine_colours(pairs) -> dict[str, str]:
    """One colour per machine label (``machine_label(machine, ran_on)``), the same in every figure.

    Labels are sorted before colours are handed out, so a machine keeps its
    colour between the figures of a report (and between reports of the same
    machines). tab10 first, then tab20 for sweeps of more than ten machines.
    """
    from matplotlib import colormaps

    labels = sorted({rpt.machine_label(m, r) for m, r in pairs})
    palette = [colormaps["tab10"](i) for i in range(10)] + [
        colormaps["tab20"](i) for i in range(1, 20, 2)
    ]
    from matplotlib.colors import to_hex

    return {label: to_hex(palette[i % len(palette)]) for i, label in enumerate(labels)}


def _pairs(frame: pd.DataFrame) -> list[tuple[str, str]]:
    return list(zip(frame["machine"], frame["ran_on"], strict=True))


def render_plots(run: rpt.RunData, summary: pd.DataFrame, out_dir: Path) -> list[tuple[str, str]]:
    """Write every figure into ``out_dir``; returns (path relative to the store, caption) pairs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rel = out_dir.relative_to(run.run_dir) if out_dir.is_relative_to(run.run_dir) else out_dir
    written: list[tuple[str, str]] = []
    colours = machine_colours(_pairs(run.trials))

    def save(fig: Figure, name: str, caption: str) -> None:
        fig.savefig(out_dir / name, dpi=DPI)
        written.append(((rel / name).as_posix(), caption))

    if not summary.empty:
        estimated = bool(summary["estimate"].any())
        est = " (costs are estimates)" if estimated else ""
        save(
            throughput_figure(summary, run.trials, colours=colours),
            "throughput.png",
            "Throughput vs workers per machine (median over repeats with its spread as error "
            "bars; dots are single repeats, hollow markers oversubscribed, ★ the knee; dashed: "
            "the USL fit with its 95% band, drawn only when the fit is good)",
        )
        save(
            efficiency_figure(summary, colours=colours),
            "efficiency.png",
            "Scaling efficiency vs workers (1.0 = perfectly linear from 1 worker)",
        )
        save(
            cost_figure(summary, colours=colours),
            "cost_vs_throughput.png",
            f"Cost per million units vs throughput, Pareto front marked{est}",
        )
        save(
            memory_figure(summary, colours=colours),
            "peak_memory.png",
            "Peak RSS vs workers per machine",
        )
    trials = run.trials
    for (machine, ran_on), group in trials.groupby(["machine", "ran_on"], sort=True):
        label = rpt.machine_label(machine, ran_on)
        fig = timeseries_figure(run, group, colour=colours[label])
        if fig is None:
            continue
        name = "timeseries_" + _safe(
            f"{machine}" if machine == ran_on else f"{machine}_on_{ran_on}"
        )
        save(
            fig,
            f"{name}.png",
            f"Memory (RSS), CPU and throughput over time, every trial: {label} "
            "(one row per worker count, one line style per repeat, ▼ each trial's peak)",
        )
    return written


def _new_figure(width: float = 8.0, height: float = 4.5) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _legend(fig: Figure, ax: Axes) -> None:
    """The legend beside the axes, never on them: constrained layout makes room for it."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize="small")


def _groups(summary: pd.DataFrame, split_by: str | None = None):
    """(label, machine label, rows, keys, split index) per machine, and per ``split_by`` value."""
    keys = [split_by, "machine", "ran_on"] if split_by else ["machine", "ran_on"]
    splits = sorted({str(v) for v in summary[split_by]}) if split_by else []
    for values, group in summary.groupby(keys, sort=True):
        *split, machine, ran_on = values
        machine_name = rpt.machine_label(machine, ran_on)
        label = machine_name + (f" [{split[0]}]" if split else "")
        index = splits.index(str(split[0])) if split else 0
        yield (
            label,
            machine_name,
            group.sort_values("workers"),
            dict(zip(keys, values, strict=True)),
            index,
        )


def _colours_for(summary: pd.DataFrame, colours: dict[str, str] | None) -> dict[str, str]:
    return colours if colours is not None else machine_colours(_pairs(summary))


def _workers_axis(ax: Axes, summary: pd.DataFrame) -> None:
    workers = sorted(set(int(w) for w in summary["workers"]))
    if workers and workers[-1] / max(workers[0], 1) >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(workers)
    ax.set_xticklabels([str(w) for w in workers])
    ax.set_xlabel("workers")
    ax.grid(True, alpha=0.3)


def _line_with_oversubscription(
    ax: Axes,
    group: pd.DataFrame,
    y: str,
    label: str,
    colour: str,
    linestyle: str = "-",
    marker: str = "o",
) -> None:
    """One line per machine in its colour; oversubscribed points drawn hollow."""
    ax.plot(
        group["workers"], group[y], marker=marker, label=label, color=colour, linestyle=linestyle
    )
    over = group[group["oversubscribed"]]
    if not over.empty:
        ax.plot(
            over["workers"],
            over[y],
            linestyle="none",
            marker="o",
            markersize=9,
            markerfacecolor="white",
            markeredgecolor=colour,
        )


def throughput_figure(
    summary: pd.DataFrame,
    trials: pd.DataFrame | None = None,
    split_by: str | None = None,
    colours: dict[str, str] | None = None,
) -> Figure:
    """Median lines with spread bars, each repeat a faint dot, ★ at the knee, the USL fit.

    The error bars are the summary's spread (IQR, or the bootstrap 95 % CI of the
    median from enough repeats). With ``trials`` and no ``split_by``, each
    machine's USL fit is drawn dashed with its 95 % band, over the tested range
    and a little past it; a poor fit is not drawn (the report's table says why).

    ``split_by`` names a column of both frames (the notebook's ``strategy``) that
    splits a machine into several lines: same colour (the machine), one line
    style per value. The y axis starts at 0, so a gain reads at its true size.
    """
    colours = _colours_for(summary, colours)
    fig = _new_figure()
    ax = fig.add_subplot()
    for label, machine, group, keys, index in _groups(summary, split_by):
        colour = colours[machine]
        style, marker = LINESTYLES[index % len(LINESTYLES)], MARKERS[index % len(MARKERS)]
        _line_with_oversubscription(ax, group, "units_per_s", label, colour, style, marker)
        spread = group.dropna(subset=["units_per_s_low", "units_per_s_high"])
        if not spread.empty:
            ax.errorbar(
                spread["workers"],
                spread["units_per_s"],
                yerr=[
                    (spread["units_per_s"] - spread["units_per_s_low"]).clip(lower=0),
                    (spread["units_per_s_high"] - spread["units_per_s"]).clip(lower=0),
                ],
                fmt="none",
                ecolor=colour,
                capsize=3,
                alpha=0.8,
            )
        if trials is not None and split_by is None:
            _usl_curve(ax, trials, keys, colour)
        if trials is not None:
            mine = trials[trials["status"] == rpt.OK]
            for column, value in keys.items():
                mine = mine[mine[column].astype(str) == str(value)]
            ax.scatter(mine["workers"], mine["units_per_s"], s=10, color=colour, alpha=0.4)
        knee = rpt.find_knee(list(group["workers"]), list(group["units_per_s"]))
        if knee.reached and knee.workers is not None:
            ax.plot(
                [knee.workers],
                [knee.units_per_s],
                marker="*",
                markersize=16,
                color=colour,
                linestyle="none",
            )
    ax.set_ylabel("units/s (median)")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput vs workers")
    _workers_axis(ax, summary)
    _legend(fig, ax)
    return fig


def _usl_curve(ax: Axes, trials: pd.DataFrame, keys: dict[str, Any], colour: str) -> None:
    """The machine's fitted USL curve (dashed) and its 95 % band, when the fit is good."""
    import numpy as np

    from orchestrator.plan.model import fit_usl_with_intervals
    from orchestrator.results.report.model import samples

    data = samples(trials).get((str(keys["machine"]), str(keys["ran_on"])))
    model = fit_usl_with_intervals(data) if data else None
    if model is None or model.fit.poor:
        return
    top = max(data)
    ns = np.geomspace(max(min(data), 1), top * 1.25, 60)
    band = model.band(list(ns))
    ax.plot(ns, [b[0] for b in band], linestyle="--", color=colour, linewidth=1, label="_usl")
    ax.fill_between(ns, [b[1] for b in band], [b[2] for b in band], color=colour, alpha=0.15)


def efficiency_figure(summary: pd.DataFrame, colours: dict[str, str] | None = None) -> Figure:
    colours = _colours_for(summary, colours)
    fig = _new_figure()
    ax = fig.add_subplot()
    for label, machine, group, _, _ in _groups(summary):
        known = group.dropna(subset=["efficiency"])
        if not known.empty:
            _line_with_oversubscription(ax, known, "efficiency", label, colours[machine])
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("efficiency (median)")
    ax.set_title("Scaling efficiency vs workers")
    _workers_axis(ax, summary)
    if ax.get_legend_handles_labels()[0]:
        _legend(fig, ax)
    else:
        ax.text(
            0.5,
            0.5,
            "no 1-worker baseline: efficiency unknown",
            ha="center",
            transform=ax.transAxes,
        )
    return fig


def cost_figure(summary: pd.DataFrame, colours: dict[str, str] | None = None) -> Figure:
    """$ per million units against units/s (from 0), each point numbered with its workers."""
    colours = _colours_for(summary, colours)
    fig = _new_figure()
    ax = fig.add_subplot()
    known = summary.dropna(subset=["cost_per_million_units", "units_per_s"])
    if known.empty:
        ax.text(0.5, 0.5, "no price known: cost unavailable", ha="center", transform=ax.transAxes)
    for label, machine, group, _, _ in _groups(known):
        ax.scatter(
            group["units_per_s"],
            group["cost_per_million_units"],
            label=label,
            s=30,
            color=colours[machine],
        )
        for r in group.to_dict("records"):
            ax.annotate(
                f"{r['workers']}",
                (r["units_per_s"], r["cost_per_million_units"]),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
            )
    front = known[known["pareto"]].sort_values("units_per_s")
    if not front.empty:
        ax.plot(
            front["units_per_s"],
            front["cost_per_million_units"],
            color="black",
            linewidth=1.2,
            marker="D",
            markerfacecolor="none",
            markersize=10,
            label="Pareto front",
        )
    estimated = bool(known["estimate"].any()) if not known.empty else False
    ax.set_xlabel("units/s (median)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("USD per million units" + (" (estimate)" if estimated else ""))
    ax.set_title("Cost vs throughput (numbers: workers)")
    ax.grid(True, alpha=0.3)
    _legend(fig, ax)
    return fig


def memory_figure(summary: pd.DataFrame, colours: dict[str, str] | None = None) -> Figure:
    colours = _colours_for(summary, colours)
    fig = _new_figure()
    ax = fig.add_subplot()
    for label, machine, group, _, _ in _groups(summary):
        mib = group.assign(peak_mib=group["peak_rss_bytes"] / 2**20)
        _line_with_oversubscription(ax, mib, "peak_mib", label, colours[machine])
    ax.set_ylabel("peak RSS (MiB, max over repeats)")
    ax.set_ylim(bottom=0)
    ax.set_title("Peak memory vs workers")
    _workers_axis(ax, summary)
    _legend(fig, ax)
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


def _series(run: rpt.RunData, group: pd.DataFrame):
    """(trial row, time series) of every trial of the group that has a readable series."""
    import pandas as pd

    ordered = group.sort_values(["workers", "repeat"], na_position="last")
    for r in ordered.to_dict("records"):
        path = run.timeseries_path(str(r["trial_id"]))
        if not path.exists():
            continue
        try:
            frame = pd.read_parquet(path)
        except Exception:  # a corrupt series must not cost the whole report
            continue
        if not frame.empty and {"t", "rss_bytes", "cpu_percent"} <= set(frame.columns):
            yield r, frame


def timeseries_figure(
    run: rpt.RunData, group: pd.DataFrame, colour: str | None = None
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
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    series = list(_series(run, group))
    if not series:
        return None
    colour = colour or machine_colours(_pairs(group)).popitem()[1]
    workers = sorted({int(r["workers"]) for r, _ in series})
    repeats = sorted({int(r["repeat"]) for r, _ in series if r.get("repeat") is not None})
    fig = _new_figure(10.0, 1.2 + 2.0 * len(workers))
    axes = fig.subplots(len(workers), 3, sharex=True, sharey="col", squeeze=False)
    before_shown = load_shown = False
    for r, frame in series:
        row = axes[workers.index(int(r["workers"]))]
        style = LINESTYLES[repeats.index(int(r["repeat"])) % len(LINESTYLES)] if repeats else "-"
        alpha = 1.0 if r["status"] == rpt.OK else 0.45
        t = frame["t"].to_numpy(dtype=float)
        rss = frame["rss_bytes"].to_numpy(dtype=float) / 2**20
        row[0].plot(t, rss, color=colour, linestyle=style, linewidth=1.2, alpha=alpha)
        if len(rss):
            peak = int(rss.argmax())
            row[0].plot(
                [t[peak]], [rss[peak]], marker="v", color=colour, markersize=8, linestyle="none"
            )
        before, load_s = r.get("peak_rss_before_trial_bytes"), r.get("load_s")
        if is_finite(load_s) and float(load_s) > 0:  # like mprof: the process before the trial
            for ax in row:
                ax.axvspan(-float(load_s), 0.0, color=colour, alpha=0.06, linewidth=0)
            load_shown = True
        if is_finite(before):
            start = -float(load_s) if is_finite(load_s) else t[0] if len(t) else 0.0
            row[0].hlines(
                float(before) / 2**20, start, 0.0 if is_finite(load_s) else t[-1],
                color=colour, linestyles=(0, (1, 2)), alpha=0.8,
            )  # fmt: skip
            before_shown = True
        cores = r.get("vcpus")
        cpu = cpu_percent_clipped(frame["cpu_percent"], int(cores) if is_finite(cores) else None)
        row[1].plot(t, cpu, color=colour, linestyle=style, linewidth=1.2, alpha=alpha)
        if "units" in frame and frame["units"].notna().any():
            known = frame.dropna(subset=["units"])
            tt, rate = units_per_s_over_time(known["t"], known["units"])
            row[2].plot(tt, rate, color=colour, linestyle=style, linewidth=1.2, alpha=alpha)
    for i, w in enumerate(workers):
        statuses = [
            f"repeat {r['repeat']} {r['status']}"
            for r, _ in series
            if int(r["workers"]) == w and r["status"] != rpt.OK
        ]
        axes[i][0].set_ylabel(f"{rpt.n_workers(w)}\nRSS (MiB)")
        axes[i][1].set_ylabel("CPU %")
        axes[i][2].set_ylabel("units/s")
        if statuses:
            axes[i][0].set_title("not ok (faint): " + ", ".join(statuses), fontsize="small")
        for ax in axes[i]:
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
    cores = group["vcpus"].dropna()
    cpu_note = f" (100 = one core, ≤ {100 * int(cores.iloc[0])})" if not cores.empty else ""
    axes[0][1].set_title("CPU %" + cpu_note, fontsize="small")
    axes[0][2].set_title("units/s over time (1 s window)", fontsize="small")
    axes[-1][1].set_xlabel(  # one label under the middle panel: three would overlap
        "seconds since the trial started" + (" (the load phase before 0)" if load_shown else "")
    )
    handles = [
        Line2D(
            [], [], color=colour, linestyle=LINESTYLES[k % len(LINESTYLES)], label=f"repeat {rep}"
        )
        for k, rep in enumerate(repeats)
    ]
    handles.append(Line2D([], [], color=colour, marker="v", linestyle="none", label="peak"))
    if load_shown:
        handles.append(Patch(color=colour, alpha=0.15, label="load phase before t=0 (not sampled)"))
    if before_shown:
        handles.append(
            Line2D([], [], color=colour, linestyle=(0, (1, 2)), label="peak RSS before t=0")
        )
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize="small")
    fig.suptitle(
        "Memory, CPU and throughput over time: "
        + rpt.machine_label(group["machine"].iloc[0], group["ran_on"].iloc[0])
    )
    return fig
