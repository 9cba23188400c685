"""Expands a spec into trials grouped per VM, and estimates time and cost.

One VM per machine type serves all its worker counts and repeats, so the
boot/bootstrap/staging cost is paid once per machine. Every figure here is an
estimate and is labelled so wherever it is shown.
"""

from __future__ import annotations

import re
import secrets
import shlex
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from orchestrator.catalog.machines import STALE_DAYS, MachineType
from orchestrator.formatting import fmt_bytes, fmt_usd
from workloads.protocol import TrialRequest

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.spec.spec import SweepSpec


@dataclass
class TrialPlan:
    trial_id: str  # "<machine>-w<workers>-r<repeat>", unique in a sweep, file-name safe
    machine: str
    workers: int
    repeat: int
    request: TrialRequest  # what the runner is asked (the engine adds the host's paths)
    grid: dict[str, str] = field(default_factory=dict)  # this trial's --grid values
    profiled: bool = False  # an extra --profile trial: stored under profiles/, not in the tables
    nodes: int = 1  # a Ray cluster of this many VMs of the machine (the first n of the VM's)

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)},
                "request": self.request.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialPlan:
        """A sweep.json trial; one written before requests were stored holds ``runner_args``
        (the runner's arguments), read back into the request they stand for."""
        data = dict(data)
        if "request" in data:
            data["request"] = TrialRequest.from_dict(data["request"])
            return cls(**data)
        args = list(data.pop("runner_args"))
        if data.get("profiled") and "--" in args and args[-2:-1] == ["--profile"]:
            # those lists put a --command's --profile after its --: it is the runner's
            cut = args.index("--")
            args = [*args[:cut], *args[-2:], *args[cut:-2]]
        return cls(**data, request=TrialRequest.from_argv(args))


@dataclass
class Estimate:
    boot_s: float
    bootstrap_s: float
    staging_s: float
    trials_s: float
    teardown_s: float
    price_per_hour: float | None  # None: unknown (ssh host without a price)

    @property
    def total_s(self) -> float:
        return self.boot_s + self.bootstrap_s + self.staging_s + self.trials_s + self.teardown_s

    @property
    def cost_usd(self) -> float | None:
        if self.price_per_hour is None:
            return None
        return self.price_per_hour * self.total_s / 3600.0


@dataclass
class VmPlan:
    machine: MachineType
    provider: str
    name: str  # instance name
    region: str | None
    zone: str | None
    image: str | None
    spot: bool
    labels: dict[str, str]
    trials: list[TrialPlan]
    estimate: Estimate
    nodes: int = 1  # VMs of this machine type created at once (max --nodes): one Ray cluster

    def node_name(self, index: int) -> str:
        """The instance name of node ``index`` (node 0 keeps the one-VM name)."""
        return self.name if index == 0 else f"{self.name[:59].rstrip('-')}-n{index}"


@dataclass
class Upload:
    key: str  # object key in the bucket
    size_bytes: int
    predicted: bool = False  # True: the size is the planner's prediction (not generated yet)


