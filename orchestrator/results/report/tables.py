"""The report as strings: headlines and tables built once from the model, for every renderer.

One model (``Report``: headlines and tables of strings) is built once and
rendered by ``terminal``, ``markdown`` and ``html``, so those outputs can never
disagree.

Estimates are labelled wherever they appear: a cost is an estimate when the
trial ran on another host than the machine it stands for (``--dry-run`` runs on
``local`` and prices the planned machine), and every figure from the plan is an
estimate by construction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.analysis.model import (
    KNEE_GAIN,
    MIN_REPEATS_FOR_CI,
    UslModel,
    fit_usl_many,
)
from orchestrator.analysis.ranking import rank
from orchestrator.formatting import (
    DASH,
    EST,
    fmt_bytes,
    fmt_duration,
    fmt_pct,
    fmt_rate,
    fmt_usd,
    is_finite,
    n_workers,
)
from orchestrator.results.report.measure import UNITS, Measure
from orchestrator.results.report.model import (
    LOCAL,
    OK,
    Knee,
    RunData,
    best_row,
    best_rows,
    by_host,
    knees,
    machine_label,
    parse_time,
    peak_memory,
    repeat_groups,
    samples,
    summarise,
)
from orchestrator.results.report.table import Row, Table
from orchestrator.results.report.values import numeric

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Report:
    title: str
    headlines: list[str]
    tables: list[Table]
    summary: pd.DataFrame  # ``summarise(trials)``: one row per machine, host and worker count
    plots: list[tuple[str, str]] = field(default_factory=list)  # (relative path, caption)
    # (machine, ran_on) -> the USL fit the table shows (None: no fit), reused by the throughput
    # figure: the bootstrap fit is the report's costliest step, computed once
    usl_models: dict[tuple[str, str], Any] = field(default_factory=dict)
    measure: Measure = UNITS  # how the rates and costs above are shown (units/s or runs/h)
    answers: list[Any] = field(default_factory=list)  # ``answer.AnswerCard``s: the report's top


def build_report(run: RunData) -> Report:
    """The whole report as strings: headlines, then tables."""
    summary = summarise(run.trials)
    by_machine = samples(run.trials)
    knee_of = knees(summary, by_machine)
    measure = run.measure
    headlines = _headlines(run, summary, knee_of, by_machine)
    tables = [] if summary.empty else [_results_table(summary, measure),
                                       _machine_table(summary, knee_of, measure)]
    models = {} if summary.empty else dict(zip(by_machine, fit_usl_many(list(by_machine.values())),
                                               strict=True))  # every machine's refits at once
    if not summary.empty:
        tables.append(_usl_table(models, measure))
    from orchestrator.results.report.jobs import job_tables
    from orchestrator.results.report.memory import memory_rows, memory_table

    memory_found = memory_rows(run.trials)  # the table's and the answer cards'
    memory = memory_table(run.trials, memory_found)  # peaks by phase, the memory request
    if memory is not None:
        tables.append(memory)
    from orchestrator.results.limits import limit_table

    proven = limit_table(run.run_dir)  # --prove-limit / --find-limit: the request under a limit
    if proven is not None:
        tables.append(proven)
    scaleout = _scaleout_table(run.trials)
    if scaleout is not None:
        tables.append(scaleout)
    tables.extend(job_tables(run.trials))  # a user's job: fixed-work runs, phases
    failed = _failed_table(run.trials, run.run_dir)
    if failed is not None:
        tables.append(failed)
    plan = _plan_table(run.sweep)
    if plan is not None:
        tables.append(plan)
    from orchestrator.results.profiles import profile_sections  # profiled trials (issue 12)

    knee_at = {m: k.workers for (m, _), k in knee_of.items() if k.reached}
    tables += [Table(s.title, s.headers, [Row(r) for r in s.rows], s.notes)
               for s in profile_sections(run.run_dir, knee_at, _slowdown_rows(run.trials))]
    from orchestrator.results.report.answer import answer_cards

    return Report(
        title=f"cloudprof report — {run.name}", headlines=headlines, tables=tables, summary=summary,
        usl_models=models, measure=measure,
        answers=answer_cards(run, summary, knee_of, by_machine, memory_found),
    )  # fmt: skip


def _slowdown_rows(trials: pd.DataFrame) -> list[dict[str, Any]]:
    """The columns a profiled trial's slowdown is measured against, a row at a time."""
    return trials[trials.columns.intersection(_SLOWDOWN_COLUMNS)].to_dict("records")


