"""The summary of a sweep as numbers: medians per machine and worker count, knees, Pareto front.

A report answers the question cloudprof exists for: which machine, how many
workers, what cost, what peak memory. The numbers come straight from the
results store (``trials.parquet`` and ``sweep.json``), reduced per machine and
worker count to the median over repeats, so a noisy repeat cannot pick the
winner on its own. Everything here is data (pandas frames and records); ``tables``
turns it into strings and one renderer per format prints them.

pandas is imported inside functions: ``cloudprof --help`` and a sweep's own steps never
pay for its import, a report does (a notebook gets the same frames).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.analysis.model import KNEE_GAIN, KneeRange, knee_point, knee_range
from orchestrator.analysis.model import spreads as spreads_of
from orchestrator.errors import CloudprofError, UsageError
from orchestrator.formatting import DASH, n_workers
from orchestrator.results.report.measure import (
    FIXED_WORK,
    Measure,
    measure_of,
    with_measure,
)
from orchestrator.results.report.values import numeric
from orchestrator.results.store import (
    SWEEP_FILE,
    TIMESERIES_DIR,
    TRIAL_COLUMNS,
    TRIALS_FILE,
    check_trials_columns,
    compact_parts,
)

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
    question: Any = None  # whole_job.Question: --target/--total, when the user asked them

    @property
    def measure(self) -> Measure:
        """units/s, or runs/h for a fixed-work job (``measure.measure_of``)."""
        return measure_of(self.trials)

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
    compact_parts(path)  # the trials a sweep recorded since its table was last compacted
    if not trials_file.exists():
        raise CloudprofError(f"no trials in {path}")
    try:
        trials = read_table(trials_file)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise UsageError(f"cannot read {trials_file}: {exc}") from exc
    check_trials_columns(trials_file, list(trials.columns))  # someone else's Parquet file
    if trials.empty:
        raise CloudprofError(f"no trials in {path}")
    required = {"machine", "workers", "units_per_s", "status"}
    lacking = sorted(required - set(trials.columns))
    if lacking:
        raise UsageError(f"{trials_file} lacks columns {', '.join(lacking)}")
    for column in TRIAL_COLUMNS:
        if column not in trials.columns:
            trials[column] = None
    trials["ran_on"] = trials["ran_on"].where(trials["ran_on"].notna(), trials["machine"])
    from orchestrator.results.report.jobs import label_grid

    # a fixed-work job's rate from its time to complete: every figure below follows from it
    return RunData(run_dir=path, sweep=sweep, trials=with_measure(label_grid(trials)))


def read_table(path: Path) -> pd.DataFrame:
    """One Parquet file as the frame ``pd.read_parquet`` gives, read with pyarrow's
    single-file reader: ``read_parquet`` goes through pyarrow's dataset layer, whose import
    (pyarrow.dataset, Acero, Substrait: ~40 ms) was the first parquet read of every report."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as file:
        return file.read().to_pandas()


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
    "seconds_per_run",
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
    """VMs per trial: 1 where the column is missing (older stores)."""
    return numeric(trials, "nodes").fillna(1).astype(int)


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
    import pandas as pd

    nodes = _nodes(trials)
    if not (nodes > 1).any():
        return None
    ok = trials.assign(nodes=nodes)[trials["status"] == OK]
    records = []
    for (machine, ran_on, n, workers), group in ok.groupby(
            ["machine", "ran_on", "nodes", "workers"], sort=True, dropna=False):
        ups = numeric(group, "units_per_s").median()
        price = numeric(group, "price_per_hour").iloc[0]
        per_node: list[float] = []
        for raw in _present(group, "node_peak_rss_bytes"):
            peaks = [float(p) if p is not None else math.nan for p in json.loads(raw)]
            per_node = [max(a, b) for a, b in zip(per_node, peaks, strict=False)] \
                if per_node else peaks
        sources = sorted({str(src) for raw in _present(group, "node_peak_rss_source")
                          for src in json.loads(raw) if src})
        if not per_node and int(n) == 1:
            per_node = [numeric(group, "peak_rss_bytes").max()]
            sources = sorted({str(src) for src in _present(group, "peak_rss_source")})
        finite = [p for p in per_node if math.isfinite(p) and p > 0]
        records.append({
            "machine": machine, "ran_on": ran_on, "nodes": int(n), "workers": int(workers),
            "repeats": len(group), "units_per_s": ups,
            "scaleout_efficiency": numeric(group, "scaleout_efficiency").median(),
            "price_per_hour": price,
            "cost_per_million_units": cost_per_million_units(price, ups),
            "node_peaks": per_node,
            "node_peak_source": " + ".join(sources),  # "cgroup-v1"; mixed: "a + b"
            "imbalance": max(finite) / min(finite) if len(finite) > 1 else math.nan,
            "estimate": str(machine) != str(ran_on),
        })
    frame = pd.DataFrame(records, columns=SCALEOUT_COLUMNS[:-1])
    frame["pareto"] = pareto_front(frame)
    return frame