@dataclass
class Plan:
    sweep_id: str
    vms: list[VmPlan]
    uploads: list[Upload] = field(default_factory=list)
    # --search: {"objective", "budget", "candidates"}; the VMs are its candidates, of which
    # at most ``budget`` are created, one after the other.
    search: dict[str, Any] | None = None

    @property
    def total_s(self) -> float:
        """Wall time: VMs run concurrently; a search's one after the other (its longest)."""
        if self.search:
            return sum(_largest([vm.estimate.total_s for vm in self.vms], self.search["budget"]))
        return max((vm.estimate.total_s for vm in self.vms), default=0.0)

    @property
    def total_cost_usd(self) -> float | None:
        """The whole plan's cost; a search's at most (its ``budget`` dearest machines)."""
        costs = [vm.estimate.cost_usd for vm in self.vms]
        known = [c for c in costs if c is not None]
        if self.search and known:
            return sum(_largest(known, self.search["budget"]))
        return sum(known) if known else None

    @property
    def grid_cost_usd(self) -> float | None:
        """Every VM of the plan: what an exhaustive sweep of a search's candidates costs."""
        known = [vm.estimate.cost_usd for vm in self.vms if vm.estimate.cost_usd is not None]
        return sum(known) if known else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form stored in sweep.json, with the estimated totals spelled out."""
        out = asdict(self)
        for vm_dict, vm in zip(out["vms"], self.vms, strict=True):
            vm_dict["trials"] = [t.to_dict() for t in vm.trials]
            vm_dict["estimate"]["total_s"] = vm.estimate.total_s
            vm_dict["estimate"]["cost_usd"] = vm.estimate.cost_usd
        out["estimated_total_s"] = self.total_s
        out["estimated_total_cost_usd"] = self.total_cost_usd
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """The inverse of :meth:`to_dict`, used by ``--resume``."""
        vms = []
        for vm in data["vms"]:
            est = {k: vm["estimate"][k] for k in _ESTIMATE_FIELDS}
            vms.append(
                VmPlan(
                    machine=MachineType(**vm["machine"]),
                    provider=vm["provider"],
                    name=vm["name"],
                    region=vm.get("region"),
                    zone=vm.get("zone"),
                    image=vm.get("image"),
                    spot=bool(vm.get("spot")),
                    labels=dict(vm.get("labels") or {}),
                    trials=[TrialPlan.from_dict(t) for t in vm["trials"]],
                    estimate=Estimate(**est),
                    nodes=int(vm.get("nodes", 1)),
                )
            )
        uploads = [Upload(**u) for u in data.get("uploads", [])]
        return cls(sweep_id=data["sweep_id"], vms=vms, uploads=uploads,
                   search=data.get("search"))


def _largest(values: list[float], n: int) -> list[float]:
    return sorted(values, reverse=True)[: max(0, n)]


_ESTIMATE_FIELDS = ("boot_s", "bootstrap_s", "staging_s", "trials_s", "teardown_s",
                    "price_per_hour")

# Rough, deliberately conservative figures behind every estimate (seconds unless
# named otherwise). They are shown as estimates; the store records what happened.
BOOT_S = {"gcp": 45.0, "aws": 40.0, "ssh": 0.0, "local": 0.0}
BOOTSTRAP_S = {"gcp": 60.0, "aws": 60.0, "ssh": 30.0, "local": 0.0}
TEARDOWN_S = {"gcp": 30.0, "aws": 30.0, "ssh": 0.0, "local": 0.0}
STAGING_FIXED_S = 5.0
STAGING_BYTES_PER_S = 100e6  # a VM pulling signed URLs from its own region's bucket
TRIAL_OVERHEAD_S = 4.0  # start the interpreter, load inputs, collect the result files
OVERSUBSCRIBE_FACTOR = 2  # the one point past the vCPU count that shows oversubscription

# Shown in the plan; the provider module owns the real default (VmRequest.image=None).
DEFAULT_IMAGES = {"gcp": "debian-12 (provider default)", "aws": "debian-12 (provider default)"}


def default_workers(vcpus: int) -> list[int]:
    """Powers of two up to the vCPU count, the count itself, and one oversubscribed point.

    Powers of two show the scaling curve cheaply; the vCPU count is where a user
    would run in production; the oversubscribed point shows whether more threads
    than cores still help (they do when the workload waits on I/O).
    """
    if vcpus < 1:
        raise ValueError(f"vcpus must be >= 1, got {vcpus}")
    counts = []
    n = 1
    while n <= vcpus:
        counts.append(n)
        n *= 2
    counts.append(vcpus)
    counts.append(vcpus * OVERSUBSCRIBE_FACTOR)
    return sorted(set(counts))


def new_sweep_id() -> str:
    """Sortable by time, unique across users, and valid as a GCP label value and file name."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def slug(text: str) -> str:
    """Lower-case ``[a-z0-9-]``: what GCE instance names and label values accept."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def trial_id(machine: str, workers: int, repeat: int,
             grid: dict[str, str] | None = None, nodes: int = 1) -> str:
    """``<machine>[-<grid>][-n<nodes>]-w<workers>-r<repeat>``; one node adds nothing, so the
    ids of one-VM sweeps (and their --resume) are as before."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", machine)
    point = "".join(f"-{k}{v}" for k, v in (grid or {}).items())
    if nodes > 1:
        point += f"-n{nodes}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{safe}{point}-w{workers}-r{repeat}")


