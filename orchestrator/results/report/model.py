"""The summary of a sweep as numbers: medians per machine and worker count, knees, Pareto front.

A report answers the question cloudprof exists for: which machine, how many
workers, what cost, what peak memory. The numbers come straight from the
results store (``trials.parquet`` and ``sweep.json``), reduced per machine and
worker count to the median over repeats, so a noisy repeat cannot pick the
winner on its own. Everything here is data (pandas frames and small records);
``tables`` turns it into strings and one renderer per format prints them.

pandas is imported inside functions: the CLI imports this package lazily, but
keeping it cheap costs nothing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import CloudprofError, UsageError
from orchestrator.formatting import DASH, n_workers
from orchestrator.plan.model import KNEE_GAIN, KneeRange, knee_point, knee_range, spread
from orchestrator.results.store import SWEEP_FILE, TIMESERIES_DIR, TRIAL_COLUMNS, TRIALS_FILE

if TYPE_CHECKING:
    import pandas as pd

OK = "ok"
LOCAL = "local"

_LEAK_ORDER = {"leak": 0, "inconclusive": 1, "ok": 2}
_GROUP = ["machine", "ran_on"]


# ---------------------------------------------------------------- loading


@dataclass
class RunData:
    """One results store as read from disk."""

    run_dir: Path
    sweep: dict[str, Any]
    trials: pd.DataFrame  # all trials, TRIAL_COLUMNS (missing optional ones filled)

    @property
    def name(self) -> str:
        return str(self.sweep.get("sweep_id") or self.run_dir.name)

    def timeseries_path(self, trial_id: str) -> Path:
        return self.run_dir / TIMESERIES_DIR / f"{trial_id}.parquet"


def load_run(run_dir: str | Path) -> RunData:
    """Read a store; bad paths are a UsageError, a store without trials a CloudprofError."""
    path = Path(run_dir)
    if not path.exists():
        raise UsageError(f"no results store at {path}: the path does not exist")
    if not path.is_dir():
        raise UsageError(f"{path} is not a results store: expected a directory like runs/<id>")
    sweep_file, trials_file = path / SWEEP_FILE, path / TRIALS_FILE
    if not sweep_file.exists() and not trials_file.exists():
        runs = sorted(p.parent.name for p in path.glob(f"*/{SWEEP_FILE}"))
        hint = f"; it holds runs, e.g. {path / runs[-1]}" if runs else ""
        raise UsageError(f"{path} is not a results store: no {SWEEP_FILE} or {TRIALS_FILE}{hint}")
    sweep: dict[str, Any] = {}
    if sweep_file.exists():
        try:
            sweep = json.loads(sweep_file.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read {sweep_file}: {exc}") from exc
        if not isinstance(sweep, dict):
            raise UsageError(f"cannot read {sweep_file}: not a JSON object")
    if not trials_file.exists():
        raise CloudprofError(f"no trials in {path}")
    try:
        trials = read_table(trials_file)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise UsageError(f"cannot read {trials_file}: {exc}") from exc
    if trials.empty:
        raise CloudprofError(f"no trials in {path}")
    required = {"machine", "workers", "units_per_s", "status"}
    missing = sorted(required - set(trials.columns))
    if missing:
        raise UsageError(f"{trials_file} lacks columns {', '.join(missing)}")
    for column in TRIAL_COLUMNS:
        if column not in trials.columns:
            trials[column] = None
    trials["ran_on"] = trials["ran_on"].fillna(trials["machine"])
    from orchestrator.results.report.jobs import label_grid

    return RunData(run_dir=path, sweep=sweep, trials=label_grid(trials))


def read_table(path: Path) -> pd.DataFrame:
    """One Parquet file as the frame ``pd.read_parquet`` gives (pyarrow's conversion, with the
    file's pandas metadata), read with pyarrow's single-file reader: ``read_parquet`` goes
    through pyarrow's dataset layer, whose import (pyarrow.dataset, Acero, Substrait: ~40 ms)
    was the first parquet read of every sweep's report. The store's own cache of its table
    is this same conversion (``RunStore._write_trials``)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).read().to_pandas()


