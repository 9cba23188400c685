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
from typing import TYPE_CHECKING

from orchestrator.results import report as rpt

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_SERIES = 8
"""Time-series lines per machine figure (one per worker count), so it stays readable."""

DPI = 90


def render_plots(run: rpt.RunData, summary: pd.DataFrame, out_dir: Path) -> list[tuple[str, str]]:
    """Write every figure into ``out_dir``; returns (path relative to the store, caption) pairs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rel = out_dir.relative_to(run.run_dir) if out_dir.is_relative_to(run.run_dir) else out_dir
    written: list[tuple[str, str]] = []

    def save(fig: Figure, name: str, caption: str) -> None:
        fig.savefig(out_dir / name, dpi=DPI)
        written.append(((rel / name).as_posix(), caption))

    if not summary.empty:
        estimated = bool(summary["estimate"].any())
        est = " (costs are estimates)" if estimated else ""
        save(
            throughput_figure(summary, run.trials),
            "throughput.png",
            "Throughput vs workers per machine (median over repeats; dots are single repeats, "
            "hollow markers oversubscribed, ★ the knee)",
        )
        save(
            efficiency_figure(summary),
            "efficiency.png",
            "Scaling efficiency vs workers (1.0 = perfectly linear from 1 worker)",
        )
        save(
            cost_figure(summary),
            "cost_vs_throughput.png",
            f"Cost per million units vs throughput, Pareto front marked{est}",
        )
        save(memory_figure(summary), "peak_memory.png", "Peak RSS vs workers per machine")
    trials = run.trials
    for (machine, ran_on), group in trials.groupby(["machine", "ran_on"], sort=True):
        fig = timeseries_figure(run, group)
        if fig is None:
            continue
        name = "timeseries_" + _safe(
            f"{machine}" if machine == ran_on else f"{machine}_on_{ran_on}"
        )
        save(
            fig,
            f"{name}.png",
            f"Memory (RSS) and CPU over time per trial: {rpt.machine_label(machine, ran_on)}",
        )
    return written


def _new_figure(width: float = 7.0, height: float = 4.5) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _groups(summary: pd.DataFrame, split_by: str | None = None):
    """(label, rows, keys) per machine — and per value of ``split_by`` when given."""
    keys = [split_by, "machine", "ran_on"] if split_by else ["machine", "ran_on"]
    for values, group in summary.groupby(keys, sort=True):
        *split, machine, ran_on = values
        label = rpt.machine_label(machine, ran_on) + (f" [{split[0]}]" if split else "")
        yield label, group.sort_values("workers"), dict(zip(keys, values, strict=True))


def _workers_axis(ax: Axes, summary: pd.DataFrame) -> None:
    workers = sorted(set(int(w) for w in summary["workers"]))
    if workers and workers[-1] / max(workers[0], 1) >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(workers)
    ax.set_xticklabels([str(w) for w in workers])
    ax.set_xlabel("workers")
    ax.grid(True, alpha=0.3)


def _line_with_oversubscription(ax: Axes, group: pd.DataFrame, y: str, label: str) -> str:
    """One line per machine; oversubscribed points drawn hollow. Returns the colour used."""
    (line,) = ax.plot(group["workers"], group[y], marker="o", label=label)
    colour = line.get_color()
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
    return colour


def throughput_figure(
    summary: pd.DataFrame, trials: pd.DataFrame | None = None, split_by: str | None = None
) -> Figure:
    """Median lines, each repeat as a faint dot (the spread behind a median), ★ at the knee.

    ``split_by`` names a column of both frames (the notebook's ``strategy``) that
    splits a machine into several lines.
    """
    fig = _new_figure()
    ax = fig.add_subplot()
    for label, group, keys in _groups(summary, split_by):
        colour = _line_with_oversubscription(ax, group, "units_per_s", label)
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
    ax.set_title("Throughput vs workers")
    _workers_axis(ax, summary)
    ax.legend(fontsize="small")
    return fig


def efficiency_figure(summary: pd.DataFrame) -> Figure:
    fig = _new_figure()
    ax = fig.add_subplot()
    for label, group, _ in _groups(summary):
        known = group.dropna(subset=["efficiency"])
        if not known.empty:
            _line_with_oversubscription(ax, known, "efficiency", label)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("efficiency (median)")
    ax.set_title("Scaling efficiency vs workers")
    _workers_axis(ax, summary)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    else:
        ax.text(
            0.5,
            0.5,
            "no 1-worker baseline: efficiency unknown",
            ha="center",
            transform=ax.transAxes,
        )
    return fig


def cost_figure(summary: pd.DataFrame) -> Figure:
    fig = _new_figure()
    ax = fig.add_subplot()
    known = summary.dropna(subset=["cost_per_million_units", "units_per_s"])
    if known.empty:
        ax.text(0.5, 0.5, "no price known: cost unavailable", ha="center", transform=ax.transAxes)
    for label, group, _ in _groups(known):
        ax.scatter(group["units_per_s"], group["cost_per_million_units"], label=label, s=30)
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
    ax.set_ylabel("USD per million units" + (" (estimate)" if estimated else ""))
    ax.set_title("Cost vs throughput (numbers: workers)")
    ax.grid(True, alpha=0.3)
    if not known.empty:
        ax.legend(fontsize="small")
    return fig


def memory_figure(summary: pd.DataFrame) -> Figure:
    fig = _new_figure()
    ax = fig.add_subplot()
    for label, group, _ in _groups(summary):
        mib = group.assign(peak_mib=group["peak_rss_bytes"] / 2**20)
        _line_with_oversubscription(ax, mib, "peak_mib", label)
    ax.set_ylabel("peak RSS (MiB, max over repeats)")
    ax.set_ylim(bottom=0)
    ax.set_title("Peak memory vs workers")
    _workers_axis(ax, summary)
    ax.legend(fontsize="small")
    return fig


def _pick_trials(group: pd.DataFrame) -> pd.DataFrame:
    """One trial per worker count (its first repeat that finished ok, else its first), at most
    ``MAX_SERIES`` of them spread evenly over the worker counts."""
    ordered = group.assign(_bad=group["status"] != rpt.OK).sort_values(
        ["workers", "_bad", "repeat"], na_position="last"
    )
    chosen = ordered.drop_duplicates("workers", keep="first")
    n = len(chosen)
    if n > MAX_SERIES:  # evenly spread, keeping the smallest and the largest count
        chosen = chosen.iloc[
            sorted({round(i * (n - 1) / (MAX_SERIES - 1)) for i in range(MAX_SERIES)})
        ]
    return chosen


def timeseries_figure(run: rpt.RunData, group: pd.DataFrame) -> Figure | None:
    """RSS (top) and CPU % (bottom) over time, one line per worker count, for one machine.

    Two shared panels rather than one panel per trial: the lines are directly
    comparable, and the figure stays cheap to draw however many trials ran.
    """
    import pandas as pd

    series = []
    for r in _pick_trials(group).to_dict("records"):
        path = run.timeseries_path(str(r["trial_id"]))
        if not path.exists():
            continue
        try:
            frame = pd.read_parquet(path, columns=["t", "rss_bytes", "cpu_percent"])
        except Exception:  # a corrupt series must not cost the whole report
            continue
        if not frame.empty:
            series.append((r, frame))
    if not series:
        return None
    fig = _new_figure(7.0, 5.5)
    rss, cpu = fig.subplots(2, 1, sharex=True)
    for r, frame in series:
        status = "" if r["status"] == rpt.OK else f" [{r['status']}]"
        label = f"{rpt.n_workers(int(r['workers']))}, repeat {r['repeat']}{status}"
        rss.plot(frame["t"], frame["rss_bytes"] / 2**20, linewidth=1.2, label=label)
        cpu.plot(frame["t"], frame["cpu_percent"], linewidth=1.2, label=label)
    rss.set_ylabel("RSS (MiB)")
    rss.set_ylim(bottom=0)
    rss.grid(True, alpha=0.3)
    rss.legend(fontsize="x-small", ncols=2)
    cpu.set_ylabel("CPU % (100 = one core)")
    cpu.set_ylim(bottom=0)
    cpu.set_xlabel("seconds since the trial started")
    cpu.grid(True, alpha=0.3)
    fig.suptitle(
        "Memory and CPU over time: "
        + rpt.machine_label(group["machine"].iloc[0], group["ran_on"].iloc[0])
    )
    return fig
