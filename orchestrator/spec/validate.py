"""Cross-option checks of a SweepSpec, all before anything is paid for.

Each flag's own value was checked by its converter (``spec/values.py``); what
is left needs several options at once or a look at the world that costs
nothing: the catalog, the hosts file and its keys, the job's directory, the
output directory, the trial count.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.catalog.machines import check_name, load_catalog, lookup, suggest
from orchestrator.errors import UsageError
from orchestrator.spec.spec import SweepSpec
from orchestrator.spec.values import (
    MAX_GRID_POINTS,
    MAX_TRIALS,
    SECRET_KEY_RE,
    SECRET_VALUE_RE,
    check_output_dir,
)


def _region_of_zone(zone: str, provider: str) -> str:
    if provider == "aws":  # us-east-1a -> us-east-1
        return zone.rstrip("abcdefghijklmnopqrstuvwxyz")
    return zone.rsplit("-", 1)[0]  # us-central1-a -> us-central1


CLOUDS = ("gcp", "aws")


def machine_owners(spec: SweepSpec) -> dict[str, list[str]]:
    """The machines of a sweep without ``--provider``, by provider, in the order given.

    An SSH host's (or hosts-file group's) name is the ssh provider's; any other
    name is its catalog row's provider. When the hosts are given but no
    ``--machine`` names one of them, every host joins (``ssh`` maps to []), as
    in a sweep of the hosts alone.
    """
    from orchestrator.errors import UnknownMachineError

    ssh_machines: list[str] = []  # what --machine selects from
    ssh_names: list[str] = []  # and the hosts of groups, which name their group in errors
    if spec.hosts or spec.hosts_file:
        from orchestrator.providers.base import ProviderOptions
        from orchestrator.providers.ssh import SshProvider

        _existing_file(spec.hosts_file, "--hosts")
        provider = SshProvider(ProviderOptions(hosts_file=spec.hosts_file,
                                               hosts=list(spec.hosts)))
        ssh_machines = provider.machines()
        ssh_names = ssh_machines + [n for n in provider.hosts if n not in ssh_machines]
    owners: dict[str, list[str]] = {}
    for name in spec.machines:
        if name in ssh_names:
            owner = "ssh"
        else:
            try:
                owner = lookup(name).provider
            except UnknownMachineError:
                if not ssh_names:
                    raise
                raise UsageError(f"--machine {name!r} is not one of the ssh hosts: "
                                 f"{', '.join(ssh_machines)} "
                                 "(nor a machine type in the catalog)") from None
        owners.setdefault(owner, []).append(name)
    if ssh_names and "ssh" not in owners:
        owners["ssh"] = []
    return owners


def resolve_provider(spec: SweepSpec) -> str | None:
    """The spec's provider, defaulting to the machines' provider in the catalog (ssh for
    the --host/--hosts names); None when the machines span several providers."""
    if spec.provider is not None:
        return spec.provider
    owners = machine_owners(spec)
    return next(iter(owners)) if len(owners) == 1 else None


def machine_providers(spec: SweepSpec) -> dict[str, str]:
    """Each machine of a validated spec -> the provider it runs on."""
    if spec.provider is not None:
        return dict.fromkeys(spec.machines, spec.provider)
    owners = machine_owners(spec)
    out = {name: provider for provider, names in owners.items() for name in names}
    return {name: out.get(name, "ssh") for name in spec.machines}  # the hosts named by none


def _check_location(spec: SweepSpec, provider: str) -> None:
    """--zone sets --region, and must lie in it (``provider``: the sweep's one cloud)."""
    if spec.zone and not spec.region:
        spec.region = _region_of_zone(spec.zone, provider)
    if spec.zone and spec.region and not spec.zone.startswith(spec.region):
        raise UsageError(f"--zone {spec.zone} is not in --region {spec.region}")


def _check_mixed(spec: SweepSpec) -> None:
    """A sweep whose machines span providers (GCP, AWS, the SSH hosts): one plan.

    ``--region``/``--zone`` name one cloud's location, so they apply only when one cloud
    is in the sweep (beside the SSH hosts); with both clouds each machine runs in its
    catalog's default region, which the plan shows."""
    owners = machine_owners(spec)
    clouds = [p for p in CLOUDS if p in owners]
    if len(clouds) > 1 and (spec.region or spec.zone):
        flag = "--region" if spec.region else "--zone"
        raise UsageError(f"{flag} names one cloud's location and this sweep spans "
                         f"{' and '.join(clouds)}: drop it (each machine runs in its "
                         "catalog's default region, shown by --plan) or run one sweep per "
                         "cloud")
    if clouds and len(clouds) == 1:
        _check_location(spec, clouds[0])
    for provider in clouds:
        for name in owners[provider]:
            _check_cloud_machine(name, spec, provider)
    machines = [n for p in clouds for n in owners[p]]
    if "ssh" in owners:
        if spec.spot:
            raise UsageError("--spot applies to gcp and aws, not the ssh hosts: drop --spot "
                             "or run the hosts in a sweep of their own")
        machines += _check_ssh_machines(spec, owners["ssh"])
    spec.machines = [n for n in spec.machines if n in machines] + [
        n for n in machines if n not in spec.machines]


def _check_cloud_machine(name: str, spec: SweepSpec, provider: str | None = None) -> None:
    provider = provider or spec.provider
    assert provider is not None
    known = [m for m in load_catalog() if m.name == name]
    if known and all(m.provider != provider for m in known):
        raise UsageError(
            f"{name!r} is an {known[0].provider} machine type, not {provider}; "
            f"drop --provider or use --provider {known[0].provider}"
        )
    machine = lookup(name, provider, spec.region)
    if spec.spot and machine.price_spot is None:
        raise UsageError(f"{name!r} has no spot price in the catalog; drop --spot")


def _existing_file(path: Path | None, flag: str) -> None:
    if path is not None and not path.is_file():
        raise UsageError(f"{flag}: no such file {str(path)!r}")


def _check_workload_params(spec: SweepSpec) -> None:
    """Refuse secrets, and let a registered workload reject its parameters now.

    Constructing a workload only parses its parameters (``prepare`` does the
    work). A user's ``module:Class`` must be findable here, with the class
    defined in it; its code is not run (it may need what only the VM has).
    """
    from workloads.base import REGISTRY, WorkloadInputError, load_workload
    from workloads.limits import check_workload_target

    for key, value in spec.workload_params.items():
        if SECRET_KEY_RE.search(key) or SECRET_VALUE_RE.search(str(value)):
            raise UsageError(
                f"workload parameter {key!r} looks like a credential; parameters are recorded "
                "in the results store and on VM command lines, so cloudprof refuses them"
            )

    if spec.workload not in REGISTRY:
        try:
            check_workload_target(spec.workload, [spec.workdir] if spec.workdir else ())
        except ValueError as exc:
            raise UsageError(f"--workload {spec.workload}: {exc}") from None
        _check_installed_workload(spec)
        return
    try:
        load_workload(spec.workload)(**{k: str(v) for k, v in spec.workload_params.items()})
    except WorkloadInputError as exc:
        raise UsageError(str(exc)) from None


def _check_installed_workload(spec: SweepSpec) -> None:
    """A ``module:Class`` must name a ``workloads.base.Workload`` subclass: ``os:system`` is
    refused here, not by the runner on a VM that was paid for.

    A module of the standard library or of cloudprof's ``workloads`` (or one already
    imported) is imported and the class checked. A user's module is not run here (it
    may need what only the VM has): its source is read, and a function, or a class with
    no base at all, is refused; anything else only the import on the VM can tell.
    """
    import ast
    import importlib

    from workloads.base import Workload
    from workloads.limits import _find_module

    module, _, attr = spec.workload.partition(":")
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top == "workloads" or module in sys.modules:
        try:
            found = getattr(importlib.import_module(module), attr, None)
        except Exception:  # the VM's Python may differ; its runner says so
            return
        if not (isinstance(found, type) and issubclass(found, Workload)):
            raise UsageError(f"--workload {spec.workload}: {attr!r} is not a subclass of "
                             "workloads.base.Workload")
        return
    found_spec = _find_module(module, [str(spec.workdir)] if spec.workdir else [])
    origin = found_spec.origin if found_spec is not None else None
    if not origin or not origin.endswith(".py"):
        return
    try:
        tree = ast.parse(Path(origin).read_bytes(), filename=origin)
    except (OSError, SyntaxError, ValueError):
        return  # check_workload_target has said so already
    for node in tree.body:
        plain_class = isinstance(node, ast.ClassDef) and not node.bases and not node.keywords
        function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if getattr(node, "name", None) == attr and (plain_class or function):
            what = "a function" if function else "a class with no base"
            raise UsageError(f"--workload {spec.workload}: {attr!r} is {what} in {origin}, "
                             "not a subclass of workloads.base.Workload")


def _check_job(spec: SweepSpec) -> None:
    """--workdir, --setup, --command, --shell and --grid, checked before anything is paid for."""
    if spec.workdir is not None and not spec.workdir.is_dir():
        raise UsageError(f"--workdir: {str(spec.workdir)!r} is not a directory")
    if spec.setup is not None and spec.workdir is None:
        raise UsageError("--setup runs in the job's copy: give --workdir too")
    if spec.shell and spec.command is None:
        raise UsageError("--shell applies to --command")
    if spec.command is not None:
        from orchestrator.spec.job import check_command

        check_command(spec.command, spec.shell, spec.grid)
        _check_grid_used(spec)
        for key, value in spec.grid.items():
            if SECRET_VALUE_RE.search(key) or any(SECRET_VALUE_RE.search(v) for v in value):
                raise UsageError(f"--grid {key}: a value looks like a credential")
    clash = sorted(set(spec.grid) & set(spec.workload_params))
    if clash and spec.command is None:
        raise UsageError(f"--grid {clash[0]} is also given as a workload parameter; give it once")


GRID_SCAN_BYTES = 64 * 2**20  # how much of --workdir is read looking for $CLOUDPROF_<NAME>


def _check_grid_used(spec: SweepSpec) -> None:
    """Each --grid name must reach the job: as ``{name}`` in --command or --setup, or as
    ``CLOUDPROF_<NAME>`` (the job's environment) in the command or the job's files; else
    every value runs the same trial and the sweep reports differences that are noise.
    A workdir too big to read through is given the benefit of the doubt."""
    from workloads.job import placeholders

    used = set(placeholders(spec.command or "")) | set(placeholders(spec.setup or ""))
    unused = [name for name in spec.grid if name not in used
              and f"CLOUDPROF_{name.upper()}" not in (spec.command or "")]
    if not unused or (spec.workdir is not None and _mentioned(spec.workdir, unused)):
        return
    name = unused[0]
    raise UsageError(f"--grid {name}: the command never uses it ({{{name}}} or "
                     f"$CLOUDPROF_{name.upper()}), so every {name} would run the same trial")


def _mentioned(root: Path, names: list[str]) -> bool:
    """Whether some file under ``root`` names ``CLOUDPROF_<NAME>`` of every one of
    ``names`` (or the files are too many to tell)."""
    wanted = {f"CLOUDPROF_{n.upper()}".encode() for n in names}
    budget = GRID_SCAN_BYTES
    for path in sorted(root.rglob("*")):
        try:
            if not path.is_file() or path.is_symlink():
                continue
            data = path.read_bytes()[:budget]
        except OSError:
            continue
        budget -= len(data)
        wanted = {w for w in wanted if w not in data}
        if not wanted or budget <= 0:
            return True
    return False


def _check_trial_count(spec: SweepSpec) -> None:
    """At most MAX_GRID_POINTS grid points and MAX_TRIALS trials, counted, not listed."""
    points = math.prod(len(values) for values in spec.grid.values())
    if points > MAX_GRID_POINTS:
        sizes = " × ".join(f"{len(v)} {k}" for k, v in spec.grid.items())
        raise UsageError(f"--grid: {sizes} is {points:,} grid points, above the "
                         f"{MAX_GRID_POINTS:,} a sweep may have (each is a curve of its own)")
    machines = max(len(spec.machines or []), 1)
    workers = max(len(spec.workers or []), 1)  # none given: the machine's default, counted 1
    nodes = max(len(spec.nodes or []), 1)
    trials = machines * points * nodes * workers * spec.repeats
    if trials > MAX_TRIALS:
        raise UsageError(
            f"{machines} machine(s) × {points:,} grid point(s) × {nodes} node "
            f"count(s) × {workers} worker count(s) × {spec.repeats} repeat(s) is {trials:,} "
            f"trials, above the {MAX_TRIALS:,} a sweep may run (each is a run on a VM); "
            "split it into several sweeps")


def _check_trial_ids(spec: SweepSpec) -> None:
    """Every trial gets an id of its own: two --grid values that slug to one id would make
    one trial silently overwrite the other's row and files."""
    if not spec.grid:
        return
    from orchestrator.plan.planner import trial_id_clash

    clash = trial_id_clash(spec.grid, spec.nodes)
    if clash is not None:
        first, second, tid = clash
        raise UsageError(f"--grid: {first} and {second} give the same trial id "
                         f"(<machine>-{tid}-w<workers>-r<repeat>), "
                         "which names each trial's row and files; make the values differ "
                         "in letters, digits, '.', '_' or '-'")


def _check_ssh_machines(spec: SweepSpec, names: list[str] | None = None) -> list[str]:
    """The ssh machines the sweep runs on, of ``names`` (default --machine; all of the
    hosts' when it names none): hosts, and groups of hosts (hosts file ``machine``) with
    enough hosts for --nodes."""
    from orchestrator.providers.base import ProviderOptions
    from orchestrator.providers.ssh import SshProvider

    provider = SshProvider(ProviderOptions(hosts_file=spec.hosts_file, hosts=list(spec.hosts)))
    known = provider.machines()
    names = spec.machines if names is None else names
    for name in names:
        if name not in known:
            if name in provider.hosts:
                provider.machine_hosts(name)  # a group's node: the error names its machine
            raise UsageError(f"--machine {name!r} is not one of the ssh hosts: "
                             f"{', '.join(known)}")
    machines = names or known
    for name in machines:
        provider.check_node_count(name, max(spec.nodes, default=1))
    _check_host_keys(spec, [h for m in machines for h in provider.machine_hosts(m)])
    return machines


def _check_host_keys(spec: SweepSpec, hosts: list[Any]) -> None:
    """Each host's own ``key_file`` readable, a private key, not encrypted: found now, not
    when the first trial logs in."""
    from orchestrator.providers.remote import public_line

    for host in hosts:
        if host.key_file is None:
            continue
        try:
            public_line(Path(host.key_file))
        except UsageError as exc:
            where = f"hosts file {spec.hosts_file}, " if spec.hosts_file else ""
            raise UsageError(f"{where}host {host.name}: {exc}") from None


def search_candidates(spec: SweepSpec) -> list[str]:
    """``--search``'s machine types: the --machine names plus the catalog rows matching
    --family, --vcpus and --max-price (provider and region as given), once each."""
    from orchestrator.catalog.machines import filter_catalog, sort_catalog

    names = list(spec.machines)
    if spec.family or spec.vcpus or spec.max_price is not None:
        rows = load_catalog(spec.provider if spec.provider in ("gcp", "aws") else None)
        low, high = spec.vcpus or (None, None)
        for family in spec.family or [None]:
            if family is not None and not filter_catalog(rows, family=family):
                close = suggest(family, {m.family for m in rows}
                                | {m.name.rsplit("-", 1)[0] for m in rows})
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise UsageError(f"--family: {family!r} is not in the catalog{hint}")
            found = filter_catalog(rows, family=family, region=spec.region, min_vcpus=low,
                                   max_vcpus=high, max_price=spec.max_price, spot=spec.spot)
            names += [m.name for m in sort_catalog(found, "vcpus", spot=spec.spot)]
    return list(dict.fromkeys(names))


def _check_search(spec: SweepSpec) -> None:
    """--search and its candidate filters, resolved into ``spec.machines`` before the plan."""
    filters = [flag for flag, given in (("--family", spec.family), ("--vcpus", spec.vcpus),
                                        ("--max-price", spec.max_price is not None),
                                        ("--budget", spec.budget is not None)) if given]
    if spec.deadline_s is not None and (spec.search is None or spec.total is None):
        raise UsageError("--deadline is --search's constraint on the whole job: give --search "
                         "and --total N (the job's units, or runs for a fixed-work job)")
    if spec.search is None:
        if filters:
            raise UsageError(f"{filters[0]} selects the machines --search tries: add "
                             "--search cost|throughput (or name machines with --machine)")
        return
    if spec.provider in ("ssh", "local") or spec.hosts or spec.hosts_file:
        raise UsageError("--search picks machine types from the catalog (gcp or aws; with "
                         "--dry-run it runs on this machine): drop --provider ssh/local")
    if spec.grid:
        raise UsageError("--search compares machines on one workload: drop --grid")
    spec.machines = search_candidates(spec)
    if len(spec.machines) < 2:
        raise UsageError(f"--search needs at least 2 candidate machines, found "
                         f"{len(spec.machines)}: widen --family/--vcpus/--max-price or add "
                         "--machine (see `cloudprof catalog`)")


def _check_nodes(spec: SweepSpec) -> None:
    """--nodes above 1 needs Ray here (refused before anything is paid for) and trials
    that a Ray cluster can run: the adaptive loop and profiled trials are one-VM."""
    if max(spec.nodes, default=1) <= 1:
        return
    if spec.adaptive:
        raise UsageError("--adaptive searches worker counts on one VM: drop --nodes (or "
                         "--adaptive)")
    if spec.profile:
        raise UsageError("--profile attributes one process: drop --nodes (or --profile)")
    from orchestrator.ray_support import require_ray

    require_ray(max(spec.nodes))


def _check_limits(spec: SweepSpec) -> None:
    """--prove-limit/--find-limit put a command's process tree under a cgroup limit: a
    workload in the runner's own process would take the runner down with it."""
    flag = "--find-limit" if spec.find_limit else "--prove-limit" if spec.prove_limit else None
    if flag is None:
        return
    if spec.command is None:
        raise UsageError(f"{flag} runs a --command job under a memory limit: add --command")
    if max(spec.nodes, default=1) > 1:
        raise UsageError(f"{flag} limits one host's process tree: drop --nodes")
    if spec.adaptive or spec.search:
        raise UsageError(f"{flag} proves a plain sweep's memory request: drop --adaptive/--search")


def validate_spec(given: SweepSpec) -> SweepSpec:
    """Cross-option checks; a new spec with the provider, the region (from the zone) and the
    machines (--search's candidates, the ssh hosts) filled in. ``given`` is left as it was:
    a caller may validate the same spec twice, or keep what the user asked for."""
    from orchestrator.spec.environment import check_environment

    spec = replace(given, machines=list(given.machines), hosts=list(given.hosts),
                   family=list(given.family), grid=dict(given.grid),
                   workload_params=dict(given.workload_params))
    check_environment()
    _check_search(spec)
    for name in spec.machines:
        check_name(name)
    if len(set(spec.machines)) != len(spec.machines):
        raise UsageError("a machine is given twice; list each machine once")
    if not spec.machines and spec.provider != "ssh" and not (spec.hosts or spec.hosts_file):
        raise UsageError("no machine given: use --machine NAME (see `cloudprof catalog`)")
    spec.provider = resolve_provider(spec)
    if spec.provider is None:
        _check_mixed(spec)
    elif spec.provider in CLOUDS:
        _check_location(spec, spec.provider)
        for name in spec.machines:
            _check_cloud_machine(name, spec)
        if spec.hosts or spec.hosts_file:
            raise UsageError(f"--host/--hosts are for --provider ssh, not {spec.provider}")
    else:
        if spec.spot:
            raise UsageError(f"--spot applies to gcp and aws, not --provider {spec.provider}")
        if spec.provider == "ssh":
            if not (spec.hosts or spec.hosts_file):
                raise UsageError("--provider ssh needs --host user@address or --hosts hosts.toml")
            _existing_file(spec.hosts_file, "--hosts")
            spec.machines = _check_ssh_machines(spec)
        elif not spec.machines:
            raise UsageError("no machine given: use --machine NAME (see `cloudprof catalog`)")
    _check_workload_params(spec)
    _check_job(spec)
    _check_nodes(spec)
    _check_trial_count(spec)
    _check_trial_ids(spec)
    _check_limits(spec)
    _existing_file(spec.ssh_key, "--ssh-key")
    if spec.ssh_key is not None:
        from orchestrator.providers.remote import public_line

        public_line(Path(spec.ssh_key).expanduser())  # a private key, and not encrypted
    check_output_dir(spec.out)
    return spec
