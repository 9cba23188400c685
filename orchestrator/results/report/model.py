"""The summary of a sweep as numbers: medians per machine and worker count, knees, Pareto front.

A report answers the question cloudprof exists for: which machine, how many
workers, what cost, what peak memory. The numbers come straight from the
results store (``trials.parquet`` and ``sweep.json``), reduced per machine and
worker count to the median over repeats, so a noisy repeat cannot pick the
winner on its own. Everything here is data (small tables of rows, ``rows.Frame``, and
records); ``tables`` turns it into strings and one renderer per format prints them.

No pandas: its import (0.5-0.7 s) was most of what a report cost, at the end of every
sweep; pyarrow reads the store and ``rows`` does the few reductions (``Frame.to_pandas``
gives a notebook its frame).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.analysis.model import KNEE_GAIN, KneeRange, knee_point, knee_range, spread
from orchestrator.errors import CloudprofError, UsageError
from orchestrator.formatting import DASH, n_workers
from orchestrator.results.report.measure import (
    Measure,
    is_fixed_work,
    measure_of,
    with_measure,
)
from orchestrator.results.report.rows import (
    Frame,
    as_frame,
    first,
    frame_from_records,
    idx_max,
    idx_min,
    known,
    median,
    missing,
    nanmax,
    nanmin,
)
from orchestrator.results.store import (
    SWEEP_FILE,
    TIMESERIES_DIR,
    TRIAL_COLUMNS,
    TRIALS_FILE,
    check_trials_columns,
    compact_parts,
)

if TYPE_CHECKING:
    import pandas as pd  # accepted where a notebook passes its own frames (``as_frame``)

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
    trials: Frame  # all trials, TRIAL_COLUMNS (missing optional ones filled)
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
            trials = trials.with_column(column, [None] * len(trials))
    trials = trials.with_column(
        "ran_on", [r["machine"] if missing(r["ran_on"]) else r["ran_on"] for r in trials])
    from orchestrator.results.report.jobs import label_grid

    # a fixed-work job's rate from its time to complete: every figure below follows from it
    return RunData(run_dir=path, sweep=sweep, trials=with_measure(label_grid(trials)))


def read_table(path: Path) -> Frame:
    """One Parquet file as rows with the values ``pd.read_parquet`` gives (``Frame.from_arrow``),
    read with pyarrow's single-file reader: ``read_parquet`` goes through pyarrow's dataset
    layer, whose import (pyarrow.dataset, Acero, Substrait: ~40 ms) was the first parquet
    read of every sweep's report."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as file:
        return Frame.from_arrow(file.read())


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


def _nodes(trials: Frame) -> list[int]:
    """VMs per trial: 1 where the column is missing (older stores)."""
    if "nodes" not in trials:
        return [1] * len(trials)
    return [1 if v != v else int(v) for v in trials.numbers("nodes")]


def one_node(trials: Frame) -> Frame:
    """The trials on one VM: what every scale-up figure (workers on one machine) is about."""
    return Frame([r for r, n in zip(trials, _nodes(trials), strict=True) if n == 1],
                 trials.columns)


SCALEOUT_COLUMNS = ["machine", "ran_on", "nodes", "workers", "repeats", "units_per_s",
                    "scaleout_efficiency", "price_per_hour", "cost_per_million_units",
                    "node_peaks", "node_peak_source", "imbalance", "estimate", "pareto"]


def scaleout_summary(trials: Frame | pd.DataFrame) -> Frame | None:
    """One row per (machine, ran_on, nodes, workers) over ok repeats, for a sweep with
    --nodes (None without): median units/s and scale-out efficiency X(n)/(n·X(1)), the
    cluster's $/M units (every node priced), each node's peak memory (max over repeats)
    and where it comes from (the nodes' memory cgroups, or sampled), how unbalanced the
    nodes were (largest node peak ÷ smallest), with the Pareto
    front over every row, one VM and clusters alike: scale up and scale out side by side."""
    trials = as_frame(trials)
    nodes = _nodes(trials)
    if not any(n > 1 for n in nodes):
        return None
    ok = trials.with_column("nodes", nodes).where(lambda r: r["status"] == OK)
    records = []
    for (machine, ran_on, n, workers), group in ok.group_by(
            ["machine", "ran_on", "nodes", "workers"]):
        ups = median(group.numbers("units_per_s"))
        price = group.numbers("price_per_hour")[0]
        per_node: list[float] = []
        for raw in known(group.get("node_peak_rss_bytes", [])):
            peaks = [float(p) if p is not None else math.nan for p in json.loads(raw)]
            per_node = [max(a, b) for a, b in zip(per_node, peaks, strict=False)] \
                if per_node else peaks
        sources = sorted({str(src) for raw in known(group.get("node_peak_rss_source", []))
                          for src in json.loads(raw) if src})
        if not per_node and int(n) == 1:
            per_node = [nanmax(group.numbers("peak_rss_bytes"))]
            sources = sorted({str(src) for src in known(group.get("peak_rss_source", []))})
        finite = [p for p in per_node if math.isfinite(p) and p > 0]
        records.append({
            "machine": machine, "ran_on": ran_on, "nodes": int(n), "workers": int(workers),
            "repeats": len(group), "units_per_s": ups,
            "scaleout_efficiency": median(group.numbers("scaleout_efficiency")),
            "price_per_hour": price,
            "cost_per_million_units": cost_per_million_units(price, ups),
            "node_peaks": per_node,
            "node_peak_source": " + ".join(sources),  # "cgroup-v1"; mixed: "a + b"
            "imbalance": max(finite) / min(finite) if len(finite) > 1 else math.nan,
            "estimate": str(machine) != str(ran_on),
        })
    frame = frame_from_records(records, SCALEOUT_COLUMNS[:-1])
    return frame.with_column("pareto", pareto_front(frame))