_SLOWDOWN_COLUMNS = ["status", "nodes", "machine_type", "machine", "ran_on", "workers", "grid",
                     "units", "units_per_s", "seconds"]


def _where(row: dict[str, Any]) -> str:
    text = f"{row['machine']} × {n_workers(int(row['workers']))}"
    if row["estimate"]:
        text += f" (ran on {row['ran_on']})"
    return text


def _gpu_headline(trials: pd.DataFrame) -> str | None:
    """The largest GPU memory a trial used, where any trial saw a GPU (issue 12)."""
    peaks = numeric(trials, "peak_gpu_mem_bytes")
    if peaks.isna().all():
        return None
    top = trials.loc[peaks.idxmax()]
    source = top.get("gpu_peak_source") or "NVML"
    return (f"Peak GPU memory: {fmt_bytes(peaks.max())} "
            f"({top['machine']} × {n_workers(int(top['workers']))}; {source})")  # fmt: skip


def _headlines(
    run: RunData, summary: pd.DataFrame, knee_of: dict[tuple[str, str], Knee],
    by_machine: dict[tuple[str, str], dict[int, list[float]]],
) -> list[str]:
    """The lines above the tables; ``by_machine`` is ``samples(run.trials)``, found once."""
    trials = run.trials
    n_ok = int((trials["status"] == OK).sum())
    from orchestrator.results.profiles import load_profiles

    profiled = load_profiles(run.run_dir)  # a profiled trial that failed is a failed trial
    p_ok = sum(1 for r in profiled if r.get("status") == OK)
    total, all_ok = len(trials) + len(profiled), n_ok + p_ok
    lines = [
        f"{total} trials: {all_ok} ok, {total - all_ok} not ok"
        + (f" ({len(profiled)} profiled)" if profiled else "")
        + (f"; sweep status {run.sweep['status']}" if run.sweep.get("status") else "")
    ]
    workload = describe_workload(run)
    if workload:
        lines.append(f"Workload: {workload}")
    if summary.empty:
        if n_ok:  # every ok trial is a --nodes trial: one_node() kept none of them
            lines.append("No ok trial ran on one machine, so there is no scale-up to report: "
                         "every ok trial is in \"Scale out\" below (--nodes).")
        else:
            lines.append("No trial finished ok: there is no throughput, cost or knee to report.")
        return lines
    cheapest, fastest = best_rows(summary)
    measure = run.measure
    if cheapest is not None:
        estimate = " — an estimate" if cheapest["estimate"] else ""
        lines.append(
            f"Best by cost: {_where(cheapest)}, "
            f"{fmt_usd(measure.cost(cheapest['cost_per_million_units']))} {measure.cost_per}"
            f"{estimate}" + _runner_up(run.trials, "cost_per_million_units", by_machine)
        )
    else:
        lines.append("Best by cost: – (no price known for these machines)")
    if fastest is not None:
        lines.append(
            f"Best by throughput: {_where(fastest)}, "
            f"{fmt_rate(measure.rate(fastest['units_per_s']))} {measure.name}"
            + (f" ({fmt_seconds(fastest['seconds_per_run'])} per run)"
               if measure.fixed_work else "")
            + _runner_up(run.trials, "units_per_s", by_machine)
        )
    for (machine, ran_on), knee in knee_of.items():
        lines.append(f"Scaling stops for {machine_label(machine, ran_on)}: {knee.describe()}")
    gpu = _gpu_headline(trials)
    if gpu:
        lines.append(gpu)
    return lines + _sweep_lines(run.sweep) + _caveats(trials, summary)


