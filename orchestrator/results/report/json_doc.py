"""The report as one JSON document (``cloudprof report --json``), for scripts.

Built from the model (the summary frame, knees, peak memory), never from the
strings the other renderers print, so a script gets numbers in base units
(units/s, bytes, USD, fractions), not "1.2 GiB" or "37%". Keys are stable:
``SCHEMA`` names the layout and changes when a key is renamed or removed
(adding a key does not change it). An unknown number is ``null``, never NaN,
so any JSON parser reads the output.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from orchestrator.analysis.ranking import machine_confidence
from orchestrator.results.report.measure import Measure
from orchestrator.results.report.model import (
    OK,
    SUMMARY_COLUMNS,
    RunData,
    best_row,
    best_rows,
    by_host,
    knees,
    peak_memory,
    samples,
    summarise,
)
from orchestrator.results.report.tables import describe_workload

if TYPE_CHECKING:
    import pandas as pd

SCHEMA = "cloudprof.report/1"


def plain(value: Any) -> Any:
    """A JSON-safe Python value: numpy scalars unwrapped, NaN and inf as None."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if type(value).__name__ in ("NAType", "NaTType"):  # pandas' missing values
        return None
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()  # numpy scalar
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def report_document(run: RunData, summary: pd.DataFrame | None = None) -> dict[str, Any]:
    """The whole report as a dict of plain values (docs/reference/report.md lists the keys)."""
    if summary is None:
        summary = summarise(run.trials)
    trials = run.trials
    n_ok = int((trials["status"] == OK).sum())
    from orchestrator.results.profiles import load_profiles

    profiled = load_profiles(run.run_dir)  # extra trials, counted and listed like the others
    p_ok = sum(1 for r in profiled if r.get("status") == OK)
    units = sorted({u for u in trials.get("unit", ()) if isinstance(u, str) and u})
    cheapest, fastest = best_rows(summary)
    measure = run.measure
    from orchestrator.results.report.answer import answer_cards

    return plain(
        {
            "schema": SCHEMA,
            "run": {
                "id": run.name,
                "path": str(run.run_dir),
                "status": run.sweep.get("status"),
                "workload": describe_workload(run) or None,
                "unit": units[0] if len(units) == 1 else None,
            },
            # which unit the rates and costs are in: units/s, or runs/h for a fixed-work job
            "measure": measure.document(),
            "trials": {"total": len(trials) + len(profiled), "ok": n_ok + p_ok,
                       "not_ok": len(trials) - n_ok + len(profiled) - p_ok},
            # the card each format opens with, per machine (answer.AnswerCard.to_dict)
            "answer": [card.to_dict() for card in answer_cards(run, summary)],
            "best": {
                "by_cost": _best(cheapest, "cost_per_million_units", measure),
                "by_throughput": _best(fastest, "units_per_s", measure),
            },
            "machines": _machines(summary, samples(trials), measure),
            "results": [
                {**{column: row[column] for column in SUMMARY_COLUMNS},
                 **_in_measure(row, measure)}
                for row in summary.to_dict("records")
            ],
            "failed_trials": _failed(trials) + _failed_profiled(profiled),
            "plan": _plan(run.sweep),
            "memory": _memory(trials),
            # --nodes only: a one-VM sweep's document keeps the keys it always had
            **({"scale_out": scale_out} if (scale_out := _scale_out(trials)) else {}),
            # --prove-limit / --find-limit only: the memory request under a cgroup limit
            **({"memory_limits": limits} if (limits := _limits(run.run_dir)) else {}),
            # --target / --total only: the forecast at a size and the whole job's time and cost
            **_whole_job(run),
        }
    )


def _whole_job(run: RunData) -> dict[str, Any]:
    """``forecast`` (--target) and ``total`` (--total or --target): empty when not asked."""
    q = run.question
    if q is None or not q.asked:
        return {}
    from orchestrator.results import whole_job

    out: dict[str, Any] = {}
    if q.target is not None:
        out["forecast"] = whole_job.forecasts(run, q)
        out["forecast_warnings"] = whole_job.warnings(run, q)
    out["total"] = whole_job.totals(run, q)
    return out


def _memory(trials: pd.DataFrame) -> list[dict[str, Any]]:
    """Per machine and worker count: the whole-lifetime peak, its phases, the memory request."""
    from orchestrator.results.report.memory import memory_rows

    return memory_rows(trials)


def _limits(run_dir: Any) -> list[dict[str, Any]]:
    """Per machine and worker count: the proof's outcome and the smallest limit found."""
    from orchestrator.results.limits import limit_rows

    return limit_rows(run_dir)


