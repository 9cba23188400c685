"""Two or more sweeps side by side: did the new machine, library or code change pay off?

Each run is reduced to the same headline numbers the report leads with (best
units/s, best units/s per vCPU, best cost per million units, peak memory, the
knee of its fastest machine), and every later run is shown as a ratio to the
first, so "1.8×" reads directly as the gain. The numbers come from
``orchestrator.results.report``'s summary, never recomputed here. A fixed-work job's
are shown in its own measure (runs/h, $ per run, with the time per run); two runs measured
differently get no ratio between their rates or costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UsageError
from orchestrator.results import report as rpt
from orchestrator.results.report.measure import UNITS, Measure
from orchestrator.results.report.model import best_row
from orchestrator.results.report.values import numeric

if TYPE_CHECKING:
    import pandas as pd
    from rich.console import Console

    from orchestrator.analysis.model import Comparison


@dataclass(frozen=True)
class Metric:
    value: float  # NaN when unknown
    where: str  # "machine × N workers", or "" when unknown
    estimate: bool = False
    repeats: tuple[float, ...] = ()  # the value of each ok repeat behind a median; () for a max


@dataclass(frozen=True)
class Headline:
    """The headline numbers of one run."""

    name: str
    workload: str  # what the trials ran, e.g. "cube (dim=60, strategy=fast), 5 s per trial"
    best_units_per_s: Metric
    best_units_per_s_per_vcpu: Metric
    best_cost_per_million_units: Metric
    peak_rss_bytes: Metric
    knee_workers: Metric  # of the machine with the best throughput
    measure: Measure = UNITS  # how its rates and costs are shown (units/s or runs/h)

    def metrics(self) -> dict[str, Metric]:
        return {label: getattr(self, attr) for label, attr, _ in metrics_for(self.measure)}


def metrics_for(measure: Measure) -> tuple[tuple[str, str, Any], ...]:
    """(label, attribute, formatter) of each headline metric, in ``measure``'s units: the
    values stay in base units (units/s, $ per million) and the formatter scales them."""
    if not measure.fixed_work:
        return METRICS

    def runs(x: Any) -> str:  # "10,837 (0.33 s/run)": the rate and the time it stands for
        rate = measure.rate(x)
        if not (math.isfinite(rate) and rate > 0):
            return rpt.DASH
        return f"{rpt.fmt_rate(rate)} ({_per_run(3600.0 / rate)})"

    return (
        (f"best {measure.name}", "best_units_per_s", runs),
        (f"best {measure.name} per vCPU", "best_units_per_s_per_vcpu",
         lambda x: rpt.fmt_rate(measure.rate(x))),
        (f"best $ {measure.cost_per}", "best_cost_per_million_units",
         lambda x: rpt.fmt_usd(measure.cost(x))),
        *METRICS[3:],
    )


def _per_run(seconds: float) -> str:
    from orchestrator.results.report.tables import fmt_seconds

    return fmt_seconds(seconds).replace(" s", " s/run").replace(" min", " min/run")


# (label, attribute, formatter); "lower is better" only for cost and memory.
METRICS: tuple[tuple[str, str, Any], ...] = (
    ("best units/s", "best_units_per_s", rpt.fmt_rate),
    ("best units/s per vCPU", "best_units_per_s_per_vcpu", rpt.fmt_rate),
    ("best $ per million units", "best_cost_per_million_units", rpt.fmt_usd),
    ("peak memory", "peak_rss_bytes", rpt.fmt_bytes),
    ("scaling stops at (workers)", "knee_workers", lambda x: rpt.fmt_rate(x)),
)
MEASURED = frozenset({"best_units_per_s", "best_units_per_s_per_vcpu",
                      "best_cost_per_million_units"})
"""The metrics in a run's measure: no ratio between a run in units and one in runs."""


def _where(row: Any) -> str:
    text = f"{row['machine']} × {int(row['workers'])}"
    return text + (f" on {row['ran_on']}" if row["estimate"] else "")


def _extreme(
    summary: pd.DataFrame,
    column: str,
    largest: bool,
    costs: bool = False,
    trials: pd.DataFrame | None = None,
) -> Metric:
    """The best row for ``column``; only a cost can be an estimate (throughput is measured).

    With ``trials``, the metric carries the per-repeat values behind that row's
    median, so a ratio between runs can be given with its interval.
    """
    found = summary[column]
    if found.isna().all():
        return Metric(math.nan, "")
    row = summary.loc[found.idxmax() if largest else found.idxmin()]
    repeats: tuple[float, ...] = ()
    if trials is not None:
        mine = trials[(trials["status"] == rpt.OK)
                      & (trials["machine"].astype(str) == str(row["machine"]))
                      & (trials["ran_on"].astype(str) == str(row["ran_on"]))
                      & (trials["workers"] == row["workers"])]
        import numpy as np

        values = numeric(mine, column)
        repeats = tuple(values[np.isfinite(values)].tolist())
    return Metric(float(row[column]), _where(row), costs and bool(row["estimate"]), repeats)