def _sweep_lines(sweep: dict[str, Any]) -> list[str]:
    """What --adaptive and --search decided, from sweep.json."""
    lines = []
    records = sweep.get("vms") if isinstance(sweep.get("vms"), dict) else {}
    for record in records.values():
        adaptive = record.get("adaptive") if isinstance(record, dict) else None
        if isinstance(adaptive, dict):
            lines.append(
                f"--adaptive: {record.get('machine')} took {adaptive.get('trials')} trials "
                f"against the full grid's {adaptive.get('grid_trials')} ({adaptive.get('stopped')})"
            )
    search = sweep.get("search")
    if isinstance(search, dict) and search.get("pick_machine"):
        conf = search.get("confidence")
        from orchestrator.analysis.search import describe_confidence

        sure = (f", {describe_confidence(conf)} sure it is the best of"
                if isinstance(conf, float) else " of")
        lines.append(
            f"--search {search.get('objective')}: picked {search['pick_machine']}{sure} "
            f"{search.get('candidates')} candidates after trying {len(search.get('tried') or [])} "
            f"({search.get('stopped')}); estimated search cost "
            f"{fmt_usd(search.get('estimated_cost_usd'), estimate=True)} against "
            f"{fmt_usd(search.get('estimated_grid_cost_usd'), estimate=True)} for every candidate"
        )
    return lines


def _caveats(trials: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """What limits the figures: one repeat, a host standing in for the planned machine."""
    lines = []
    if (summary["repeats"] < 2).all():
        lines.append(
            "One repeat per worker count: no spread was measured, so nothing here says how sure "
            "it is; run with --repeats 3 for a spread of each median (docs: picking repeats)."
        )
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
    if summary["machine"].nunique() > 1 and len(one_host) == 1 and summary["estimate"].all():
        lines.append(
            f"Every machine ran on the same host ({one_host.pop()}): between machines, only the "
            "prices differ here, not the hardware. Run without --dry-run to measure them."
        )
    if summary["oversubscribed"].any():
        lines.append("Rows marked oversubscribed ran more workers than the host has logical cores.")
    return lines


def _runner_up(
    trials: pd.DataFrame, metric: str, by_machine: dict[tuple[str, str], dict[int, list[float]]]
) -> str:
    """ "; runner-up n2 × 4 is within noise of it": what one more repeat could overturn.

    :func:`orchestrator.analysis.ranking.rank` compares the best and the runner-up by a
    bootstrap of their repeats; a single repeat on either side is never a clear win.
    """
    ranking = rank(repeat_groups(trials, metric, by_machine),
                   higher_is_better=metric == "units_per_s")
    if ranking is None or ranking.runner_up is None:
        return ""
    machine, _, workers = ranking.runner_up
    who = f"{machine} × {n_workers(int(workers))}"
    if ranking.within_noise:
        return f"; runner-up {who} is within noise of it (one more repeat could swap them)"
    cmp = ranking.comparison
    assert cmp is not None
    return f"; clearly ahead of runner-up {who} ({cmp.describe()})"


def describe_workload(run: RunData) -> str:
    """ "cube (dim=10), 1 unit = one cube of 4×10×10 float64 (0.0032 MB) delivered as a strided
    view, 5 s per trial": what every trial ran (``1 unit = 1 cube`` when a workload says less)."""
    spec = run.sweep.get("spec")
    if not isinstance(spec, dict) or not spec.get("workload"):
        return ""
    from orchestrator.results.report.jobs import describe_command

    if spec.get("command"):
        return describe_command(spec, run.trials)
    params = spec.get("workload_params") or {}
    text = str(spec["workload"])
    if params:
        text += " (" + ", ".join(f"{k}={v}" for k, v in sorted(params.items())) + ")"
    details = sorted({u for u in run.trials.get("unit_detail", ()) if isinstance(u, str) and u})
    units = sorted({u for u in run.trials.get("unit", ()) if isinstance(u, str) and u})
    if len(details) == 1:  # what one unit delivered, e.g. the cube's consumer
        text += f", 1 unit = {details[0]}"
    elif len(units) == 1:
        text += f", 1 unit = 1 {units[0]}"
    if is_finite(spec.get("duration_s")):
        text += f", {float(spec['duration_s']):g} s per trial"
    return text


def _host_facts(trials: pd.DataFrame, ran_on: str) -> str:
    """ "local (2 vCPUs, AMD EPYC 7B13)": the host behind the measurements."""
    mine = trials[trials["ran_on"].astype(str) == ran_on]
    facts = []
    vcpus = mine["vcpus"].dropna()
    if len(vcpus):
        facts.append(f"{int(vcpus.iloc[0])} vCPUs")
    if "cpu_model" in mine:
        models = mine["cpu_model"].dropna()
        if len(models):
            facts.append(str(models.iloc[0]))
    return f"{ran_on} ({', '.join(facts)})" if facts else ran_on


def _results_table(summary: pd.DataFrame, measure: Measure = UNITS) -> Table:
    show_ran_on, title_note = _ran_on_column(summary)
    all_estimates = bool(summary["estimate"].all())
    cost_header = measure.cost_name + (EST if all_estimates else "")
    rate = measure.name
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
            "time/run": fmt_seconds(r["seconds_per_run"]),
            rate: fmt_rate(measure.rate(r["units_per_s"])),
            "spread": _spread(r, measure),
            "per vCPU": fmt_rate(measure.rate(r["units_per_s_per_vcpu"])),
            "eff.": fmt_pct(r["efficiency"]),
            "peak RSS": fmt_bytes(r["peak_rss_bytes"]),
            "CPU": fmt_pct(r["cpu_utilisation"]),
            "leak": _leak(r),
            cost_header: fmt_usd(
                measure.cost(r["cost_per_million_units"]),
                estimate=bool(r["estimate"]) and not all_estimates,
            ),
            "notes": ", ".join(notes),
        }
        if not show_ran_on:
            del cells["ran on"]
        if not measure.fixed_work:
            del cells["time/run"]
        rows.append(Row(list(cells.values()), frozenset(flags)))
    headers = list(cells)
    if measure.fixed_work:
        return Table("Results per machine and worker count" + title_note, headers, rows,
                     _fixed_work_notes())
    notes = [
        "n = repeats that finished ok; every figure is their median, except peak RSS (their max).",
        "spread of units/s: the bootstrap 95% interval of the median (CI) from "
        f"{MIN_REPEATS_FOR_CI} repeats on, else the interquartile range of the repeats (IQR); "
        "– with one repeat (no spread measured).",
        "leak: the worst verdict over repeats with the highest probability that memory was "
        "still growing at the end (p); ramp = grew, then levelled off (buffers, not a leak).",
        "eff. = efficiency = units/s ÷ (workers × units/s at 1 worker on the same machine), "
        "– without a 1-worker baseline; CPU = mean utilisation of the host's cores.",
        "$/M units = $/hour ÷ (units/s × 3600) × 1e6; (est.) marks an estimate.",
        "$/hour is a list price: discounts not applied (GCP sustained/committed use, AWS "
        "savings plans and reserved instances) would lower every cost here.",
        "Pareto: no other row is both faster and cheaper per unit.",
    ]
    return Table("Results per machine and worker count" + title_note, headers, rows, notes)


