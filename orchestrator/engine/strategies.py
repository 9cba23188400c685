"""The strategies: which trial (or machine) runs next, as loops over the trial runner.

The grid runs a machine's planned trials in order; ``--adaptive`` asks
``analysis.search.next_points`` for the worker counts worth measuring next; ``--search``
runs whole machines, one at a time, each the one ``analysis.search.search_step``
expects to improve most; ``--prove-limit``/``--find-limit`` follow a machine's
trials (``orchestrator.engine.limits``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UnreachableError, one_line
from orchestrator.formatting import fmt_usd
from orchestrator.plan.planner import TrialPlan, VmPlan

if TYPE_CHECKING:
    from orchestrator.analysis.search import Candidate
    from orchestrator.engine.context import SweepContext
    from orchestrator.engine.host_session import HostSession
    from orchestrator.engine.trial_runner import TrialRunner

Todo = dict[str, list[TrialPlan]]


def run_machine_trials(host: HostSession, trials: list[TrialPlan], runner: TrialRunner) -> None:
    """A ready machine's trials: ``--adaptive``'s, else the grid's, then any limit trials."""
    ctx = host.ctx
    if ctx.spec.adaptive:
        run_adaptive(host, runner)
        return
    if not run_grid(host, trials, runner):
        return
    if ctx.spec.prove_limit or ctx.spec.find_limit:
        prove_limits(host, runner)


def run_grid(host: HostSession, trials: list[TrialPlan], runner: TrialRunner) -> bool:
    """The planned trials in order; False when the sweep stopped before the last."""
    for i, trial in enumerate(trials):
        if host.ctx.stop.is_set():
            return False
        try:
            runner.run(host, trial)
        except UnreachableError as exc:
            # Its reconnect budget is spent: waiting again for each trial left would
            # cost that budget again and again. They fail now, with the reason.
            reason = f"machine unreachable: {one_line(exc)}"
            host.ctx.progress.log(f"[red]{host.vm.machine.name}: unreachable; "
                                  f"{len(trials) - i} trial(s) left recorded as failed")
            for left in trials[i:]:
                runner.record(host, left, None, None, status="failed", error=reason)
            raise
    return True


def prove_limits(host: HostSession, runner: TrialRunner) -> None:
    """--prove-limit/--find-limit after the machine's trials: orchestrator.engine.limits."""
    from orchestrator.engine.limits import prove_limits as prove

    ctx = host.ctx
    prove(ctx.spec, host.vm.machine.name, ctx.store.trial_rows(),
          lambda trial, meta: runner.run_limit(host, trial, meta),
          ctx.progress.log, ctx.stop.is_set)


# -- --adaptive ------------------------------------------------------------------


def _rate_of_last(ctx: SweepContext, trial_id: str) -> float | None:
    """The trial's units/s as the store holds it; None unless it finished ok."""
    from orchestrator.results.report.measure import trial_rate

    done = ctx.store.trials_frame()
    row = done[done["trial_id"] == trial_id]
    if row.empty or row["status"].iloc[-1] != "ok":
        return None
    ups = trial_rate(row.iloc[-1].to_dict())
    return ups if math.isfinite(ups) else None


def _adaptive_history(ctx: SweepContext,
                      machine: str) -> tuple[dict[int, list[float]], dict[int, int]]:
    """What the store already holds for the machine: ok rates and tries per worker count."""
    from orchestrator.results.report.measure import trial_rate

    measured: dict[int, list[float]] = {}
    tried: dict[int, int] = {}
    frame = ctx.store.trials_frame()
    for row in frame[frame["machine"] == machine].to_dict("records"):
        w = int(row["workers"])
        tried[w] = tried.get(w, 0) + 1
        ups = trial_rate(row)
        if row["status"] == "ok" and math.isfinite(ups):
            measured.setdefault(w, []).append(ups)
    return measured, tried