def summarise(trials: Frame | pd.DataFrame) -> Frame:
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
    keys = [*_GROUP, "workers"]
    # scale up (a scale-out sweep: scaleout_summary()); a fixed-work job's rate filled in
    trials = with_measure(one_node(as_frame(trials)))
    fixed_work = measure_of(trials).fixed_work
    attempted = {key: len(group) for key, group in trials.group_by(keys)}
    records = []
    for key, group in trials.where(lambda r: r["status"] == OK).group_by(keys):
        machine, ran_on, workers = key
        col = {c: group.numbers(c) for c in _NUMERIC_TRIAL_COLUMNS}
        flags = {c: [bool(v) and not missing(v) for v in group.get(c, [False] * len(group))]
                 for c in ("oversubscribed", "spot", "leak_ramp")}
        ups = col["units_per_s"]
        vcpus = first(col["vcpus"])  # first non-null, like every per-host fact
        sp = spread(ups)
        price = first(col["price_per_hour"])
        median_ups = median(ups)
        per_run = math.nan
        if fixed_work and all(is_fixed_work(r) for r in group):  # 1 / median time to complete
            per_run = median(group.numbers("seconds"))
            median_ups = 1.0 / per_run if per_run > 0 else math.nan
        records.append({
            "machine": machine, "ran_on": ran_on, "workers": int(workers),
            "vcpus": int(vcpus) if math.isfinite(vcpus) else None,
            "repeats": len(group),
            "failed": int(attempted[key] - len(group)),
            "units_per_s": median_ups,
            "units_per_s_min": nanmin(ups),
            "units_per_s_max": nanmax(ups),
            "units_per_s_low": sp.low if sp else math.nan,
            "units_per_s_high": sp.high if sp else math.nan,
            "spread_method": sp.method if sp and sp.n > 1 else None,
            "units_per_s_per_vcpu": median(col["units_per_s_per_vcpu"]) if per_run != per_run
            else median_ups / vcpus if vcpus > 0 else math.nan,
            "efficiency": median(col["efficiency"]),
            "seconds_per_run": per_run,
            "peak_rss_bytes": nanmax(col["peak_rss_bytes"]),
            "cpu_utilisation": median(col["cpu_utilisation"]),
            "leak_verdict": _leak_summary(group.get("leak_verdict", [None] * len(group))),
            "leak_probability": nanmax(col["leak_probability"]),
            "leak_ramp": any(flags["leak_ramp"]),
            "price_per_hour": price,
            "cost_per_million_units": cost_per_million_units(price, median_ups),
            "oversubscribed": any(flags["oversubscribed"]),
            "spot": any(flags["spot"]),
            "estimate": str(machine) != str(ran_on),
        })  # fmt: skip
    _fixed_work_efficiency(records)
    summary = frame_from_records(records, SUMMARY_COLUMNS[:-1])
    return summary.with_column("pareto", pareto_front(summary))


def _fixed_work_efficiency(records: list[dict[str, Any]]) -> None:
    """A fixed-work row's efficiency from the medians it shows: T(1) ÷ (workers × T), so
    the table's eff. follows from its own times (NaN without a 1-worker row)."""
    base = {(r["machine"], r["ran_on"]): r["seconds_per_run"] for r in records
            if r["workers"] == 1 and math.isfinite(r["seconds_per_run"])}
    for r in records:
        if math.isfinite(r["seconds_per_run"]):
            t1 = base.get((r["machine"], r["ran_on"]), math.nan)
            r["efficiency"] = t1 / (r["workers"] * r["seconds_per_run"])


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