def _fixed_work_notes() -> list[str]:
    """The results table's notes for a job that does a fixed amount of work per trial."""
    return [
        "A fixed-work job: each trial is one complete run (it reported no units), measured by "
        "its time to complete; n = repeats that finished ok.",
        "time/run = median time to complete over the repeats; runs/h = 3600 ÷ time/run; "
        "peak RSS is the repeats' max.",
        "spread of runs/h: the bootstrap 95% interval of the median (CI) from "
        f"{MIN_REPEATS_FOR_CI} repeats on, else the interquartile range of the repeats (IQR); "
        "– with one repeat (no spread measured).",
        "leak: a fixed-work run grows as it works, so its verdict is inconclusive.",
        "eff. = efficiency = time/run at 1 worker ÷ (workers × time/run), on the same machine; "
        "– without a 1-worker baseline; CPU = mean utilisation of the host's cores.",
        "$/run = $/hour × time/run ÷ 3600; (est.) marks an estimate.",
        "$/hour is a list price: discounts not applied (GCP sustained/committed use, AWS "
        "savings plans and reserved instances) would lower every cost here.",
        "Pareto: no other row both finishes sooner and costs less per run.",
    ]


def fmt_seconds(value: Any) -> str:
    """A time to complete: 0.38 s, 12.4 s, 3.5 min; – when unknown."""
    if not is_finite(value):
        return DASH
    s = float(value)
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _scaleout_table(trials: pd.DataFrame) -> Table | None:
    """--nodes: throughput, scale-out efficiency, cost and per-node memory per node count."""
    from orchestrator.results.report.model import scaleout_summary

    frame = scaleout_summary(trials)
    if frame is None or frame.empty:
        return None
    rows = []
    for r in frame.to_dict("records"):
        flags = {name for name in ("estimate", "pareto") if r[name]}
        imbalance = r["imbalance"]
        cells = [
            machine_label(r["machine"], r["ran_on"]), str(r["nodes"]), str(r["workers"]),
            str(r["repeats"]), fmt_rate(r["units_per_s"]), fmt_pct(r["scaleout_efficiency"]),
            fmt_usd(r["price_per_hour"]),
            fmt_usd(r["cost_per_million_units"], estimate=bool(r["estimate"])),
            " / ".join(fmt_bytes(p) for p in r["node_peaks"]) or DASH,
            r["node_peak_source"] or DASH,
            f"{imbalance:.2f}×" if is_finite(imbalance) else DASH,
            "Pareto" if r["pareto"] else "",
        ]
        rows.append(Row(cells, frozenset(flags)))
    headers = ["machine", "nodes", "workers/node", "n", "units/s", "scale-out eff.",
               "$/hour (all nodes)", "$/M units", "peak RSS per node", "peak source",
               "node imbalance",
               "notes"]
    notes = [
        "Scale up (1 node: workers on one VM) and scale out (a Ray cluster of n VMs, one actor "
        "per node with the same workers each) side by side; every figure is the median over "
        "ok repeats.",
        "scale-out eff. = units/s ÷ (nodes × units/s on 1 node at the same workers); 100% = "
        "each added node adds a whole node's throughput.",
        "$/hour and $/M units price every node of the cluster; (est.) marks an estimate.",
        "peak RSS per node: all of each node's Ray processes, max over repeats; peak source "
        "cgroup-v1/v2: the kernel's high-water mark of the node's memory cgroup (page cache "
        "included; node 0 also holds Ray's GCS), sampled_tree: the sampled sum of the node's "
        "raylet and workers (1 node: the trial process's own peak); node imbalance = largest "
        "÷ smallest node peak.",
        "Pareto: no other row (one VM or a cluster) is both faster and cheaper per unit.",
    ]
    return Table("Scale out: throughput, cost and memory per node count", headers, rows, notes)


