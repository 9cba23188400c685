"""What a sweep found, as numbers a user can act on: tables in the terminal, report.md, report.html.

A report answers the question cloudprof exists for: which machine, how many
workers, what cost, what peak memory. The numbers come straight from the
results store (``trials.parquet`` and ``sweep.json``), reduced per machine and
worker count to the median over repeats, so a noisy repeat cannot pick the
winner on its own. One model (``Report``: headlines and tables of strings) is
built once and rendered three ways, so the terminal, the Markdown and the HTML
can never disagree.

Estimates are labelled wherever they appear: a cost is an estimate when the
trial ran on another host than the machine it stands for (``--dry-run`` runs on
``local`` and prices the planned machine), and every figure from the plan is an
estimate by construction.

pandas is imported inside functions: the CLI imports this module lazily, but
keeping it cheap costs nothing.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import CloudprofError, UsageError
from orchestrator.results.store import SWEEP_FILE, TIMESERIES_DIR, TRIAL_COLUMNS, TRIALS_FILE

if TYPE_CHECKING:
    import pandas as pd
    from rich.console import Console

KNEE_GAIN = 0.10
"""Scaling has stopped at worker count w when no larger tested count gives more
than this fraction more throughput than w (median over repeats)."""

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
PLOTS_DIR = "plots"

OK = "ok"
LOCAL = "local"
DASH = "–"
EST = " (est.)"

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
    import pandas as pd

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
        trials = pd.read_parquet(trials_file)
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
    return RunData(run_dir=path, sweep=sweep, trials=trials)


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


def summarise(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per (machine, ran_on, workers): medians over the repeats that finished ok.

    Peak memory is the max over repeats, not the median: it is what a machine
    must hold. Cost per million units is computed from the median throughput
    (the same formula as the stored column). ``failed`` counts the other repeats.
    """
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for (machine, ran_on, workers), group in trials.groupby(
        [*_GROUP, "workers"], sort=True, dropna=False
    ):
        ok = group[group["status"] == OK]
        failed = len(group) - len(ok)
        if ok.empty:
            continue
        ups = float(ok["units_per_s"].astype(float).median())
        price_values = ok["price_per_hour"].dropna().astype(float)
        price = float(price_values.iloc[0]) if not price_values.empty else math.nan
        rows.append(
            {
                "machine": machine,
                "ran_on": ran_on,
                "workers": int(workers),
                "vcpus": _first_int(ok["vcpus"]),
                "repeats": len(ok),
                "failed": failed,
                "units_per_s": ups,
                "units_per_s_per_vcpu": _median(ok["units_per_s_per_vcpu"]),
                "efficiency": _median(ok["efficiency"]),
                "peak_rss_bytes": _max(ok["peak_rss_bytes"]),
                "cpu_utilisation": _median(ok["cpu_utilisation"]),
                "leak_verdict": _leak_summary(list(ok["leak_verdict"])),
                "price_per_hour": price,
                "cost_per_million_units": cost_per_million_units(price, ups),
                "oversubscribed": bool(ok["oversubscribed"].fillna(False).astype(bool).any()),
                "spot": "spot" in ok and bool(ok["spot"].fillna(False).astype(bool).any()),
                "estimate": str(ran_on) != str(machine),
            }
        )
    columns = [
        *_GROUP,
        "workers",
        "vcpus",
        "repeats",
        "failed",
        "units_per_s",
        "units_per_s_per_vcpu",
        "efficiency",
        "peak_rss_bytes",
        "cpu_utilisation",
        "leak_verdict",
        "price_per_hour",
        "cost_per_million_units",
        "oversubscribed",
        "spot",
        "estimate",
    ]
    summary = pd.DataFrame(rows, columns=columns)
    summary["pareto"] = pareto_front(summary)
    return summary.reset_index(drop=True)


def _median(series: pd.Series) -> float:
    values = series.dropna().astype(float)
    return float(values.median()) if not values.empty else math.nan


def _max(series: pd.Series) -> float:
    values = series.dropna().astype(float)
    return float(values.max()) if not values.empty else math.nan


def _first_int(series: pd.Series) -> int | None:
    values = series.dropna()
    return int(values.iloc[0]) if not values.empty else None