def samples(trials: Frame | pd.DataFrame) -> dict[tuple[str, str], dict[int, list[float]]]:
    """Per (machine, ran_on): worker count → units/s of each repeat that finished ok.

    The input of every confidence figure (spread, knee range, USL fit).
    """
    ok = with_measure(one_node(as_frame(trials))).where(lambda r: r["status"] == OK)
    out: dict[tuple[str, str], dict[int, list[float]]] = {}
    for r, ups in zip(ok, ok.numbers("units_per_s"), strict=True):
        if math.isfinite(ups):
            group = out.setdefault((str(r["machine"]), str(r["ran_on"])), {})
            group.setdefault(int(r["workers"]), []).append(float(ups))
    return dict(sorted(out.items()))


def knees(
    summary: Frame | pd.DataFrame,
    by_machine: dict[tuple[str, str], dict[int, list[float]]] | None = None,
) -> dict[tuple[str, str], Knee]:
    """The knee of each (machine, ran_on) group of a summary, with its range when repeats given."""
    out: dict[tuple[str, str], Knee] = {}
    for (machine, ran_on), group in as_frame(summary).group_by(_GROUP):
        key = (str(machine), str(ran_on))
        knee = find_knee(group["workers"], group["units_per_s"])
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
    trials: Frame, metric: str,
    by_machine: dict[tuple[str, str], dict[int, list[float]]] | None = None,
) -> dict[tuple[str, str, int], list[float]]:
    """(machine, ran_on, workers) → ``metric`` of each ok repeat: what :func:`rank` compares.

    ``metric`` is ``units_per_s`` or ``cost_per_million_units`` (computed per
    repeat from its own throughput, the formula of the summary). ``by_machine``:
    ``samples(trials)`` when the caller has it already.
    """
    out: dict[tuple[str, str, int], list[float]] = {}
    price_of: dict[str, float] = {}  # each machine's first known price of an ok trial
    for r in trials:  # one pass: a scan per machine cost 5 s at 200 machines
        machine, price = str(r["machine"]), r["price_per_hour"]
        if machine not in price_of and r["status"] == OK and known([price]):
            price_of[machine] = float(price)
    for key, by_workers in (samples(trials) if by_machine is None else by_machine).items():
        for workers, rates in by_workers.items():
            if metric == "units_per_s":
                values = rates
            else:
                p = price_of.get(key[0], math.nan)
                values = [cost_per_million_units(p, r) for r in rates]
            values = [v for v in values if math.isfinite(v)]
            if values:
                out[(*key, workers)] = values
    return out


def pareto_front(summary: Frame | pd.DataFrame) -> list[bool]:
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


def best_rows(
    summary: Frame | pd.DataFrame,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The rows with the lowest cost per million units and the highest throughput."""
    summary = as_frame(summary)
    by_cost = summary.where(lambda r: not missing(r["cost_per_million_units"]))
    cheapest = (dict(by_cost.rows[idx_min(by_cost["cost_per_million_units"])])
                if not by_cost.empty else None)
    # a rate of 0 measured nothing (a fixed-work job's rate is 1 / its time: never 0)
    by_rate = summary.where(lambda r: not missing(r["units_per_s"]) and r["units_per_s"] > 0)
    fastest = (dict(by_rate.rows[idx_max(by_rate["units_per_s"])])
               if not by_rate.empty else None)
    return cheapest, fastest


def best_row(group: Frame, column: str = "units_per_s") -> dict[str, Any]:
    """The first row with the largest ``column`` (``group.loc[group[column].idxmax()]``)."""
    return group.rows[idx_max(group.numbers(column))]


def peak_memory(summary: Frame | pd.DataFrame) -> Frame:
    """Per (machine, ran_on): the highest peak RSS of any successful trial and its worker count."""
    records = []
    for (machine, ran_on), group in as_frame(summary).group_by(_GROUP):
        found = group.where(lambda r: not missing(r["peak_rss_bytes"]))
        if found.empty:
            records.append(
                {"machine": machine, "ran_on": ran_on, "peak_rss_bytes": math.nan, "workers": None}
            )
            continue
        top = best_row(found, "peak_rss_bytes")
        records.append(
            {
                "machine": machine,
                "ran_on": ran_on,
                "peak_rss_bytes": float(top["peak_rss_bytes"]),
                "workers": int(top["workers"]),
            }
        )
    return frame_from_records(records, [*_GROUP, "peak_rss_bytes", "workers"])


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