def _spread(row: dict[str, Any], measure: Measure = UNITS) -> str:
    """ "360–400 IQR": the spread of the rate behind the median, and which one it is."""
    if row["repeats"] < 2 or not row.get("spread_method"):
        return DASH
    low = fmt_rate(measure.rate(row["units_per_s_low"]))
    high = fmt_rate(measure.rate(row["units_per_s_high"]))
    return f"{low}–{high} {row['spread_method'].replace('95% ', '')}"


def _leak(row: dict[str, Any]) -> str:
    """ "ok p=0.02 ramp": the verdict, its probability, and whether RSS ramped then levelled."""
    text = str(row["leak_verdict"])
    if is_finite(row.get("leak_probability")):
        text += f" p={float(row['leak_probability']):.2f}"
    if row.get("leak_ramp"):
        text += " ramp"
    return text


def _ran_on_column(summary: pd.DataFrame) -> tuple[bool, str]:
    """Whether to show the "ran on" column, or a title note when all trials ran on one host."""
    elsewhere = summary["machine"].astype(str) != summary["ran_on"].astype(str)
    if not elsewhere.any():
        return False, ""
    hosts = sorted({str(h) for h in summary["ran_on"]})
    if elsewhere.all() and len(hosts) == 1:
        return False, f" (all trials ran on {hosts[0]})"
    return True, ""


def _machine_table(summary: pd.DataFrame, knee_of: dict[tuple[str, str], Knee],
                   measure: Measure = UNITS) -> Table:
    show_ran_on, title_note = _ran_on_column(summary)
    memory = {(str(r["machine"]), str(r["ran_on"])): r
              for r in peak_memory(summary).to_dict("records")}
    rows = []
    groups = dict(by_host(summary))
    for (machine, ran_on), knee in knee_of.items():
        group = groups[(machine, ran_on)]
        best = best_row(group)
        tested = sorted(int(w) for w in group["workers"])
        peak = memory[(machine, ran_on)]
        where = f" at {int(peak['workers'])}" if is_finite(peak["workers"]) else ""
        cells = [
            machine,
            ran_on,
            str(int(best["vcpus"])) if is_finite(best["vcpus"]) else DASH,
            fmt_usd(best["price_per_hour"]) + (" spot" if best["spot"] else ""),
            ", ".join(map(str, tested)),
            knee.describe(),
            f"{fmt_rate(measure.rate(best['units_per_s']))} at {int(best['workers'])}",
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
        f"best {measure.name}",
        "peak RSS",
    ]
    if not show_ran_on:
        headers.remove("ran on")
    notes = [
        f"Scaling stops at the smallest worker count that no larger tested count beats by more "
        f"than {KNEE_GAIN:.0%} in median {measure.name} (the knee); a range is where it lands "
        "in 95% of bootstrap resamples of the repeats (none shown: every resample agrees).",
        "vCPUs of the host the trials ran on; $/hour is the catalog price of the planned machine "
        "at launch (its spot price when marked spot).",
        "Peak RSS: the kernel's high-water mark of the trial process (VmHWM), max over trials.",
    ]
    return Table("Per machine: where scaling stops, peak memory" + title_note, headers, rows, notes)