def _in_measure(row: dict[str, Any], measure: Measure) -> dict[str, Any]:
    """A fixed-work row's rate and cost in its own units (runs/h, $/run) and its time per
    run, beside the base-unit columns every row has; nothing more for a job with units."""
    if not measure.fixed_work:
        return {}
    return {"seconds_per_run": row["seconds_per_run"],
            measure.rate_key: measure.rate(row["units_per_s"]),
            measure.cost_key: measure.cost(row["cost_per_million_units"])}


def _best(row: dict[str, Any] | None, metric: str, measure: Measure) -> dict[str, Any] | None:
    if row is None:
        return None
    return {
        "machine": row["machine"],
        "ran_on": row["ran_on"],
        "workers": row["workers"],
        metric: row[metric],
        "estimate": bool(row["estimate"]) if metric.startswith("cost") else False,
        **_in_measure(row, measure),
    }


def _machines(
    summary: pd.DataFrame, by_machine: dict[tuple[str, str], dict[int, list[float]]],
    measure: Measure,
) -> list[dict[str, Any]]:
    """Per machine: the knee, best row, peak memory, and ``confidence``.

    ``confidence`` is :func:`orchestrator.analysis.ranking.machine_confidence`: the
    spread per worker count, the knee's bootstrap range and the USL fit with
    intervals, its verdict and predictions at the tested counts and at 2× the
    largest one (an untested count, with its band).
    """
    memory = {(str(r["machine"]), str(r["ran_on"])): r
              for r in peak_memory(summary).to_dict("records")}
    out = []
    groups = dict(by_host(summary))
    for (machine, ran_on), knee in knees(summary).items():
        group = groups[(machine, ran_on)]
        best = best_row(group)
        peak = memory[(machine, ran_on)]
        out.append(
            {
                "machine": machine,
                "ran_on": ran_on,
                "vcpus": best["vcpus"],
                "price_per_hour": best["price_per_hour"],
                "spot": bool(best["spot"]),
                "workers_tested": sorted(int(w) for w in group["workers"]),
                "knee_workers": knee.workers if knee.reached else None,
                "knee_reached": knee.reached,
                "best_units_per_s": best["units_per_s"],
                **({f"best_{measure.rate_key}": measure.rate(best["units_per_s"]),
                    "best_seconds_per_run": best["seconds_per_run"]}
                   if measure.fixed_work else {}),
                "best_workers": int(best["workers"]),
                "peak_rss_bytes": peak["peak_rss_bytes"],
                "peak_rss_workers": peak["workers"],
                "confidence": _confidence(by_machine.get((machine, ran_on), {})),
            }
        )
    return out


def _confidence(data: dict[int, list[float]]) -> dict[str, Any]:
    tested = sorted(data)
    predict_at = [*tested, 2 * tested[-1]] if tested else []
    return machine_confidence(data, predict_at=predict_at)


def _scale_out(trials: pd.DataFrame) -> list[dict[str, Any]] | None:
    """--nodes: one entry per (machine, nodes, workers); None for a one-VM sweep."""
    from orchestrator.results.report.model import scaleout_summary

    frame = scaleout_summary(trials)
    return None if frame is None else frame.to_dict("records")


def _failed(trials: pd.DataFrame) -> list[dict[str, Any]]:
    bad = trials[trials["status"] != OK].sort_values(["machine", "workers", "repeat"])
    columns = ["trial_id", "machine", "workers", "repeat", "status", "error"]
    return [{**{c: r.get(c) for c in columns}, "profiled": False}
            for r in bad.to_dict("records")]


def _failed_profiled(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Profiled trials (kept under profiles/, not in trials.parquet) that did not finish ok."""
    columns = ["trial_id", "machine", "workers", "repeat", "status", "error"]
    return [{**{c: r.get(c) for c in columns}, "profiled": True}
            for r in records if r.get("status") != OK]


def _plan(sweep: dict[str, Any]) -> dict[str, Any] | None:
    """The planner's estimates as sweep.json holds them (every figure in it is an estimate)."""
    plan = sweep.get("plan")
    if not isinstance(plan, dict):
        return None
    return {
        "estimated_total_cost_usd": plan.get("estimated_total_cost_usd"),
        "vms": [
            {
                "name": vm.get("name"),
                "machine": (vm.get("machine") or {}).get("name")
                if isinstance(vm.get("machine"), dict)
                else vm.get("machine"),
                "provider": vm.get("provider"),
                "trials": len(vm.get("trials") or []),
                "estimated_seconds": (vm.get("estimate") or {}).get("total_s"),
                "estimated_cost_usd": (vm.get("estimate") or {}).get("cost_usd"),
            }
            for vm in plan.get("vms") or []
            if isinstance(vm, dict)
        ],
    }


def render_json(document: dict[str, Any]) -> str:
    """Indented, key order as built (stable), strict JSON (no NaN)."""
    return json.dumps(document, indent=2, allow_nan=False, ensure_ascii=False) + "\n"