@dataclass(frozen=True)
class Knee:
    """Where scaling stops for one machine: ``workers`` is None when it was not seen."""

    workers: int | None
    reached: bool  # False: throughput still grew at the largest count, or one count only
    tested: tuple[int, ...] = ()  # the worker counts with a finite median throughput
    units_per_s: float = math.nan

    def describe(self) -> str:
        if len(self.tested) < 2:
            return f"{DASH} (one worker count tested)"
        if not self.reached or self.workers is None:
            return f"not reached (still scaling at {n_workers(max(self.tested))})"
        return n_workers(self.workers)


def find_knee(workers: list[int], units_per_s: list[float], gain: float = KNEE_GAIN) -> Knee:
    """The smallest worker count that no larger tested count beats by more than ``gain``.

    Comparing against every larger count (not only the next one) keeps one noisy
    step from hiding a later jump. When only the largest count qualifies, the
    last step still gained more than ``gain``: scaling had not stopped yet.
    """
    points = sorted(
        (int(w), float(u)) for w, u in zip(workers, units_per_s, strict=True) if math.isfinite(u)
    )
    tested = tuple(w for w, _ in points)
    for i, (w, ups) in enumerate(points[:-1]):
        if all(u <= ups * (1.0 + gain) for _, u in points[i + 1 :]):
            return Knee(workers=w, reached=True, tested=tested, units_per_s=ups)
    return Knee(workers=None, reached=False, tested=tested)


def knees(summary: pd.DataFrame) -> dict[tuple[str, str], Knee]:
    """The knee of each (machine, ran_on) group of a summary."""
    out: dict[tuple[str, str], Knee] = {}
    for (machine, ran_on), group in summary.groupby(_GROUP, sort=True):
        out[(str(machine), str(ran_on))] = find_knee(
            list(group["workers"]), list(group["units_per_s"])
        )
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


# ---------------------------------------------------------------- formatting