# ---------------------------------------------------------------- the numbers


def cost_per_million_units(price_per_hour: float | None, units_per_s: float | None) -> float:
    """USD per million units: what an hour costs over what an hour produces. NaN when unknown."""
    if price_per_hour is None or units_per_s is None:
        return math.nan
    price, rate = float(price_per_hour), float(units_per_s)
    if not (math.isfinite(price) and math.isfinite(rate)) or rate <= 0:
        return math.nan
    return price / (rate * 3600.0) * 1e6


def _leak_summary(verdicts: list[Any]) -> str:
    """The worst verdict over repeats; a mixed result says how many repeats had it."""
    known = [str(v) for v in verdicts if isinstance(v, str) and v]
    if not known:
        return DASH
    worst = min(known, key=lambda v: _LEAK_ORDER.get(v, 1))
    count = known.count(worst)
    return worst if count == len(known) else f"{worst} {count}/{len(known)}"


SUMMARY_COLUMNS = [
    *_GROUP,
    "workers",
    "vcpus",
    "repeats",
    "failed",
    "units_per_s",
    "units_per_s_min",
    "units_per_s_max",
    "units_per_s_low",
    "units_per_s_high",
    "spread_method",
    "units_per_s_per_vcpu",
    "efficiency",
    "peak_rss_bytes",
    "cpu_utilisation",
    "leak_verdict",
    "leak_probability",
    "leak_ramp",
    "price_per_hour",
    "cost_per_million_units",
    "oversubscribed",
    "spot",
    "estimate",
    "pareto",
]
"""The summary's columns, in order (``report --json`` documents them)."""

_NUMERIC_TRIAL_COLUMNS = (
    "units_per_s",
    "units_per_s_per_vcpu",
    "efficiency",
    "peak_rss_bytes",
    "cpu_utilisation",
    "price_per_hour",
    "vcpus",
    "leak_probability",
)


def _nodes(trials: pd.DataFrame) -> pd.Series:
    import pandas as pd

    if "nodes" not in trials:
        return pd.Series(1, index=trials.index)
    return pd.to_numeric(trials["nodes"], errors="coerce").fillna(1).astype(int)


