"""What a sweep opens before its first machine: the catalog rows of its machines, one
provider per cloud it runs on, its bucket (and which hosts use it), the job archive, the
VMs' expiry and the bucket prefixes' labels and lifetimes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.engine.inputs import StagedInputs
from orchestrator.errors import UsageError
from orchestrator.plan.planner import Plan, VmPlan, slug
from orchestrator.providers.base import Bucket, Provider, ProviderOptions
from orchestrator.spec.spec import SweepSpec

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.catalog.machines import MachineType


EXPIRY_MARGIN_S = 1800.0  # a VM outlives its estimate by 50% plus this, then deletes itself
# How long bucket prefixes outlive the sweep's expiry before `cloudprof cleanup` takes them:
# results long enough for `sweep --resume` to collect what VMs uploaded, the inputs cache
# long enough to be reused by the next sweeps (each sweep using it pushes this further).
RESULTS_RETENTION_S = 3 * 86400.0
INPUTS_RETENTION_S = 7 * 86400.0


SIGNED_URL_MAX_S = 7 * 86400  # S3 (SigV4) and GCS (V4) refuse longer-lived signed URLs
UNASKED_COST_USD = 100.0  # a plan estimated above this needs --max-cost to start


def lookup_machines(spec: SweepSpec) -> list[MachineType]:
    """Catalog rows of the spec's machines; local/ssh machines may be off-catalog."""
    from orchestrator.catalog.machines import MachineType, lookup
    from orchestrator.errors import UnknownMachineError
    from orchestrator.spec.validate import machine_providers

    out = []
    owners = machine_providers(spec)  # one provider, or several in one sweep
    # beside catalog machines a host of unknown size runs their worker counts (make_plan)
    sized = any(provider in ("gcp", "aws") for provider in owners.values())
    for name in spec.machines:
        provider = owners[name]
        if provider in ("gcp", "aws"):
            out.append(lookup(name, provider, spec.region))
            continue
        try:
            row = lookup(name)
            # several providers: the planner takes each VM's provider from its row
            out.append(row if spec.provider else replace(row, provider=provider))
        except UnknownMachineError:
            if not spec.workers and not sized:
                raise UsageError(f"{name!r} is not in the catalog, so its vCPU count is "
                                 "unknown: give --workers") from None
            if provider == "ssh":  # its price from the hosts file (a group's: one node's)
                from orchestrator.providers.ssh import SshProvider

                out.append(SshProvider(ProviderOptions(hosts_file=spec.hosts_file,
                                                       hosts=list(spec.hosts))).machine_type(name))
                continue
            out.append(MachineType(provider=provider, name=name, family="", vcpus=0,
                                   memory_gib=0.0, region="", price_on_demand=None,
                                   price_spot=None, price_source="", price_date=""))
    return out


def exec_provider_name(spec: SweepSpec, vm: VmPlan) -> str:
    """Where a VM's trials really run: on this machine for --dry-run."""
    return "local" if spec.dry_run else vm.provider


def machine_prices(plan: Plan) -> dict[str, Any]:
    return {vm.machine.name: {**asdict(vm.machine), "spot": vm.spot,
                              "price_per_hour": vm.machine.price(vm.spot)} for vm in plan.vms}


def build_providers(spec: SweepSpec, plan: Plan, run_dir: Path | None,
                     sweep_id: str) -> tuple[dict[str, Provider], Any]:
    """One provider per name the plan runs on; SSH keys first for those that create VMs.

    With ``run_dir`` None the providers are only for the credentials check.
    """
    from orchestrator.providers import get_provider, provider_class

    names = sorted({exec_provider_name(spec, vm) for vm in plan.vms})
    keys = None
    if run_dir is not None and any(provider_class(n).creates_machines for n in names):
        from orchestrator.providers.remote import SshKeys

        keys = SshKeys.for_sweep(run_dir, spec.ssh_key)
    out = {}
    for name in names:
        options = ProviderOptions(
            region=spec.region, zone=spec.zone, project=spec.project,
            hosts_file=spec.hosts_file, hosts=list(spec.hosts), ssh_key=spec.ssh_key,
            workdir=(run_dir / "hosts") if run_dir is not None else None,
            ssh=keys, sweep_id=sweep_id)
        out[name] = get_provider(name, options)
    return out, keys