def _finite(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def n_workers(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"


def fmt_rate(x: Any) -> str:
    if not _finite(x):
        return DASH
    x = float(x)
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def fmt_pct(x: Any) -> str:
    return f"{float(x) * 100:.0f}%" if _finite(x) else DASH


def fmt_bytes(x: Any) -> str:
    if not _finite(x):
        return DASH
    x = float(x)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(x) >= size:
            return f"{x / size:.3g} {unit}" if x / size < 1000 else f"{x / size:,.0f} {unit}"
    return f"{x:.0f} B"


def fmt_usd(x: Any, estimate: bool = False) -> str:
    if not _finite(x):
        return DASH
    x = float(x)
    text = f"${x:,.0f}" if abs(x) >= 1000 else f"${x:.3g}"
    return text + (EST if estimate else "")


def fmt_duration(seconds: Any) -> str:
    if not _finite(seconds):
        return DASH
    s = float(seconds)
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


# ---------------------------------------------------------------- the model


@dataclass
class Row:
    cells: list[str]
    flags: frozenset[str] = frozenset()  # "oversubscribed", "estimate", "pareto", "failed"


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[Row]
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    title: str
    headlines: list[str]
    tables: list[Table]
    summary: pd.DataFrame
    plots: list[tuple[str, str]] = field(default_factory=list)  # (relative path, caption)


def build_report(run: RunData) -> Report:
    """The whole report as strings: headlines, then tables."""
    summary = summarise(run.trials)
    knee_of = knees(summary)
    headlines = _headlines(run, summary, knee_of)
    tables = [] if summary.empty else [_results_table(summary), _machine_table(summary, knee_of)]
    failed = _failed_table(run.trials)
    if failed is not None:
        tables.append(failed)
    plan = _plan_table(run.sweep)
    if plan is not None:
        tables.append(plan)
    from orchestrator.results.profiles import profile_sections  # profiled trials (issue 12)

    knee_at = {m: k.workers for (m, _), k in knee_of.items() if k.reached}
    tables += [Table(s.title, s.headers, [Row(r) for r in s.rows], s.notes)
               for s in profile_sections(run.run_dir, knee_at)]
    return Report(
        title=f"cloudprof report — {run.name}", headlines=headlines, tables=tables, summary=summary
    )


def machine_label(machine: Any, ran_on: Any) -> str:
    """A machine's name, plus where it really ran when that was another host."""
    return str(machine) if str(machine) == str(ran_on) else f"{machine} (ran on {ran_on})"


def _where(row: dict[str, Any]) -> str:
    text = f"{row['machine']} × {n_workers(int(row['workers']))}"
    if row["estimate"]:
        text += f" (ran on {row['ran_on']})"
    return text


def _headlines(
    run: RunData, summary: pd.DataFrame, knee_of: dict[tuple[str, str], Knee]
) -> list[str]:
    trials = run.trials
    n_ok = int((trials["status"] == OK).sum())
    lines = [
        f"{len(trials)} trials: {n_ok} ok, {len(trials) - n_ok} not ok"
        + (f"; sweep status {run.sweep['status']}" if run.sweep.get("status") else "")
    ]
    workload = describe_workload(run)
    if workload:
        lines.append(f"Workload: {workload}")
    if summary.empty:
        lines.append("No trial finished ok: there is no throughput, cost or knee to report.")
        return lines
    cheapest, fastest = best_rows(summary)
    if cheapest is not None:
        estimate = " — an estimate" if cheapest["estimate"] else ""
        lines.append(
            f"Best by cost: {_where(cheapest)}, "
            f"{fmt_usd(cheapest['cost_per_million_units'])} per million units{estimate}"
        )
    else:
        lines.append("Best by cost: – (no price known for these machines)")
    if fastest is not None:
        lines.append(
            f"Best by throughput: {_where(fastest)}, {fmt_rate(fastest['units_per_s'])} units/s"
        )
    for (machine, ran_on), knee in knee_of.items():
        lines.append(f"Scaling stops for {machine_label(machine, ran_on)}: {knee.describe()}")
    estimated = summary[summary["estimate"]]
    if not estimated.empty:
        hosts = ", ".join(
            _host_facts(trials, h) for h in sorted({str(h) for h in estimated["ran_on"]})
        )
        lines.append(
            f"Estimates: trials ran on {hosts} instead of the planned machine, so throughput is "
            "that host's and every cost labelled (est.) prices it at the planned machine's rate."
        )
    one_host = {str(h) for h in summary["ran_on"]}
    if summary["machine"].nunique() > 1 and len(one_host) == 1 and bool(summary["estimate"].all()):
        lines.append(
            f"Every machine ran on the same host ({one_host.pop()}): between machines, only the "
            "prices differ here, not the hardware. Run without --dry-run to measure them."
        )
    if bool(summary["oversubscribed"].any()):
        lines.append("Rows marked oversubscribed ran more workers than the host has logical cores.")
    return lines


def describe_workload(run: RunData) -> str:
    """ "cube (frames=4, dim=10), 1 unit = 1 cube, 5 s per trial": what every trial ran."""
    spec = run.sweep.get("spec")
    if not isinstance(spec, dict) or not spec.get("workload"):
        return ""
    params = spec.get("workload_params") or {}
    text = str(spec["workload"])
    if params:
        text += " (" + ", ".join(f"{k}={v}" for k, v in sorted(params.items())) + ")"
    units = sorted({u for u in run.trials.get("unit", []) if isinstance(u, str) and u})
    if len(units) == 1:
        text += f", 1 unit = 1 {units[0]}"
    if _finite(spec.get("duration_s")):
        text += f", {float(spec['duration_s']):g} s per trial"
    return text


def _host_facts(trials: pd.DataFrame, ran_on: str) -> str:
    """ "local (2 vCPUs, AMD EPYC 7B13)": the host behind the measurements."""
    mine = trials[trials["ran_on"].astype(str) == ran_on]
    facts = []
    vcpus = mine["vcpus"].dropna()
    if not vcpus.empty:
        facts.append(f"{int(vcpus.iloc[0])} vCPUs")
    if "cpu_model" in mine:
        models = mine["cpu_model"].dropna()
        if not models.empty:
            facts.append(str(models.iloc[0]))
    return f"{ran_on} ({', '.join(facts)})" if facts else ran_on


def _results_table(summary: pd.DataFrame) -> Table:
    show_ran_on, title_note = _ran_on_column(summary)
    all_estimates = bool(summary["estimate"].all())
    cost_header = "$/M units" + (EST if all_estimates else "")
    rows = []
    for r in summary.to_dict("records"):
        flags = {name for name in ("oversubscribed", "estimate", "pareto") if r[name]}
        notes = []
        if r["oversubscribed"]:
            notes.append("oversubscribed")
        if r["pareto"]:
            notes.append("Pareto")
        if r["failed"]:
            flags.add("failed")
            notes.append(f"{r['failed']} failed")
        cells = {
            "machine": str(r["machine"]),
            "ran on": str(r["ran_on"]),
            "workers": str(r["workers"]),
            "n": str(r["repeats"]),
            "units/s": fmt_rate(r["units_per_s"]),
            "per vCPU": fmt_rate(r["units_per_s_per_vcpu"]),
            "eff.": fmt_pct(r["efficiency"]),
            "peak RSS": fmt_bytes(r["peak_rss_bytes"]),
            "CPU": fmt_pct(r["cpu_utilisation"]),
            "leak": str(r["leak_verdict"]),
            cost_header: fmt_usd(
                r["cost_per_million_units"], estimate=bool(r["estimate"]) and not all_estimates
            ),
            "notes": ", ".join(notes),
        }
        if not show_ran_on:
            del cells["ran on"]
        rows.append(Row(list(cells.values()), frozenset(flags)))
    headers = list(cells)
    notes = [
        "n = repeats that finished ok; every figure is their median, except peak RSS (their max).",
        "eff. = efficiency = units/s ÷ (workers × units/s at 1 worker on the same machine), "
        "– without a 1-worker baseline; CPU = mean utilisation of the host's cores.",
        "$/M units = $/hour ÷ (units/s × 3600) × 1e6; (est.) marks an estimate.",
        "$/hour is a list price: discounts not applied (GCP sustained/committed use, AWS "
        "savings plans and reserved instances) would lower every cost here.",
        "Pareto: no other row is both faster and cheaper per unit.",
    ]
    return Table("Results per machine and worker count" + title_note, headers, rows, notes)


def _ran_on_column(summary: pd.DataFrame) -> tuple[bool, str]:
    """Whether to show the "ran on" column, or a title note when all trials ran on one host."""
    elsewhere = summary["machine"].astype(str) != summary["ran_on"].astype(str)
    if not elsewhere.any():
        return False, ""
    hosts = sorted({str(h) for h in summary["ran_on"]})
    if elsewhere.all() and len(hosts) == 1:
        return False, f" (all trials ran on {hosts[0]})"
    return True, ""


def _machine_table(summary: pd.DataFrame, knee_of: dict[tuple[str, str], Knee]) -> Table:
    show_ran_on, title_note = _ran_on_column(summary)
    memory = {
        (str(r["machine"]), str(r["ran_on"])): r for r in peak_memory(summary).to_dict("records")
    }
    rows = []
    for (machine, ran_on), knee in knee_of.items():
        group = summary[(summary["machine"] == machine) & (summary["ran_on"] == ran_on)]
        best = group.loc[group["units_per_s"].idxmax()]
        tested = sorted(int(w) for w in group["workers"])
        peak = memory[(machine, ran_on)]
        where = f" at {int(peak['workers'])}" if _finite(peak["workers"]) else ""
        cells = [
            machine,
            ran_on,
            str(int(best["vcpus"])) if _finite(best["vcpus"]) else DASH,
            fmt_usd(best["price_per_hour"]) + (" spot" if best["spot"] else ""),
            ", ".join(map(str, tested)),
            knee.describe(),
            f"{fmt_rate(best['units_per_s'])} at {int(best['workers'])}",
            fmt_bytes(peak["peak_rss_bytes"]) + where,
        ]
        rows.append(Row(cells if show_ran_on else cells[:1] + cells[2:]))
    headers = [
        "machine",
        "ran on",
        "vCPUs",
        "$/hour",
        "workers tested",
        "scaling stops at",
        "best units/s",
        "peak RSS",
    ]
    if not show_ran_on:
        headers.remove("ran on")
    notes = [
        f"Scaling stops at the smallest worker count that no larger tested count beats by more "
        f"than {KNEE_GAIN:.0%} in median units/s (the knee).",
        "vCPUs of the host the trials ran on; $/hour is the catalog price of the planned machine "
        "at launch (its spot price when marked spot).",
        "Peak RSS: the kernel's high-water mark of the trial process (VmHWM), max over trials.",
    ]
    return Table("Per machine: where scaling stops, peak memory" + title_note, headers, rows, notes)


def _failed_table(trials: pd.DataFrame) -> Table | None:
    bad = trials[trials["status"] != OK]
    if bad.empty:
        return None
    rows = []
    for r in bad.sort_values(["machine", "workers", "repeat"], na_position="last").to_dict(
        "records"
    ):
        error = " ".join(str(r.get("error") or "").split())
        rows.append(
            Row(
                [
                    str(r.get("trial_id") or DASH),
                    str(r["machine"]),
                    str(r["workers"]),
                    str(r.get("repeat") if r.get("repeat") is not None else DASH),
                    str(r["status"]),
                    (error[:160] + "…") if len(error) > 160 else (error or DASH),
                ],
                flags=frozenset({"failed"}),
            )
        )
    return Table(
        "Trials that did not finish ok",
        ["trial", "machine", "workers", "repeat", "status", "error"],
        rows,
        ["These trials are left out of every median above."],
    )


def _plan_table(sweep: dict[str, Any]) -> Table | None:
    """The planner's estimates per VM, next to the VM time the store recorded.

    Seeing both tells a user how far to trust the next plan; a VM without a
    deletion time is shown with its last state, because it may still be billing.
    """
    plan = sweep.get("plan")
    if not isinstance(plan, dict) or not plan.get("vms"):
        return None
    records = sweep.get("vms") if isinstance(sweep.get("vms"), dict) else {}
    rows = []
    for vm in plan["vms"]:
        machine = vm.get("machine")
        est = vm.get("estimate") or {}
        price = est.get("price_per_hour")
        vm_time, vm_cost = _vm_time_and_cost(records.get(vm.get("name")) or {}, price)
        where = " ".join(
            str(part) for part in (vm.get("provider"), vm.get("zone") or vm.get("region")) if part
        )
        total_s = est.get("total_s")
        rows.append(
            Row(
                [
                    str(machine.get("name") if isinstance(machine, dict) else machine),
                    (where or DASH) + (" spot" if vm.get("spot") else ""),
                    str(len(vm.get("trials") or [])),
                    fmt_usd(price),
                    fmt_duration(total_s) if _finite(total_s) else DASH,
                    fmt_usd(est.get("cost_usd")),
                    vm_time,
                    vm_cost,
                ],
                flags=frozenset({"estimate"}),
            )
        )
    notes = [
        "est. time and est. cost come from the plan (boot, bootstrap, staging, trials, teardown): "
        "estimates.",
        "VM time: from the create request to the deletion, as recorded in sweep.json; VM cost = "
        "VM time × $/hour, an estimate of the bill (providers round and bill minimums). "
        "A --dry-run creates no VM: its time is the local run's.",
    ]
    total = plan.get("estimated_total_cost_usd")
    if _finite(total):
        notes.append(f"Estimated total cost of the planned VMs: {fmt_usd(total, estimate=True)}.")
    headers = [
        "machine",
        "where",
        "trials",
        "$/hour",
        "est. time",
        "est. cost",
        "VM time",
        "VM cost (est.)",
    ]
    return Table("Plan (estimates) and VM time", headers, rows, notes)


def _vm_time_and_cost(record: dict[str, Any], price: Any) -> tuple[str, str]:
    start, end = _parse_time(record.get("requested_at")), _parse_time(record.get("deleted_at"))
    if start is None:
        return DASH, DASH
    if end is None:
        return f"not deleted ({record.get('state') or 'unknown'})", DASH
    seconds = (end - start).total_seconds()
    if record.get("provider") == LOCAL:
        return fmt_duration(seconds), f"{DASH} (local)"
    cost = float(price) * seconds / 3600.0 if _finite(price) else math.nan
    return fmt_duration(seconds), fmt_usd(cost)


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


# ---------------------------------------------------------------- rendering


_ROW_STYLE = {"failed": "red", "oversubscribed": "yellow", "pareto": "bold green"}


_NUMERIC = frozenset(
    {"workers", "n", "units/s", "per vCPU", "eff.", "peak RSS", "CPU", "vCPUs", "trials", "repeat"}
)


def render_console(report: Report, console: Console) -> None:
    """Compact tables (no vertical rules) so the main one fits a 100-column terminal."""
    from rich import box
    from rich.table import Table as RichTable

    console.print(f"[bold]{_rich_escape(report.title)}[/bold]")
    for line in report.headlines:
        console.print(f"• {_rich_escape(line)}")
    for table in report.tables:
        rich_table = RichTable(
            title=table.title,
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            collapse_padding=True,
            title_justify="left",
            title_style="bold",
        )
        for header in table.headers:
            numeric = header in _NUMERIC or header.startswith("$")
            rich_table.add_column(
                header,
                justify="right" if numeric else "left",
                no_wrap=header == "machine",
                overflow="fold",
            )
        for row in table.rows:
            style = next((s for f, s in _ROW_STYLE.items() if f in row.flags), None)
            rich_table.add_row(*(_rich_escape(c) for c in row.cells), style=style)
        console.print(rich_table)
        for note in table.notes:
            console.print(f"[dim]{_rich_escape(note)}[/dim]")
        console.print()


def _rich_escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def render_markdown(report: Report) -> str:
    out = [f"# {_md(report.title)}", ""]
    out += [f"- {_md(line)}" for line in report.headlines]
    for table in report.tables:
        out += ["", f"## {_md(table.title)}", ""]
        out.append("| " + " | ".join(_md(h) for h in table.headers) + " |")
        out.append("|" + "|".join(" --- " for _ in table.headers) + "|")
        out += ["| " + " | ".join(_md(c) for c in row.cells) + " |" for row in table.rows]
        out += [""] + [f"*{_md(note)}*  " for note in table.notes]
    if report.plots:
        out += ["", "## Plots", ""]
        for path, caption in report.plots:
            out += [f"![{_md(caption)}]({path})", "", f"*{_md(caption)}*", ""]
    return "\n".join(out).rstrip() + "\n"


def _md(text: str) -> str:
    """Cell-safe Markdown: no table breaks, no stray emphasis or HTML."""
    text = " ".join(str(text).split())
    for ch in "\\|*_`[]<>":
        text = text.replace(ch, "\\" + ch)
    return text


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}
tr.oversubscribed td{background:#fff6d5}
tr.failed td{background:#fde2e2}
tr.pareto td:first-child{font-weight:bold}
p.note{color:#555;font-size:90%;margin:.2em 0}
figure{display:inline-block;margin:1em}
figcaption{color:#555;font-size:90%}
"""


def render_html(report: Report) -> str:
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{e(report.title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>{e(report.title)}</h1>",
        "<ul>",
        *(f"<li>{e(line)}</li>" for line in report.headlines),
        "</ul>",
    ]
    for table in report.tables:
        out.append(f"<h2>{e(table.title)}</h2>")
        out.append("<table>")
        out.append("<tr>" + "".join(f"<th>{e(h)}</th>" for h in table.headers) + "</tr>")
        for row in table.rows:
            cls = f' class="{" ".join(sorted(row.flags))}"' if row.flags else ""
            out.append(f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in row.cells) + "</tr>")
        out.append("</table>")
        out += [f'<p class="note">{e(note)}</p>' for note in table.notes]
    if report.plots:
        out.append("<h2>Plots</h2>")
        for path, caption in report.plots:
            out.append(
                f'<figure><img src="{e(path, quote=True)}" alt="{e(caption, quote=True)}">'
                f"<figcaption>{e(caption)}</figcaption></figure>"
            )
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- entry points


def print_summary(run_dir: str | Path, console: Console) -> Report:
    """The terminal report of one store (``cloudprof report`` and the end of a sweep)."""
    report = build_report(load_run(run_dir))
    render_console(report, console)
    return report


def write_report(run_dir: str | Path) -> Path:
    """Write plots/*.png, report.md and report.html into the store; returns report.html's path.

    Each file is written to a temporary name and renamed, so a reader never sees
    half a report.
    """
    from orchestrator.results import plots

    run = load_run(run_dir)
    report = build_report(run)
    report.plots = plots.render_plots(run, report.summary, run.run_dir / PLOTS_DIR)
    from orchestrator.results.profiles import render_profile_plots  # profiled trials (issue 12)

    report.plots += render_profile_plots(run.run_dir, run.run_dir / PLOTS_DIR)
    _write_atomic(run.run_dir / REPORT_MD, render_markdown(report))
    html_path = run.run_dir / REPORT_HTML
    _write_atomic(html_path, render_html(report))
    return html_path


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
