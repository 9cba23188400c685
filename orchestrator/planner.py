"""Expands a spec into trials grouped per VM, and estimates time and cost.

One VM per machine type serves all its worker counts and repeats, so the
boot/bootstrap/staging cost is paid once per machine. Every figure here is an
estimate and is labelled so wherever it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.catalog import MachineType


@dataclass
class TrialPlan:
    trial_id: str  # "<machine>-w<workers>-r<repeat>", unique in a sweep, file-name safe
    machine: str
    workers: int
    repeat: int
    runner_args: list[str]  # arguments after `python -m workloads.run` (without --out)


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


@dataclass
class Upload:
    key: str  # object key in the bucket
    size_bytes: int


@dataclass
class Plan:
    sweep_id: str
    vms: list[VmPlan]
    uploads: list[Upload] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        """Wall time: VMs run concurrently."""
        return max((vm.estimate.total_s for vm in self.vms), default=0.0)

    @property
    def total_cost_usd(self) -> float | None:
        costs = [vm.estimate.cost_usd for vm in self.vms]
        known = [c for c in costs if c is not None]
        return sum(known) if known else None
