"""What the main thread uploads while the machines provision: the job, the inputs, and the
signed URLs the hosts fetch the inputs by. No host fetches them before they are there."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from orchestrator.engine.inputs import StagedInputs, upload_inputs
from orchestrator.engine.prepare import INPUTS_RETENTION_S, label_prefixes, vm_expiry
from orchestrator.plan.planner import Plan, slug
from orchestrator.providers.base import Bucket

if TYPE_CHECKING:
    from orchestrator.engine.progress import SweepProgress


class Staging:
    """The sweep's one upload (:meth:`run_once`) and the hosts' wait for it (:meth:`wait`)."""

    def __init__(self, plan: Plan, bucket: Bucket | None, inputs: StagedInputs | None,
                 job: Any, progress: SweepProgress, url_lifetime_s: int) -> None:
        self.plan, self.bucket, self.inputs, self.job = plan, bucket, inputs, job
        self.progress, self.url_lifetime_s = progress, url_lifetime_s
        self.manifest: list[dict[str, Any]] = []  # the inputs' signed URLs, once staged
        self.staged = threading.Event()  # set once uploaded, or failed

    def upload(self) -> None:
        """Label the sweep's prefixes, then ship the job and the inputs to the bucket."""
        bucket, plan, job, inputs = self.bucket, self.plan, self.job, self.inputs
        if bucket is None:
            return
        label_prefixes(bucket, plan, inputs)
        if job is not None:  # a cache like the inputs: labelled, kept for later sweeps
            bucket.label_prefix(job.prefix, slug(plan.sweep_id),
                                max(vm_expiry(time.time(), vm) for vm in plan.vms),
                                INPUTS_RETENTION_S)
            self.progress.log(f"Shipping the job ({job.files} files) to "
                              f"{bucket.url}/{job.prefix}/ ...")
            bucket.upload_dir(job.path.parent, job.prefix)
        if inputs is not None:
            upload_inputs(bucket, inputs, self.progress)

    def run_once(self, stop: threading.Event) -> None:
        """Upload what the hosts fetch and sign its URLs, on the main thread while the
        machine threads create, boot and bootstrap their hosts: a VM's boot no longer
        waits for the upload. A failure stops the machines (torn down as for any failure)."""
        if self.staged.is_set():
            return  # an earlier execute of this sweep (--search) staged them
        try:
            self.upload()
            if self.bucket is not None and self.inputs is not None:
                keys = self.bucket.list(self.inputs.prefix + "/")
                self.manifest = [
                    {"url": self.bucket.signed_url(f"{self.inputs.prefix}/{rel}",
                                                   expires_s=self.url_lifetime_s),
                     "path": rel, "md5": keys.get(f"{self.inputs.prefix}/{rel}")}
                    for rel, _ in self.inputs.files
                ]
        except BaseException:
            stop.set()
            raise
        finally:
            self.staged.set()

    def wait(self, stop: threading.Event) -> bool:
        """Wait for :meth:`run_once`; False when the sweep is stopping (or staging failed)."""
        while not self.staged.wait(0.1):
            if stop.is_set():
                return False
        return not stop.is_set()