def one_node(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials on one VM: what every scale-up figure (workers on one machine) is about."""
    return trials[_nodes(trials) == 1]


SCALEOUT_COLUMNS = ["machine", "ran_on", "nodes", "workers", "repeats", "units_per_s",
                    "scaleout_efficiency", "price_per_hour", "cost_per_million_units",
                    "node_peaks", "node_peak_source", "imbalance", "estimate", "pareto"]


def scaleout_summary(trials: pd.DataFrame) -> pd.DataFrame | None:
    """One row per (machine, ran_on, nodes, workers) over ok repeats, for a sweep with
    --nodes (None without): median units/s and scale-out efficiency X(n)/(n·X(1)), the
    cluster's $/M units (every node priced), each node's peak memory (max over repeats)
    and where it comes from (the nodes' memory cgroups, or sampled), how unbalanced the
    nodes were (largest node peak ÷ smallest), with the Pareto
    front over every row, one VM and clusters alike: scale up and scale out side by side."""
    import json

    import pandas as pd

    nodes = _nodes(trials)
    if not (nodes > 1).any():
        return None
    ok = trials.assign(nodes=nodes)[trials["status"] == OK]
    rows = []
    for (machine, ran_on, n, workers), group in ok.groupby(
            ["machine", "ran_on", "nodes", "workers"], sort=True, dropna=False):
        ups = pd.to_numeric(group["units_per_s"], errors="coerce").astype(float).median()
        price = pd.to_numeric(group["price_per_hour"], errors="coerce").astype(float).iloc[0]
        per_node: list[float] = []
        for raw in group.get("node_peak_rss_bytes", pd.Series(dtype=object)).dropna():
            peaks = [float(p) if p is not None else math.nan for p in json.loads(raw)]
            per_node = [max(a, b) for a, b in zip(per_node, peaks, strict=False)] \
                if per_node else peaks
        sources = sorted({str(src) for raw in group.get("node_peak_rss_source",
                                                        pd.Series(dtype=object)).dropna()
                          for src in json.loads(raw) if src})
        if not per_node and int(n) == 1:
            per_node = [float(pd.to_numeric(group["peak_rss_bytes"], errors="coerce").max())]
            sources = sorted({str(src) for src in group["peak_rss_source"].dropna()})
        known = [p for p in per_node if math.isfinite(p) and p > 0]
        rows.append({
            "machine": machine, "ran_on": ran_on, "nodes": int(n), "workers": int(workers),
            "repeats": len(group), "units_per_s": ups,
            "scaleout_efficiency": pd.to_numeric(group["scaleout_efficiency"],
                                                 errors="coerce").astype(float).median(),
            "price_per_hour": price,
            "cost_per_million_units": cost_per_million_units(price, ups),
            "node_peaks": per_node,
            "node_peak_source": " + ".join(sources),  # "cgroup-v1"; mixed: "a + b"
            "imbalance": max(known) / min(known) if len(known) > 1 else math.nan,
            "estimate": str(machine) != str(ran_on),
        })
    frame = pd.DataFrame(rows, columns=SCALEOUT_COLUMNS[:-1])
    frame["pareto"] = pareto_front(frame) if len(frame) else []
    return frame


def summarise(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per (machine, ran_on, workers): medians over the repeats that finished ok.

    Peak memory is the max over repeats, not the median: it is what a machine
    must hold. ``units_per_s_min``/``_max`` are the spread behind the median.
    Cost per million units is computed from the median throughput (the same
    formula as the stored column). ``failed`` counts the other repeats. One
    pandas ``groupby`` does the reduction, so a new column is one more line.
    """
    import pandas as pd

    keys = [*_GROUP, "workers"]
    trials = one_node(trials)  # scale up; the nodes of a scale-out sweep: scaleout_summary()
    ok = trials[trials["status"] == OK].copy()
    for column in ("leak_probability", "leak_ramp"):  # stores from before the leak model
        if column not in ok:
            ok[column] = None
    for column in _NUMERIC_TRIAL_COLUMNS:
        ok[column] = pd.to_numeric(ok[column], errors="coerce").astype(float)
    for column in ("oversubscribed", "spot", "leak_ramp"):
        values = ok[column] if column in ok else pd.Series(False, index=ok.index)
        ok[column] = values.fillna(False).astype(bool)
    # One grouping, one reduction per column: the same kernels a named ``agg`` runs, without
    # its bookkeeping (~10 ms per aggregation on pandas 3, most of every report's summary).
    by = ok.groupby(keys, sort=True, dropna=False)
    summary = pd.DataFrame({
        "vcpus": by["vcpus"].first(),  # first non-null, like every per-host fact
        "repeats": by["status"].size(),
        "units_per_s": by["units_per_s"].median(),
        "units_per_s_min": by["units_per_s"].min(),
        "units_per_s_max": by["units_per_s"].max(),
        "units_per_s_per_vcpu": by["units_per_s_per_vcpu"].median(),
        "efficiency": by["efficiency"].median(),
        "peak_rss_bytes": by["peak_rss_bytes"].max(),
        "cpu_utilisation": by["cpu_utilisation"].median(),
        "leak_verdict": by["leak_verdict"].agg(lambda v: _leak_summary(list(v))),
        "leak_probability": by["leak_probability"].max(),
        "leak_ramp": by["leak_ramp"].any(),
        "price_per_hour": by["price_per_hour"].first(),
        "oversubscribed": by["oversubscribed"].any(),
        "spot": by["spot"].any(),
    }).reset_index()  # fmt: skip
    attempted = trials.groupby(keys, sort=True, dropna=False).size().rename("attempted")
    summary = summary.join(attempted, on=keys)
    summary["failed"] = (summary.pop("attempted") - summary["repeats"]).astype(int)
    summary["workers"] = summary["workers"].astype(int)
    summary["vcpus"] = [int(v) if math.isfinite(v) else None for v in summary["vcpus"]]
    summary["cost_per_million_units"] = [
        cost_per_million_units(p, u)
        for p, u in zip(summary["price_per_hour"], summary["units_per_s"], strict=True)
    ]
    summary["estimate"] = summary["machine"].astype(str) != summary["ran_on"].astype(str)
    spreads = ok.groupby(keys, sort=True, dropna=False)["units_per_s"].agg(
        lambda v: spread(list(v))
    )
    found = [spreads.get(tuple(k)) for k in summary[keys].itertuples(index=False)]
    summary["units_per_s_low"] = [sp.low if sp else math.nan for sp in found]
    summary["units_per_s_high"] = [sp.high if sp else math.nan for sp in found]
    summary["spread_method"] = [sp.method if sp and sp.n > 1 else None for sp in found]
    summary = summary.reindex(columns=SUMMARY_COLUMNS[:-1])
    summary["pareto"] = pareto_front(summary)
    return summary.reset_index(drop=True)


@dataclass(frozen=True)
class Knee:
    """Where scaling stops for one machine: ``workers`` is None when it was not seen.

    ``range`` is where the knee lands when the repeats are resampled
    (:func:`orchestrator.plan.model.knee_range`): a knee one noisy repeat can
    move is shown with the counts it moves between, not as a single number.
    """

    workers: int | None
    reached: bool  # False: throughput still grew at the largest count, or one count only
    tested: tuple[int, ...] = ()  # the worker counts with a finite median throughput
    units_per_s: float = math.nan
    range: KneeRange | None = None

    def describe(self) -> str:
        if len(self.tested) < 2:
            return f"{DASH} (one worker count tested)"
        if not self.reached or self.workers is None:
            text = f"not reached (still scaling at {n_workers(max(self.tested))})"
        else:
            text = n_workers(self.workers)
        return text + self._range_text()

    def _range_text(self) -> str:
        """ " (4–8 in 95% of resamples)": empty when every resample finds the same knee."""
        r = self.range
        if r is None or r.stable or (r.low is None and r.high is None):
            return ""
        low = "–" if r.low is None else str(r.low)
        high = "not reached" if r.high is None else str(r.high)
        return f" ({low} to {high} in 95% of resamples)"


def find_knee(workers: list[int], units_per_s: list[float], gain: float = KNEE_GAIN) -> Knee:
    """The knee of median throughputs (:func:`orchestrator.plan.model.knee_point`, the one rule)."""
    points = sorted(
        (int(w), float(u)) for w, u in zip(workers, units_per_s, strict=True) if math.isfinite(u)
    )
    tested = tuple(w for w, _ in points)
    at = knee_point([w for w, _ in points], [u for _, u in points], gain)
    if at is None:
        return Knee(workers=None, reached=False, tested=tested)
    return Knee(workers=at, reached=True, tested=tested, units_per_s=dict(points)[at])


def samples(trials: pd.DataFrame) -> dict[tuple[str, str], dict[int, list[float]]]:
    """Per (machine, ran_on): worker count → units/s of each repeat that finished ok.

    The input of every confidence figure (spread, knee range, USL fit).
    """
    import pandas as pd

    trials = one_node(trials)
    ok = trials[trials["status"] == OK]
    rates = pd.to_numeric(ok["units_per_s"], errors="coerce").astype(float)
    out: dict[tuple[str, str], dict[int, list[float]]] = {}
    for machine, ran_on, workers, ups in zip(
        ok["machine"], ok["ran_on"], ok["workers"], rates, strict=True
    ):
        if math.isfinite(ups):
            group = out.setdefault((str(machine), str(ran_on)), {})
            group.setdefault(int(workers), []).append(float(ups))
    return dict(sorted(out.items()))


def knees(
    summary: pd.DataFrame, by_machine: dict[tuple[str, str], dict[int, list[float]]] | None = None
) -> dict[tuple[str, str], Knee]:
    """The knee of each (machine, ran_on) group of a summary, with its range when repeats given."""
    out: dict[tuple[str, str], Knee] = {}
    for (machine, ran_on), group in summary.groupby(_GROUP, sort=True):
        key = (str(machine), str(ran_on))
        knee = find_knee(list(group["workers"]), list(group["units_per_s"]))
        if by_machine and key in by_machine:
            knee = Knee(
                knee.workers,
                knee.reached,
                knee.tested,
                knee.units_per_s,
                knee_range(by_machine[key]),
            )
        out[key] = knee
    return out


def repeat_groups(
    trials: pd.DataFrame, metric: str,
    by_machine: dict[tuple[str, str], dict[int, list[float]]] | None = None,
) -> dict[tuple[str, str, int], list[float]]:
    """(machine, ran_on, workers) → ``metric`` of each ok repeat: what :func:`rank` compares.

    ``metric`` is ``units_per_s`` or ``cost_per_million_units`` (computed per
    repeat from its own throughput, the formula of the summary). ``by_machine``:
    ``samples(trials)`` when the caller has it already.
    """
    out: dict[tuple[str, str, int], list[float]] = {}
    for key, by_workers in (samples(trials) if by_machine is None else by_machine).items():
        prices = trials[(trials["machine"].astype(str) == key[0]) & (trials["status"] == OK)]
        price = prices["price_per_hour"].dropna()
        for workers, rates in by_workers.items():
            if metric == "units_per_s":
                values = rates
            else:
                p = float(price.iloc[0]) if not price.empty else math.nan
                values = [cost_per_million_units(p, r) for r in rates]
            values = [v for v in values if math.isfinite(v)]
            if values:
                out[(*key, workers)] = values
    return out


def pareto_front(summary: pd.DataFrame) -> list[bool]:
    """Rows no other row beats on both throughput (higher) and cost per million units (lower)."""
    points = list(zip(summary["units_per_s"], summary["cost_per_million_units"], strict=True))
    flags: list[bool] = []
    for i, (ups, cost) in enumerate(points):
        if not (math.isfinite(ups) and math.isfinite(cost)):
            flags.append(False)
            continue
        dominated = any(
            j != i
            and math.isfinite(u2)
            and math.isfinite(c2)
            and u2 >= ups
            and c2 <= cost
            and (u2 > ups or c2 < cost)
            for j, (u2, c2) in enumerate(points)
        )
        flags.append(not dominated)
    return flags


def best_rows(summary: pd.DataFrame) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The rows with the lowest cost per million units and the highest throughput."""
    by_cost = summary.dropna(subset=["cost_per_million_units"])
    cheapest = (
        by_cost.loc[by_cost["cost_per_million_units"].idxmin()].to_dict()
        if not by_cost.empty
        else None
    )
    by_rate = summary.dropna(subset=["units_per_s"])
    by_rate = by_rate[by_rate["units_per_s"] > 0]  # a fixed-work job reports no units
    fastest = by_rate.loc[by_rate["units_per_s"].idxmax()].to_dict() if not by_rate.empty else None
    return cheapest, fastest


def peak_memory(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (machine, ran_on): the highest peak RSS of any successful trial and its worker count."""
    import pandas as pd

    rows = []
    for (machine, ran_on), group in summary.groupby(_GROUP, sort=True):
        known = group.dropna(subset=["peak_rss_bytes"])
        if known.empty:
            rows.append(
                {"machine": machine, "ran_on": ran_on, "peak_rss_bytes": math.nan, "workers": None}
            )
            continue
        top = known.loc[known["peak_rss_bytes"].idxmax()]
        rows.append(
            {
                "machine": machine,
                "ran_on": ran_on,
                "peak_rss_bytes": float(top["peak_rss_bytes"]),
                "workers": int(top["workers"]),
            }
        )
    return pd.DataFrame(rows, columns=[*_GROUP, "peak_rss_bytes", "workers"])


def machine_label(machine: Any, ran_on: Any) -> str:
    """A machine's name, plus where it really ran when that was another host."""
    return str(machine) if str(machine) == str(ran_on) else f"{machine} (ran on {ran_on})"