def signed_url_lifetime(plan: Plan) -> int:
    """How long the URLs a VM gets stay valid: as long as the sweep's VMs may live (their
    estimate × 1.5 + the margin, the expiry label), within SigV4's and GCS's 7-day limit."""
    longest = max((vm_expiry(0.0, vm) for vm in plan.vms), default=EXPIRY_MARGIN_S)
    return int(min(longest, SIGNED_URL_MAX_S))


_BUCKET_CLOUDS = {"gs": "gcp", "s3": "aws"}


def bucket_serves(url: str | None, providers: set[str]) -> set[str]:
    """The providers (of ``providers``, those the plan runs on) whose hosts use the bucket.

    A sweep on one provider uses it for every host, as given. A sweep across
    providers uses a ``gs://`` bucket for its GCP VMs and an ``s3://`` one for its AWS
    VMs only: they reach their own cloud's storage inside it, while another cloud's VM
    or an SSH host would pay egress on every input and result; those hosts get their
    files over SSH instead, as without a bucket."""
    if url is None:
        return set()
    if len(providers) <= 1:
        return set(providers)
    cloud = _BUCKET_CLOUDS.get(url.partition("://")[0])
    return {cloud} & providers if cloud else set()


def open_bucket(spec: SweepSpec, providers: Iterable[str]) -> Bucket | None:
    """The sweep's bucket; a dry run never touches a cloud one (it makes no cloud call).
    None when no host would use it (a sweep across providers, none of them its cloud's).

    ``providers`` are the names the plan runs on."""
    cloud = spec.bucket is not None and spec.bucket.startswith(("gs://", "s3://"))
    names = set(providers)
    if spec.bucket and not bucket_serves(spec.bucket, names):
        return None
    if spec.bucket and not (spec.dry_run and cloud):
        from orchestrator.providers import open_bucket

        return open_bucket(spec.bucket)
    if names == {"local"}:
        from orchestrator.providers.local import LocalBucket

        return LocalBucket()
    return None  # inputs are copied to each host over its executor


def limit_note(spec: SweepSpec, console: Console) -> None:
    """--prove-limit/--find-limit add trials the plan's estimate does not count: say how many."""
    if spec.find_limit or spec.prove_limit:
        from orchestrator.engine.limits import MAX_STEPS

        most = 2 + MAX_STEPS if spec.find_limit else 1
        flag = "--find-limit" if spec.find_limit else "--prove-limit"
        console.print(f"[yellow]note:[/yellow] {flag} adds up to {most} trial(s) per machine "
                      "and worker count under a memory limit, after the others; the "
                      "estimates above do not count them.",
                      highlight=False)


def bucket_note(spec: SweepSpec, providers: set[str], console: Console) -> None:
    """Say which hosts of a sweep across providers use --bucket, and which get their
    files over SSH (see ``bucket_serves``)."""
    if not spec.bucket or len(providers) <= 1:
        return
    served = bucket_serves(spec.bucket, providers)
    others = ", ".join(sorted(providers - served))
    used = (f"the {', '.join(sorted(served))} VMs use it; the {others} hosts" if served
            else "no cloud of this sweep holds it, so every host")
    console.print(f"Bucket {spec.bucket}: {used} get their inputs and results over SSH.",
                  highlight=False)


def pack_job(spec: SweepSpec) -> Any:
    """The --workdir archive (orchestrator.engine.jobs.JobArchive), or None."""
    if spec.workdir is None:
        return None
    from orchestrator.engine.jobs import pack_workdir

    return pack_workdir(spec.workdir)


def vm_expiry(now: float, vm: VmPlan) -> float:
    """When ``vm`` powers itself off: its estimate plus 50% and a margin."""
    return now + vm.estimate.total_s * 1.5 + EXPIRY_MARGIN_S


def results_prefix(plan: Plan) -> str:
    return f"results/{slug(plan.sweep_id)}/"


def label_prefixes(bucket: Bucket, plan: Plan, inputs: StagedInputs | None) -> None:
    """Label the prefixes the sweep writes before anything goes under them, so that
    `cloudprof cleanup` finds them if this process dies before its ``finally``."""
    now = time.time()
    expires = max((vm_expiry(now, vm) for vm in plan.vms), default=now + EXPIRY_MARGIN_S)
    sweep = slug(plan.sweep_id)
    bucket.label_prefix(results_prefix(plan), sweep, expires, RESULTS_RETENTION_S)
    if inputs is not None:
        bucket.label_prefix(inputs.prefix, sweep, expires, INPUTS_RETENTION_S)