def run_adaptive(host: HostSession, runner: TrialRunner) -> None:
    """``--adaptive``: run what ``analysis.search.next_points`` asks for, one trial at a time.

    The budget is the planned grid's trial count for this machine; trial ids
    stay ``<machine>-w<N>-r<k>`` with k counting every trial at N already in
    the store, so they are unique and ``--resume`` continues from what was
    measured. A trial that does not finish ok spends budget (a machine that
    keeps failing cannot loop). How many trials it took is recorded on the
    VM (``adaptive`` in sweep.json) and logged.
    """
    from orchestrator.analysis.search import next_points
    from orchestrator.plan.planner import trial_id, trial_request

    ctx, vm, machine = host.ctx, host.vm, host.vm.machine.name
    budget = len(vm.trials)
    measured, tried = _adaptive_history(ctx, machine)
    spent = sum(tried.values())
    while not ctx.stop.is_set():
        ok_count = sum(len(v) for v in measured.values())
        points = next_points(measured, max(1, int(vm.machine.vcpus)),
                             budget - (spent - ok_count))
        if not points:
            break
        for w in points:
            if ctx.stop.is_set():
                return
            r = tried.get(w, 0)
            tid = trial_id(machine, w, r)
            trial = TrialPlan(tid, machine, w, r, trial_request(ctx.spec, w, tid, r))
            tried[w] = tried.get(w, 0) + 1
            spent += 1
            runner.run(host, trial)
            ups = _rate_of_last(ctx, trial.trial_id)
            if ups is not None:
                measured.setdefault(w, []).append(ups)
    if ctx.stop.is_set():
        return
    _adaptive_done(ctx, vm, measured, spent, budget)


def _adaptive_done(ctx: SweepContext, vm: VmPlan, measured: dict[int, list[float]],
                   spent: int, budget: int) -> None:
    """Why the loop stopped, in sweep.json and the log."""
    from orchestrator.analysis.model import fit_usl_with_intervals
    from orchestrator.analysis.search import ADAPTIVE_BOOT, converged

    model = fit_usl_with_intervals(measured, n_boot=ADAPTIVE_BOOT)
    if model is not None and converged(model):
        stopped = "N* known within ±10%"
    else:
        stopped = "budget spent" if spent >= budget else "no usable USL fit"
    ctx.store.record_vm(vm.name, adaptive={"trials": spent, "grid_trials": budget,
                                           "stopped": stopped})
    ctx.progress.log(f"{vm.machine.name}: --adaptive took {spent} trials against the full "
                     f"grid's {budget} ({stopped})")


# -- --search --------------------------------------------------------------------


