"""The sweep's context: what every room of the engine reads, made once per sweep.

The rooms (host sessions, the trial runner, the strategies, the machines' threads)
are handed this instead of one object that holds everything, so what each may
touch is what it is given. Frozen: nothing is set on it after it is made; what
changes during the sweep lives in objects of its own (:class:`Failures`,
:class:`~orchestrator.engine.staging.Staging`, the store).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.engine.prepare import bucket_serves, exec_provider_name, signed_url_lifetime
from orchestrator.plan.planner import Plan, VmPlan
from orchestrator.providers.base import Bucket, Provider
from orchestrator.results.store import RunStore
from orchestrator.spec.spec import SweepSpec

if TYPE_CHECKING:
    from orchestrator.engine.inputs import StagedInputs
    from orchestrator.engine.progress import SweepProgress
    from orchestrator.engine.staging import Staging


class Failures:
    """What went wrong outside a trial's own record: bugs in a machine's thread (re-raised
    by the main thread at the end) and the first local write that failed (it stops the
    sweep: no further result could be stored)."""

    def __init__(self, progress: SweepProgress, stop: threading.Event) -> None:
        self.progress, self.stop = progress, stop
        self.errors: list[BaseException] = []
        self.write_error: OSError | None = None
        self._lock = threading.Lock()

    def bug(self, exc: BaseException) -> None:
        self.errors.append(exc)

    def write_failed(self, exc: OSError) -> None:
        """The results directory stopped taking writes: stop every machine (their results
        could not be stored either) and keep the bucket's copies for --resume."""
        with self._lock:
            first = self.write_error is None
            if first:
                self.write_error = exc
        self.stop.set()
        if first:
            self.progress.log(f"[bold red]cannot write the results: {exc} — stopping the sweep")


@dataclass(frozen=True)
class SweepContext:
    """One sweep's fixed parts; ``stop`` is set once it is stopping (Ctrl-C, a failure)."""

    spec: SweepSpec
    plan: Plan
    store: RunStore
    bucket: Bucket | None
    inputs: StagedInputs | None
    progress: SweepProgress
    providers: Mapping[str, Provider]
    staging: Staging
    failures: Failures
    stop: threading.Event
    ssh_keys: Any = None
    job: Any = None  # orchestrator.engine.jobs.JobArchive of --workdir, or None
    resuming: bool = False  # look in the bucket for a trial's result before running it
    # the providers whose hosts fetch and put through the bucket (see bucket_serves)
    bucket_served: frozenset[str] = frozenset()
    url_lifetime_s: int = 0
    attempt_nonce: str = field(default_factory=lambda: str(int(time.time())))
    wheels: Any = None  # providers.wheelhouse.SweepWheels: fetched and staged once per sweep

    @classmethod
    def create(cls, spec: SweepSpec, plan: Plan, store: RunStore, bucket: Bucket | None,
               inputs: StagedInputs | None, progress: SweepProgress,
               providers: Mapping[str, Provider], staging: Staging, *, ssh_keys: Any = None,
               job: Any = None, resuming: bool = False) -> SweepContext:
        # The keys' cancel event stops remote.connect's wait for SSH at once on Ctrl-C.
        cancel = getattr(ssh_keys, "cancel", None)
        stop = cancel if cancel is not None else threading.Event()
        served = bucket_serves(bucket.url if bucket is not None else None,
                               {exec_provider_name(spec, vm) for vm in plan.vms})
        from orchestrator.plan.planner import slug
        from orchestrator.providers.wheelhouse import SweepWheels

        lifetime = signed_url_lifetime(plan)
        return cls(spec=spec, plan=plan, store=store, bucket=bucket, inputs=inputs,
                   progress=progress, providers=providers, staging=staging,
                   failures=Failures(progress, stop), stop=stop, ssh_keys=ssh_keys, job=job,
                   resuming=resuming, bucket_served=frozenset(served),
                   url_lifetime_s=lifetime,
                   wheels=SweepWheels(progress.log, lifetime, slug(plan.sweep_id)))

    def provider(self, vm: VmPlan) -> Provider:
        return self.providers[exec_provider_name(self.spec, vm)]

    def bucket_for(self, provider: Provider) -> Bucket | None:
        """The bucket for transfers of this provider's hosts; None: over their executor."""
        return self.bucket if provider.name in self.bucket_served else None

    def note_machine(self, machine: str, status: str, error: str | None = None) -> None:
        """Record how a machine ended; a failing disk must not stop its teardown."""
        try:
            self.store.record_machine(machine, status, error)
        except OSError as exc:
            self.failures.write_failed(exc)
