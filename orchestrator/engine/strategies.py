"""The strategies that choose which trial (or machine) runs next."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from orchestrator.formatting import fmt_usd
from orchestrator.plan.planner import Plan, TrialPlan
from orchestrator.results.store import RunStore

if TYPE_CHECKING:
    from orchestrator.engine.sweep import _Engine


def _run_search(engine: _Engine, plan: Plan, store: RunStore,
                todo: dict[str, list[TrialPlan]]) -> bool:
    """``--search``: run the candidate machines one at a time, each the one
    ``plan.search.search_step`` expects to improve most on what was measured.

    Each machine tried is a normal machine of the sweep (``engine.execute`` of
    that one VM: created, its grid or ``--adaptive`` run, torn down). What was
    tried is recorded in sweep.json (``search``) after every machine, so
    ``--resume`` goes on from there and the end of the sweep does not count the
    untried candidates as missing. False when interrupted.
    """
    from orchestrator.plan.search import (
        Candidate,
        describe_confidence,
        objective_value,
        peak_throughput,
        search_step,
    )
    from orchestrator.results.report.measure import trial_rate

    assert plan.search is not None
    goal, budget = plan.search["objective"], int(plan.search["budget"])
    vms = {vm.name: vm for vm in plan.vms}
    spot = engine.spec.spot
    cands = [Candidate(vm.name, vm.machine.vcpus, vm.machine.memory_gib, vm.machine.family,
                       vm.machine.price(spot) or 0.0) for vm in plan.vms]
    tried: list[str] = list((store.read_sweep().get("search") or {}).get("tried") or [])

    def measured() -> dict[str, float]:
        frame = store.trials_frame()
        ok = frame[frame["status"] == "ok"]
        out = {}
        for name in tried:
            rows = ok[ok["machine"] == vms[name].machine.name]
            samples = {int(w): [u for u in map(trial_rate, g.to_dict("records"))
                                if math.isfinite(u)]
                       for w, g in rows.groupby("workers")}
            out[name] = peak_throughput(samples) or 0.0
        return out

    def record(step: Any) -> dict[str, Any]:
        values = measured()
        spent = [vms[n].estimate.cost_usd for n in tried]
        info = {
            **plan.search, **step.to_dict(),
            "pick_machine": vms[step.pick].machine.name if step.pick else None,
            "tried": tried,
            "measured": {vms[n].machine.name: {
                "peak_units_per_s": v,
                goal: objective_value(goal, cands[list(vms).index(n)].price_per_hour, v)
                if v > 0 else None} for n, v in values.items()},
            "estimated_cost_usd": sum(c for c in spent if c is not None),
            "estimated_grid_cost_usd": plan.grid_cost_usd,
            "trials": len(store.trials_frame()),
            "grid_trials": sum(len(vm.trials) for vm in plan.vms),
        }
        store.update_sweep(search=info)
        return info

    again = [n for n in tried if todo.get(n)]  # --resume: a machine cut short goes on first
    while True:
        if again:
            name = again.pop(0)
        else:
            step = search_step(cands, measured(), goal, budget)
            if step.next is None:
                break
            name = step.next
            tried.append(name)
            record(step)
            engine.progress.log(f"--search: trying {vms[name].machine.name} "
                                f"({len(tried)} of at most {budget})")
        if todo.get(name) and not engine.execute({name: todo[name]}):
            return False
        if engine.stop.is_set():
            return False
    info = record(step)
    if info["pick_machine"]:
        conf = ("" if step.confidence is None
                else f", {describe_confidence(step.confidence)} sure it is the best")
        engine.progress.log(
            f"--search {goal}: picked {info['pick_machine']}{conf} of {len(cands)} candidates "
            f"after trying {len(tried)} ({step.stopped}); estimated cost "
            f"{fmt_usd(info['estimated_cost_usd'])} against {fmt_usd(plan.grid_cost_usd or 0.0)} "
            "for every candidate")
    return True