class _Search:
    """What ``--search`` has tried and measured, kept in sweep.json after every machine."""

    def __init__(self, ctx: SweepContext) -> None:
        from orchestrator.analysis.search import Candidate

        plan = ctx.plan
        assert plan.search is not None
        self.ctx, self.plan = ctx, plan
        self.goal, self.budget = plan.search["objective"], int(plan.search["budget"])
        self.vms = {vm.name: vm for vm in plan.vms}
        spot = ctx.spec.spot
        self.cands: list[Candidate] = [
            Candidate(vm.name, vm.machine.vcpus, vm.machine.memory_gib, vm.machine.family,
                      vm.machine.price(spot) or 0.0) for vm in plan.vms]
        self.tried: list[str] = list(
            (ctx.store.read_sweep().get("search") or {}).get("tried") or [])

    def measured(self) -> dict[str, float]:
        return self.rates()[0]

    def rates(self) -> tuple[dict[str, float], dict[str, float]]:
        """Per machine tried: the rate its objective ranks, and its fastest whole rate.

        Each (workers, nodes) is its own configuration. With --nodes, cost per unit is
        nodes x the machine's price over the whole rate, so a cost search ranks rates per
        VM; a throughput search, the whole rate. A deadline (--deadline T --total N) is
        met by the whole configuration, all its VMs: only configurations whose whole rate
        reaches N/T are ranked, unless none of the machine's does (then all are, and the
        machine is not feasible: the fastest whole rate says so).
        """
        from orchestrator.analysis.search import peak_throughput
        from orchestrator.results.report.measure import trial_rate

        assert self.plan.search is not None
        min_rate = self.plan.search.get("min_rate")
        frame = self.ctx.store.trials_frame()
        ok = frame[frame["status"] == "ok"]
        out, whole = {}, {}
        for name in self.tried:
            rows = ok[ok["machine"] == self.vms[name].machine.name]
            nodes = rows["nodes"].fillna(1).astype(int) if "nodes" in rows else 1
            configs = []  # (whole rate, nodes)
            for (_, n), g in rows.assign(nodes=nodes).groupby(["workers", "nodes"]):
                rates = [u for u in map(trial_rate, g.to_dict("records")) if math.isfinite(u)]
                configs.append((peak_throughput({0: rates}) or 0.0, int(n)))
            meets = [c for c in configs if min_rate is None or c[0] >= min_rate]
            out[name] = max((r / n if self.goal == "cost" else r
                             for r, n in meets or configs), default=0.0)
            whole[name] = max((r for r, _ in configs), default=0.0)
        return out, whole

    def step(self) -> Any:
        """``analysis.search.search_step`` on what was measured: the deadline against each
        machine's whole configurations, a cost search's untried machines free to spread
        their rate per VM over the most nodes swept."""
        from orchestrator.analysis.search import search_step

        assert self.plan.search is not None
        ranked, whole = self.rates()
        most = max((vm.nodes for vm in self.vms.values()), default=1)
        return search_step(self.cands, ranked, self.goal, self.budget,
                           min_rate=self.plan.search.get("min_rate"), whole=whole,
                           scale_out=most if self.goal == "cost" else 1)

    def record(self, step: Any) -> dict[str, Any]:
        from orchestrator.analysis.search import objective_value

        plan, vms, goal, store = self.plan, self.vms, self.goal, self.ctx.store
        assert plan.search is not None
        values, whole = self.rates()
        spent = [vms[n].estimate.cost_usd for n in self.tried]
        info = {
            **plan.search, **step.to_dict(),
            "pick_machine": vms[step.pick].machine.name if step.pick else None,
            "tried": self.tried,
            "measured": {vms[n].machine.name: {
                "peak_units_per_s": v, "fastest_units_per_s": whole[n],
                goal: objective_value(goal, self.cands[list(vms).index(n)].price_per_hour, v)
                if v > 0 else None} for n, v in values.items()},
            "estimated_cost_usd": sum(c for c in spent if c is not None),
            "estimated_grid_cost_usd": plan.grid_cost_usd,
            "trials": len(store.trials_frame()),
            "grid_trials": sum(len(vm.trials) for vm in plan.vms),
        }
        store.update_sweep(search=info)
        return info

    def picked(self, step: Any, info: dict[str, Any]) -> None:
        from orchestrator.analysis.search import describe_confidence

        if not info["pick_machine"]:
            return
        conf = ("" if step.confidence is None
                else f", {describe_confidence(step.confidence)} sure it is the best")
        self.ctx.progress.log(
            f"--search {self.goal}: picked {info['pick_machine']}{conf} of {len(self.cands)} "
            f"candidates after trying {len(self.tried)} ({step.stopped}); estimated cost "
            f"{fmt_usd(info['estimated_cost_usd'])} against "
            f"{fmt_usd(self.plan.grid_cost_usd or 0.0)} for every candidate")


def run_search(ctx: SweepContext, todo: Todo, execute: Callable[[Todo], bool]) -> bool:
    """``--search``: run the candidate machines one at a time, each the one
    ``analysis.search.search_step`` expects to improve most on what was measured.

    Each machine tried is a normal machine of the sweep (``execute`` of that one
    VM: created, its grid or ``--adaptive`` run, torn down). What was tried is
    recorded in sweep.json (``search``) after every machine, so ``--resume`` goes
    on from there and the end of the sweep does not count the untried candidates
    as missing. False when interrupted.
    """
    search = _Search(ctx)
    tried, vms = search.tried, search.vms
    again = [n for n in tried if todo.get(n)]  # --resume: a machine cut short goes on first
    while True:
        if again:
            name = again.pop(0)
        else:
            step = search.step()
            if step.next is None:
                break
            name = step.next
            tried.append(name)
            search.record(step)
            ctx.progress.log(f"--search: trying {vms[name].machine.name} "
                             f"({len(tried)} of at most {search.budget})")
        if todo.get(name) and not execute({name: todo[name]}):
            return False
        if ctx.stop.is_set():
            return False
    search.picked(step, search.record(step))
    return True