def headline(run: rpt.RunData) -> Headline:
    """One run's headline numbers (NaN where the run has no successful trial)."""
    summary = rpt.summarise(run.trials)
    fastest = _extreme(summary, "units_per_s", largest=True, trials=run.trials)
    knee = Metric(math.nan, "")
    if not summary.empty:
        top = best_row(summary)
        found = rpt.knees(summary)[(str(top["machine"]), str(top["ran_on"]))]
        machine = rpt.machine_label(top["machine"], top["ran_on"])
        if found.reached and found.workers is not None:
            knee = Metric(float(found.workers), machine)
        else:
            knee = Metric(math.nan, f"{machine}: {found.describe()}")
    cost = _extreme(summary, "cost_per_million_units", largest=False, costs=True, trials=run.trials)
    return Headline(
        name=run.name,
        workload=rpt.describe_workload(run),
        best_units_per_s=fastest,
        best_units_per_s_per_vcpu=_extreme(
            summary, "units_per_s_per_vcpu", largest=True, trials=run.trials
        ),
        best_cost_per_million_units=cost,
        peak_rss_bytes=_extreme(summary, "peak_rss_bytes", largest=True),
        knee_workers=knee,
        measure=run.measure,
    )


def comparable(head: Headline, base: Headline, attr: str) -> bool:
    """Whether a ratio of ``attr`` between two runs means anything (the same measure)."""
    return attr not in MEASURED or head.measure == base.measure


def ratio(value: float, base: float) -> float:
    """value / base; NaN when either is unknown or the base is zero."""
    if not (math.isfinite(value) and math.isfinite(base)) or base == 0:
        return math.nan
    return value / base


def ratio_interval(metric: Metric, base: Metric) -> Comparison | None:
    """The ratio metric ÷ base with its bootstrap 95 % interval over both runs' repeats.

    None when either side has no repeats behind it (peak memory is a max, the
    knee a count) or only one repeat each: with no measured spread an interval
    would be invented. :class:`~orchestrator.analysis.model.Comparison` says "no
    clear difference" when the interval contains 1.
    """
    from orchestrator.analysis.model import compare_groups

    if len(metric.repeats) < 2 and len(base.repeats) < 2:
        return None
    if not (metric.repeats and base.repeats):
        return None
    return compare_groups(base.repeats, metric.repeats)


def load_headlines(run_dirs: list[str | Path]) -> list[Headline]:
    """The headline numbers of each run, in the order given (the first is the base of ratios)."""
    if len(run_dirs) < 2:
        raise UsageError("compare needs at least two runs, e.g. cloudprof compare runs/a runs/b")
    return [headline(rpt.load_run(d)) for d in run_dirs]


COMPARE_SCHEMA = "cloudprof.compare/1"


def compare_document(heads: list[Headline], run_dirs: list[str | Path]) -> dict[str, Any]:
    """``cloudprof compare --json``: each run's metrics in base units, with its ratio to the first.

    Keys are stable (``schema`` changes when one is renamed or removed); unknown
    numbers are null. ``estimate`` is true for a cost priced on another host than
    the machine it stands for.
    """
    from orchestrator.results.report.json_doc import plain

    base = heads[0]
    runs = []
    for head, path in zip(heads, run_dirs, strict=True):
        metrics = {}
        for _label, attr, _fmt in METRICS:
            metric, first = getattr(head, attr), getattr(base, attr)
            same = comparable(head, base, attr)
            cmp = ratio_interval(metric, first) if head is not base and same else None
            metrics[attr] = {
                "value": metric.value,
                "where": metric.where or None,
                "estimate": metric.estimate,
                "repeats": len(metric.repeats) or None,
                "ratio_to_first": ratio(metric.value, first.value) if same else None,
                "ratio_ci95": [cmp.low, cmp.high] if cmp else None,
                "clear_difference": cmp.clear if cmp else None,
            }
        _in_measure(metrics, head.measure)
        runs.append(
            {
                "name": head.name,
                "path": str(path),
                "workload": head.workload or None,
                "same_workload_as_first": head.workload == base.workload,
                # values are in units/s and $ per million units; a fixed-work run's metrics
                # also hold them in its measure ("in_measure": runs/h, $ per run)
                "measure": head.measure.document(),
                "metrics": metrics,
            }
        )
    return plain({"schema": COMPARE_SCHEMA, "runs": runs})