def _present(frame: pd.DataFrame, column: str) -> list[Any]:
    """A column's values that are not missing (none without the column)."""
    return frame[column].dropna().tolist() if column in frame.columns else []


def _lists(by: Any, column: str) -> list[list[Any]]:
    """Each group's values of ``column``, in the groups' order and each in the rows' order:
    ``by[column].agg(list)`` without a Python call per group (1,200 in a report of 200
    machines)."""
    import numpy as np

    ids = by.ngroup().to_numpy()
    order = np.argsort(ids, kind="stable")
    values = by.obj[column].to_numpy()[order]
    return [part.tolist() for part in np.split(values, np.cumsum(np.bincount(ids))[:-1])]


def summarise(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per (machine, ran_on, workers): medians over the repeats that finished ok.

    Peak memory is the max over repeats, not the median: it is what a machine
    must hold. ``units_per_s_min``/``_max`` are the spread behind the median.
    Cost per million units is computed from the median throughput (the same
    formula as the stored column). ``failed`` counts the other repeats. Rows are
    sorted by machine, host and worker count (``SUMMARY_COLUMNS``, in order).

    A fixed-work job (``measure.RUNS``) is measured by its time to complete:
    ``seconds_per_run`` is the median over repeats, its rate ``units_per_s`` is one run
    over that time (runs/s; runs/h shown) and its cost the price of that time, so a
    runs/h, a $/run and a time shown side by side always agree; efficiency is
    T(1 worker) ÷ (workers × T) of those medians. Other jobs: ``seconds_per_run`` NaN.
    """
    import pandas as pd

    keys = [*_GROUP, "workers"]
    # scale up (a scale-out sweep: scaleout_summary()); a fixed-work job's rate filled in
    trials = with_measure(one_node(trials))
    is_ok = trials["status"] == OK
    counts = is_ok.groupby([trials[k] for k in keys], sort=True, dropna=False).agg(["size", "sum"])
    counts = counts[counts["sum"] > 0]  # the groups below: those with an ok repeat
    ok = trials[is_ok]
    if ok.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    values = pd.DataFrame({c: numeric(ok, c) for c in (*_NUMERIC_TRIAL_COLUMNS, "seconds")})
    for c in ("oversubscribed", "spot", "leak_ramp"):
        flag = ok[c] if c in ok.columns else pd.Series(False, index=ok.index)
        values[c] = flag.notna() & flag.astype(bool)
    values["leak_verdict"] = ok["leak_verdict"]
    values["fixed"] = ok["job_kind"] == FIXED_WORK if "job_kind" in ok.columns else False
    by = values.groupby([ok[k] for k in keys], sort=True, dropna=False)
    ups = by["units_per_s"]
    vcpus = by["vcpus"].first()  # first non-null, like every per-host fact
    price = by["price_per_hour"].first()
    spreads = spreads_of(_lists(by, "units_per_s"))
    fixed = by["fixed"].all() & measure_of(trials).fixed_work  # rate: 1 / median time
    per_run = by["seconds"].median().where(fixed)
    rate = ups.median().where(~fixed, 1.0 / per_run.where(per_run > 0))
    index = rate.index
    summary = pd.DataFrame({
        "machine": index.get_level_values("machine"),
        "ran_on": index.get_level_values("ran_on"),
        "workers": index.get_level_values("workers").astype(int),
        "vcpus": [int(v) if math.isfinite(v) else None for v in vcpus],
        "repeats": by.size().to_numpy(),
        "failed": (counts["size"] - counts["sum"]).to_numpy(),
        "units_per_s": rate.to_numpy(),
        "units_per_s_min": ups.min().to_numpy(),
        "units_per_s_max": ups.max().to_numpy(),
        "units_per_s_low": [sp.low if sp else math.nan for sp in spreads],
        "units_per_s_high": [sp.high if sp else math.nan for sp in spreads],
        "spread_method": [sp.method if sp and sp.n > 1 else None for sp in spreads],
        "units_per_s_per_vcpu": by["units_per_s_per_vcpu"].median().where(
            per_run.isna(), rate / vcpus.where(vcpus > 0)).to_numpy(),
        "efficiency": by["efficiency"].median().to_numpy(),
        "seconds_per_run": per_run.to_numpy(),
        "peak_rss_bytes": by["peak_rss_bytes"].max().to_numpy(),
        "cpu_utilisation": by["cpu_utilisation"].median().to_numpy(),
        "leak_verdict": [_leak_summary(v) for v in _lists(by, "leak_verdict")],
        "leak_probability": by["leak_probability"].max().to_numpy(),
        "leak_ramp": by["leak_ramp"].any().to_numpy(),
        "price_per_hour": price.to_numpy(),
        "cost_per_million_units": [cost_per_million_units(p, u)
                                   for p, u in zip(price, rate, strict=True)],
        "oversubscribed": by["oversubscribed"].any().to_numpy(),
        "spot": by["spot"].any().to_numpy(),
    })  # fmt: skip
    summary["estimate"] = summary["machine"].astype(str) != summary["ran_on"].astype(str)
    _fixed_work_efficiency(summary)
    summary["pareto"] = pareto_front(summary)
    return summary


def _fixed_work_efficiency(summary: pd.DataFrame) -> None:
    import numpy as np

    """A fixed-work row's efficiency from the medians it shows: T(1) ÷ (workers × T), so
    the table's eff. follows from its own times (NaN without a 1-worker row)."""
    timed = summary[np.isfinite(summary["seconds_per_run"])]
    if timed.empty:
        return
    hosts = list(zip(timed["machine"], timed["ran_on"], strict=True))
    base = {h: t for h, w, t in zip(hosts, timed["workers"], timed["seconds_per_run"],
                                    strict=True) if w == 1}
    t1 = np.array([base.get(h, math.nan) for h in hosts])
    summary.loc[timed.index, "efficiency"] = t1 / (timed["workers"] * timed["seconds_per_run"])


@dataclass(frozen=True)
class Knee:
    """Where scaling stops for one machine: ``workers`` is None when it was not seen.

    ``range`` is where the knee lands when the repeats are resampled
    (:func:`orchestrator.analysis.model.knee_range`): a knee one noisy repeat can
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
    """The knee of median throughputs (:func:`~orchestrator.analysis.model.knee_point`)."""
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
    trials = with_measure(one_node(trials))
    ok = trials[trials["status"] == OK]
    out: dict[tuple[str, str], dict[int, list[float]]] = {}
    for machine, ran_on, workers, ups in zip(ok["machine"], ok["ran_on"], ok["workers"],
                                             numeric(ok, "units_per_s"), strict=True):
        if math.isfinite(ups):
            group = out.setdefault((str(machine), str(ran_on)), {})
            group.setdefault(int(workers), []).append(float(ups))
    return dict(sorted(out.items()))


def by_host(summary: pd.DataFrame) -> Iterator[tuple[tuple[str, str], pd.DataFrame]]:
    """Each (machine, ran_on) of a summary with its rows, in sorted order."""
    for (machine, ran_on), group in summary.groupby(_GROUP, sort=True, dropna=False):
        yield (str(machine), str(ran_on)), group


def knees(
    summary: pd.DataFrame,
    by_machine: dict[tuple[str, str], dict[int, list[float]]] | None = None,
) -> dict[tuple[str, str], Knee]:
    """The knee of each (machine, ran_on) group of a summary, with its range when repeats given."""
    out: dict[tuple[str, str], Knee] = {}
    by = summary.groupby(_GROUP, sort=True, dropna=False)
    for (machine, ran_on), workers, rates in zip(by.size().index, by["workers"].agg(list),
                                                 by["units_per_s"].agg(list), strict=True):
        key = (str(machine), str(ran_on))
        knee = find_knee(workers, rates)
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
    ok = trials[trials["status"] == OK]  # each machine's first known price of an ok trial
    price_of = ok["price_per_hour"].groupby(ok["machine"].astype(str)).first()
    for key, by_workers in (samples(trials) if by_machine is None else by_machine).items():
        for workers, rates in by_workers.items():
            if metric == "units_per_s":
                values = rates
            else:
                p = float(price_of.get(key[0], math.nan))
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
    cost = summary["cost_per_million_units"]
    cheapest = _row(summary, cost.idxmin()) if cost.notna().any() else None
    # a rate of 0 measured nothing (a fixed-work job's rate is 1 / its time: never 0)
    rate = summary["units_per_s"].where(summary["units_per_s"] > 0)
    fastest = _row(summary, rate.idxmax()) if rate.notna().any() else None
    return cheapest, fastest


def _row(frame: pd.DataFrame, label: Any) -> dict[str, Any]:
    """One row as a dict of plain values."""
    return frame.loc[label].to_dict()


def best_row(group: pd.DataFrame, column: str = "units_per_s") -> dict[str, Any]:
    """The first row with the largest ``column`` (the first row when none is known)."""
    values = numeric(group, column)
    return _row(group, values.idxmax() if values.notna().any() else group.index[0])


def peak_memory(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (machine, ran_on): the highest peak RSS of any successful trial and its worker count."""
    import pandas as pd

    by = summary.assign(_top=summary["peak_rss_bytes"].fillna(-math.inf)).groupby(
        _GROUP, sort=True, dropna=False)
    known = by["peak_rss_bytes"].count() > 0
    top = summary.loc[by["_top"].idxmax()]  # the first row with the highest peak
    records = [{"machine": machine, "ran_on": ran_on,
                "peak_rss_bytes": float(peak) if seen else math.nan,
                "workers": int(workers) if seen else None}
               for (machine, ran_on), peak, workers, seen in zip(
                   known.index, top["peak_rss_bytes"], top["workers"], known, strict=True)]
    return pd.DataFrame(records, columns=[*_GROUP, "peak_rss_bytes", "workers"])


def machine_label(machine: Any, ran_on: Any) -> str:
    """A machine's name, plus where it really ran when that was another host."""
    return str(machine) if str(machine) == str(ran_on) else f"{machine} (ran on {ran_on})"


def parse_time(value: Any) -> datetime | None:
    """An ISO time from sweep.json (``Z`` or an offset), or None when absent or malformed."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