def grid_points(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination of the --grid values, in the order given ([{}] without a grid)."""
    import itertools

    names = list(grid)
    return [dict(zip(names, values, strict=True))
            for values in itertools.product(*(grid[n] for n in names))]


def trial_id_clash(grid: dict[str, list[str]], nodes: list[int] | None = None
                   ) -> tuple[str, str, str] | None:
    """Two grid points (at one of the node counts) whose trial ids are the same once
    slugged (``x=a b`` and ``x=a-b`` both give ``-xa-b-``): (first, second, the id), or
    None. A trial id names the trial's row, files and resume state, so the second would
    overwrite the first; the spec is refused before anything runs. Checked on the ids
    themselves, as ``trial_id`` makes them, so no slugging rule can slip through."""
    counts = sorted(set(nodes or [1]))
    seen: dict[str, str] = {}
    for point in grid_points(grid):
        for n in counts:
            tid = trial_id("m", 1, 0, point, n)
            where = " ".join(f"{k}={v!r}" for k, v in point.items())
            if len(counts) > 1:
                where += f" at --nodes {n}"
            if tid in seen:
                return seen[tid], where, tid[len("m"):-len("-w1-r0")].strip("-")
            seen[tid] = where
    return None


def profiled_trial_id(machine: str, workers: int, kind: str,
                      grid: dict[str, str] | None = None) -> str:
    """``<machine>[-<grid>]-w<workers>-prof-<kind>``: never equal to a throughput trial's id
    (without a grid, as before, so older stores resume)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", machine)
    point = "".join(f"-{k}{v}" for k, v in (grid or {}).items())
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{safe}{point}-w{workers}-prof-{kind}")


def vm_name(sweep_id: str, machine: str) -> str:
    return f"cp-{slug(sweep_id)}-{slug(machine)}"[:63].rstrip("-")


def trial_request(spec: SweepSpec, workers: int, trial: str = "", repeat: int = 0,
                  grid: dict[str, str] | None = None, nodes: int = 1,
                  profile: str | None = None) -> TrialRequest:
    """What ``python -m workloads.run`` is asked for one trial, less what the host decides.

    ``inputs``, ``--chdir``, the Ray cluster's address, ``--put`` and ``--out``
    are not here: where the inputs and the job's copy land differs per host, so
    the engine fills them in when it runs the trial. A ``--command`` job gets its
    placeholder values as ``--var`` (the runner fills them in on the host, where
    ``{vcpus}`` is known); a workload gets the grid values as parameters.
    ``profile``: the same trial with that profiler attached.
    """
    grid = grid or {}
    if spec.command is not None:
        from orchestrator.spec.job import check_command

        return TrialRequest(
            command=tuple(check_command(spec.command, spec.shell, spec.grid)), job=True,
            shell=spec.shell, vars={"trial": trial, "repeat": str(repeat), **grid},
            workers=workers, sample_hz=spec.sample_hz, ray_nodes=nodes,
            duration_s=spec.stop_after_s, profile=profile,
        )
    params = {k: str(v) for k, v in sorted({**spec.workload_params, **grid}.items())
              if k != "inputs"}  # a path on the laptop; the engine passes the host's copy
    return TrialRequest(workload=str(spec.workload), params=params, workers=workers,
                        duration_s=spec.duration_s, sample_hz=spec.sample_hz,
                        warmup_s=spec.warmup_s, ray_nodes=nodes, profile=profile)


def estimate_vm(
    provider: str,
    price_per_hour: float | None,
    n_trials: int,
    duration_s: float,
    input_bytes: int,
) -> Estimate:
    staging = STAGING_FIXED_S + input_bytes / STAGING_BYTES_PER_S if input_bytes else 0.0
    return Estimate(
        boot_s=BOOT_S.get(provider, 0.0),
        bootstrap_s=BOOTSTRAP_S.get(provider, 0.0),
        staging_s=staging,
        trials_s=n_trials * (duration_s + TRIAL_OVERHEAD_S),
        teardown_s=TEARDOWN_S.get(provider, 0.0),
        price_per_hour=price_per_hour,
    )


def default_zone(provider: str, region: str | None) -> str | None:
    if not region:
        return None
    if provider == "gcp":
        return f"{region}-a"
    if provider == "aws":
        return f"{region}a"
    return None


def make_plan(
    spec: SweepSpec,
    sweep_id: str,
    machines: list[MachineType],
    *,
    input_bytes: int = 0,
    labels: dict[str, str] | None = None,
) -> Plan:
    """One VM per machine (max(--nodes) VMs when scaling out), each running every
    node count × worker count × repeat of the spec.

    ``input_bytes`` (the staged inputs' size, when known) feeds the staging
    estimate; ``labels`` are the sweep's common labels (the engine adds creator
    and expiry, which depend on when it runs).
    """
    from orchestrator.providers.base import LABEL_SWEEP

    vms: list[VmPlan] = []
    # A host whose size is known only once connected (an SSH host beside catalog machines)
    # runs the catalog machines' default counts: all are compared at the same counts.
    sized = sorted({w for m in machines if m.vcpus >= 1 for w in default_workers(m.vcpus)})
    for machine in machines:
        provider = spec.provider or machine.provider
        workers = (list(spec.workers) if spec.workers
                   else default_workers(machine.vcpus) if machine.vcpus >= 1 or not sized
                   else sized)
        node_counts = sorted(set(spec.nodes or [1]))
        trials = _trials(spec, machine.name, workers, node_counts)
        # --region/--zone are the cloud's; in a sweep across providers not an SSH host's
        where = spec.provider is not None or provider in ("gcp", "aws")
        region = (spec.region if where else None) or machine.region or None
        vms.append(
            VmPlan(
                machine=machine,
                provider=provider,
                name=vm_name(sweep_id, machine.name),
                region=region,
                zone=(spec.zone if where else None) or default_zone(provider, region),
                image=DEFAULT_IMAGES.get(provider),
                spot=spec.spot,
                labels={LABEL_SWEEP: slug(sweep_id), **(labels or {})},
                trials=trials,
                nodes=max(node_counts),
                estimate=estimate_vm(
                    provider,
                    _times(machine.price(spec.spot), max(node_counts)),  # every node bills
                    len(trials),
                    spec.duration_s + spec.warmup_s,  # the warm-up is paid for too
                    input_bytes,
                ),
            )
        )
    return Plan(sweep_id=sweep_id, vms=vms, search=_search(spec, len(vms)))


def _trials(spec: SweepSpec, machine: str, workers: list[int],
            node_counts: list[int]) -> list[TrialPlan]:
    """Every trial one machine runs: each repeat × grid point × node count × worker count,
    then with --profile one profiled trial per grid point and worker count."""
    trials = [
        TrialPlan(
            trial_id=(tid := trial_id(machine, w, r, point, n)),
            machine=machine,
            workers=w,
            repeat=r,
            request=trial_request(spec, w, tid, r, point, n),
            grid=point,
            nodes=n,
        )
        for r in range(spec.repeats)
        for point in grid_points(spec.grid)
        for n in node_counts
        for w in workers
    ]
    if spec.profile:  # extra trials: a profiler's overhead never reaches the tables
        # The same trial as repeat 0 of each grid point (command, grid values, workdir,
        # setup), with the profiler attached; on one node, as before.
        trials += [
            TrialPlan(
                trial_id=(tid := profiled_trial_id(machine, w, spec.profile, point)),
                machine=machine, workers=w, repeat=0, profiled=True, grid=point,
                request=trial_request(spec, w, tid, 0, point, 1, profile=spec.profile),
            )
            for point in grid_points(spec.grid)
            for w in workers
        ]  # fmt: skip
    return trials


def _search(spec: SweepSpec, candidates: int) -> dict[str, Any] | None:
    """--search's objective and budget (machine types to try) over the plan's VMs."""
    if not spec.search:
        return None
    from orchestrator.analysis.search import default_budget

    budget = min(candidates, spec.budget or default_budget(candidates))
    search: dict[str, Any] = {"objective": spec.search, "budget": budget,
                              "candidates": candidates}
    if spec.deadline_s is not None and spec.total is not None:  # N units within T
        search.update(deadline_s=spec.deadline_s, total=spec.total,
                      min_rate=spec.total / spec.deadline_s)
    return search


def _times(price: float | None, n: int) -> float | None:
    return None if price is None else price * n


def _fmt_s(seconds: float) -> str:
    seconds = round(seconds)
    minutes, sec = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{sec:02d}s" if hours else f"{minutes}m{sec:02d}s"


def _cost(cost: float | None) -> str:
    return "unknown (no price)" if cost is None else fmt_usd(cost)


def render_plan(plan: Plan, console: Console, dry_run: bool, *,
                done: set[str] | frozenset[str] = frozenset()) -> None:
    """Print every cloud action the plan stands for, with its estimated time and cost.

    One short block per VM rather than a wide table: the plan must stay readable
    in an 80-column terminal and in CI logs. Identical trial commands (repeats)
    are printed once with a count; ``done`` (a resumed sweep's finished trial ids)
    leaves only what remains to run.
    """
    head = ("Plan — dry run: no cloud call is made; the same pipeline runs on this machine"
            if dry_run else "Plan")
    console.print(f"[bold]{head}[/bold]\nsweep {plan.sweep_id}", highlight=False)
    total = sum(len(vm.trials) for vm in plan.vms)
    left = sum(1 for vm in plan.vms for t in vm.trials if t.trial_id not in done)
    if done:
        console.print(f"[bold]Resumed:[/bold] {total - left} of {total} trials already done, "
                      f"{left} remain", highlight=False)
    estimates = []  # of what remains: the whole plan unless resumed
    for i, vm in enumerate(plan.vms, 1):
        estimate = _render_vm(f"{i}/{len(plan.vms)}", vm, console, dry_run, done)
        if estimate is not None:
            estimates.append(estimate)
    if plan.uploads:
        _render_uploads(plan.uploads, console)
    stale = sorted({vm.machine.name for vm in plan.vms
                    if vm.estimate.price_per_hour is not None and vm.machine.stale()})
    if stale:
        console.print(f"[yellow]warning:[/yellow] the prices of {', '.join(stale)} are over "
                      f"{STALE_DAYS} days old: run `cloudprof catalog refresh` for current "
                      "ones", highlight=False)
    _render_commands(plan, console, done, left)
    if _single_repeat(plan):
        console.print(
            "[yellow]note:[/yellow] one repeat per worker count: no spread is measured, and on "
            "replayed surfaces the peak lands within ±10 % in 78 % of cases against 95 % with "
            "the default 3 repeats or 98 % with --adaptive (benchmarks/bench_model.py); "
            "see \"Picking repeats and duration\" in the docs.", highlight=False)
    if plan.search:
        _render_search(plan, console)
        return
    costs = [e.cost_usd for e in estimates if e.cost_usd is not None]
    what = "of what remains " if done else ""
    console.print(
        f"[bold]Estimated[/bold] {what}wall time "
        f"{_fmt_s(max((e.total_s for e in estimates), default=0.0))} (VMs run concurrently), "
        f"estimated cost {_cost(sum(costs) if costs else None)} — estimates, not "
        "measurements.",
        highlight=False,
    )


def _render_vm(number: str, vm: VmPlan, console: Console, dry_run: bool,
               done: set[str] | frozenset[str]) -> Estimate | None:
    """One VM's (or host's) block: what is created, its trials, its estimate of what
    remains to run (returned; None when all its trials are done and it is not created)."""
    from rich.markup import escape

    m = vm.machine
    remaining = sum(1 for t in vm.trials if t.trial_id not in done)
    if remaining == 0:
        console.print(f"[bold]VM {number}:[/bold] {vm.provider} {m.name}: all "
                      f"{len(vm.trials)} trials done, not created", highlight=False)
        return None
    e = replace(vm.estimate, trials_s=vm.estimate.trials_s * remaining / len(vm.trials))
    verb = "would be created" if dry_run else "to create"
    price = "no catalog price" if e.price_per_hour is None else (
        f"${e.price_per_hour:.4f}/h {'spot' if vm.spot else 'on-demand'} "
        f"({m.price_label()})")
    labels = ", ".join(f"{k}={v}" for k, v in sorted(vm.labels.items()))
    trials = (f"{remaining} of {len(vm.trials)} trials remain" if done
              else f"{len(vm.trials)} trials")
    if vm.nodes > 1:
        counts = ",".join(str(n) for n in sorted({t.nodes for t in vm.trials}))
        trials += (f" on a Ray cluster of {vm.nodes} × {m.name} (nodes {counts}; "
                   f"priced for {vm.nodes} VMs)")
    if vm.provider in EXISTING_HOSTS:
        head = (f"[bold]Host {number} "
                f"{'would be used' if dry_run else 'to use'}:[/bold] {vm.provider} "
                f"{m.name} ({_fmt_size(m)}), already running: nothing is created or "
                f"deleted · {price}\n")
    else:
        head = (f"[bold]VM {number} {verb}:[/bold] {vm.provider} {m.name} "
                f"({_fmt_size(m)}) named {vm.name}"
                + (f" .. {vm.node_name(vm.nodes - 1)} ({vm.nodes} VMs)" if vm.nodes > 1
                   else "") + "\n"
                f"  zone {vm.zone or vm.region or '-'} · image {vm.image or '-'} · "
                f"spot {'yes' if vm.spot else 'no'} · {price}\n"
                f"  labels {escape(labels)} + creator, created, expires (set at "
                "creation)\n")
    console.print(
        f"{head}"
        f"  {trials} · estimated {_fmt_s(e.total_s)} = boot "
        f"{_fmt_s(e.boot_s)} + bootstrap {_fmt_s(e.bootstrap_s)} + staging "
        f"{_fmt_s(e.staging_s)} + trials {_fmt_s(e.trials_s)} + teardown "
        f"{_fmt_s(e.teardown_s)} · estimated cost {_cost(e.cost_usd)}",
        highlight=False,
    )
    return e


def _render_commands(plan: Plan, console: Console, done: set[str] | frozenset[str],
                     left: int) -> None:
    """The runner's command line of every trial that remains, each command once with the
    number of its repeats."""
    from rich.markup import escape

    commands: dict[str, int] = {}  # in plan order; the repeats of one command are counted
    for vm in plan.vms:
        for t in vm.trials:
            if t.trial_id not in done:
                line = shlex.join(t.request.argv())
                commands[line] = commands.get(line, 0) + 1
    console.print(f"[bold]Trial commands[/bold] ({left} trial{'' if left == 1 else 's'}; "
                  "each also gets --param inputs=<staged dir> and --chdir <job copy> "
                  "where staged, and --out <trial dir>):", highlight=False)
    for line, count in commands.items():
        times = f"  [dim]× {count} repeats[/dim]" if count > 1 else ""
        console.print(f"  python -m workloads.run {escape(line)}{times}",
                      soft_wrap=True, highlight=False)


def _single_repeat(plan: Plan) -> bool:
    """True when every worker count of the plan runs once (so nothing measures the spread)."""
    runs = [t.repeat for vm in plan.vms for t in vm.trials if not t.profiled]
    return bool(runs) and max(runs) == 0


def _render_search(plan: Plan, console: Console) -> None:
    """A search's bounds: how many of the candidates at most, and what that can cost."""
    from orchestrator.analysis.search import EI_STOP

    assert plan.search is not None
    s = plan.search
    goal = "lowest cost per unit" if s["objective"] == "cost" else "highest throughput"
    console.print(
        f"[bold]Search[/bold] (--search {s['objective']}: the {goal}): at most {s['budget']} "
        f"of these {s['candidates']} candidate machines are created, one after the other, each "
        "chosen from what the ones before measured; it stops early when no untried machine "
        f"is expected to gain {EI_STOP:.0%}.", highlight=False)
    console.print(
        f"[bold]Estimated[/bold] wall time at most {_fmt_s(plan.total_s)}, estimated cost at "
        f"most {_cost(plan.total_cost_usd)} (the {s['budget']} dearest candidates) against "
        f"{_cost(plan.grid_cost_usd)} for all {s['candidates']} (the exhaustive grid) — "
        "estimates, not measurements.", highlight=False)


EXISTING_HOSTS = {"ssh"}  # providers whose machines exist already: the plan creates none
UPLOADS_SHOWN = 6  # more bucket objects than this: the first and last ones, and the rest's sum


def _render_uploads(uploads: list[Upload], console: Console) -> None:
    """Every object, or the first and last ones and what the others add up to (count, bytes)."""
    total = sum(u.size_bytes for u in uploads)
    note = " predicted" if any(u.predicted for u in uploads) else ""
    console.print(f"[bold]Bucket objects to upload[/bold] ({len(uploads)}, {fmt_bytes(total)}"
                  f"{note}; skipped when already there):", highlight=False)
    many = len(uploads) > UPLOADS_SHOWN
    head, tail = (uploads[:3], uploads[-2:]) if many else (uploads, [])
    for up in head:
        console.print(f"  {up.key}  [dim]{_fmt_upload(up)}[/dim]", highlight=False)
    if many:
        rest = uploads[3:-2]
        console.print(f"  ... {len(rest)} more objects, "
                      f"{fmt_bytes(sum(u.size_bytes for u in rest))}{note}", highlight=False)
    for up in tail:
        console.print(f"  {up.key}  [dim]{_fmt_upload(up)}[/dim]", highlight=False)


def _fmt_upload(up: Upload) -> str:
    size = fmt_bytes(up.size_bytes)
    return f"{size} predicted" if up.predicted else size


def _fmt_size(m: MachineType) -> str:
    """vCPUs and memory; an SSH host outside the catalog has its size read when connected."""
    if m.vcpus < 1:
        return "size read from the host when connected"
    return f"{m.vcpus} vCPUs, {m.memory_gib:g} GiB"