def _interval(value: float, bounds: tuple[float, float], fmt: Any) -> str:
    """ "0.031 [0.020–0.045]": a fitted figure with its bootstrap 95% interval."""
    if not is_finite(value):
        return DASH
    low, high = bounds
    shown = "–".join(fmt(b) if is_finite(b) else "∞" for b in (low, high))
    return f"{fmt(value)} [{shown}]"


def _usl_table(models: dict[tuple[str, str], UslModel | None],
               measure: Measure = UNITS) -> Table:
    """σ, κ, N*, X(N*) per machine with intervals, and the fit's verdict (a poor fit is said)."""
    from orchestrator.analysis.model import MIN_DISTINCT_WORKERS

    rows = []
    for (machine, ran_on), model in models.items():
        name = machine_label(machine, ran_on)
        if model is None:
            reason = f"no fit: needs {MIN_DISTINCT_WORKERS} worker counts with a result"
            rows.append(Row([name, DASH, DASH, DASH, DASH, reason]))
            continue
        f, ci = model.fit, model.intervals
        n_star = (
            _interval(f.n_star, ci["n_star"], lambda v: f"{v:.1f}")
            if math.isfinite(f.n_star)
            else "none (κ = 0)"
        )
        rows.append(
            Row(
                [
                    name,
                    _interval(f.sigma, ci["sigma"], lambda v: f"{v:.3f}"),
                    _interval(f.kappa, ci["kappa"], lambda v: f"{v:.2g}"),
                    n_star,
                    _interval(f.x_star, ci["x_star"], lambda v: fmt_rate(measure.rate(v))),
                    f.verdict(),
                ],
                flags=frozenset({"failed"}) if f.poor else frozenset(),
            )
        )
    notes = [
        "Universal Scalability Law X(N) = λN / (1 + σ(N−1) + κN(N−1)), fitted to every repeat by "
        "bounded least squares; [low–high] = bootstrap 95% interval.",
        "σ = contention (serial share), κ = coherency (cross-talk that makes throughput fall); "
        f"N* = √((1−σ)/κ) = predicted peak worker count, X(N*) = predicted {measure.name} there "
        "(λ/σ, the ceiling, when κ = 0).",
        "A poor fit means the curve misses the measured medians: trust the table above instead.",
    ]
    return Table(
        "Scaling model per machine (USL fit)",
        ["machine", "σ", "κ", "N*", f"X(N*) {measure.name}", "fit"],
        rows,
        notes,
    )


def _failed_table(trials: pd.DataFrame, run_dir: Path | None = None) -> Table | None:
    from orchestrator.results.profiles import load_profiles

    bad = trials[trials["status"] != OK]
    profiled = [r for r in (load_profiles(run_dir) if run_dir else []) if r.get("status") != OK]
    if bad.empty and not profiled:
        return None
    rows = []
    for r in [*bad.sort_values(["machine", "workers", "repeat"]).to_dict("records"), *profiled]:
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
                    fmt_duration(total_s) if is_finite(total_s) else DASH,
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
    if is_finite(total):
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
    start, end = parse_time(record.get("requested_at")), parse_time(record.get("deleted_at"))
    if start is None:
        return DASH, DASH
    if end is None:
        return f"not deleted ({record.get('state') or 'unknown'})", DASH
    seconds = (end - start).total_seconds()
    if record.get("provider") == LOCAL:
        return fmt_duration(seconds), f"{DASH} (local)"
    cost = float(price) * seconds / 3600.0 if is_finite(price) else math.nan
    return fmt_duration(seconds), fmt_usd(cost)