def _unit(measure: Measure, attr: str) -> str:
    """ "runs/h", "runs/h per vCPU", "$/run": a metric's unit, where two runs differ in it."""
    if attr == "best_cost_per_million_units":
        return measure.cost_name
    return measure.name + (" per vCPU" if attr == "best_units_per_s_per_vcpu" else "")


def _in_measure(metrics: dict[str, dict[str, Any]], measure: Measure) -> None:
    """A fixed-work run's rate and cost metrics in its own units (runs/h, $ per run)."""
    if not measure.fixed_work:
        return
    metrics["best_units_per_s"]["in_measure"] = measure.rate(
        metrics["best_units_per_s"]["value"])
    metrics["best_units_per_s_per_vcpu"]["in_measure"] = measure.rate(
        metrics["best_units_per_s_per_vcpu"]["value"])
    metrics["best_cost_per_million_units"]["in_measure"] = measure.cost(
        metrics["best_cost_per_million_units"]["value"])


def compare_runs(run_dirs: list[str | Path], console: Console) -> list[Headline]:
    """Print the headline table of two or more runs with ratios to the first; returns the data.

    The table goes through the report's terminal renderer, so at 80 columns it
    wraps between words and never splits a number (a narrow terminal stacks it).
    """
    from orchestrator.results.report.terminal import print_table

    heads = load_headlines(run_dirs)
    base = heads[0]
    headers = ["metric", base.name]
    for head in heads[1:]:
        headers += [head.name, "ratio"]
    cells = ["workload", base.workload or rpt.DASH]
    for head in heads[1:]:
        same = head.workload == base.workload
        cells += [head.workload or rpt.DASH, "same" if same else "differs"]
    rows = [rpt.Row(cells)]
    formats = {h.measure: {attr: fmt for _, attr, fmt in metrics_for(h.measure)} for h in heads}
    for label, attr, fmt in metrics_for(base.measure):
        first = getattr(base, attr)
        cells = [label, _cell(first, fmt)]
        for head in heads[1:]:
            metric = getattr(head, attr)
            if not comparable(head, base, attr):  # shown in its own measure, no ratio
                own, unit = formats[head.measure][attr], _unit(head.measure, attr)
                cells += [_cell(metric, lambda v, f=own, u=unit: f"{f(v)} {u}"), "differs"]
                continue
            r = ratio(metric.value, first.value)
            cells += [_cell(metric, fmt), _ratio_cell(r, ratio_interval(metric, first))]
        rows.append(rpt.Row(cells))
    title = "cloudprof compare (ratios are run ÷ first run)"
    print_table(rpt.Table(title, headers, rows), console, rules=True)
    if any(h.best_cost_per_million_units.estimate for h in heads):
        console.print(
            "(est.): the trials ran on another host than the machine priced; "
            "the cost is an estimate."
        )
    console.print("Lower is better for cost and memory; higher for throughput.")
    if any(h.measure.fixed_work for h in heads):
        console.print("runs/h: a fixed-work job (no units reported) runs once per trial; "
                      "runs/h = 3600 ÷ its median time to complete, $ per run = $/hour × "
                      "that time ÷ 3600.")
    console.print(
        "[low–high]: bootstrap 95% interval of the ratio over both runs' repeats; "
        '"no clear difference" when it contains ×1. No interval: one repeat each, '
        "or a max (memory) or count (knee).",
        markup=False,  # plain text: as markup, "[low–high]" is a tag and vanishes
    )
    return heads


def fmt_ratio(r: float) -> str:
    """×2.00, ×0.50; small ratios keep two significant digits (×0.012), unknown is –."""
    if not math.isfinite(r):
        return rpt.DASH
    return f"×{r:.2f}" if abs(r) >= 0.1 else f"×{r:.2g}"


def _ratio_cell(r: float, cmp: Comparison | None) -> str:
    """ "×1.02 [0.95–1.10] no clear difference": the ratio, its interval, and what it means."""
    text = fmt_ratio(r)
    if cmp is None or not math.isfinite(r):
        return text
    text += f" [{fmt_ratio(cmp.low)[1:]}–{fmt_ratio(cmp.high)[1:]}]"
    return text + ("" if cmp.clear else " no clear difference")


def _cell(metric: Metric, fmt: Any) -> str:
    text = fmt(metric.value)
    if metric.estimate and math.isfinite(metric.value):
        text += rpt.EST
    return f"{text} — {metric.where}" if metric.where else text
