"""Google Cloud: Compute Engine machines (``GcpProvider``) and GCS buckets (``GcsBucket``).

Both import the google libraries inside methods so that importing this module
(the CLI does it only when ``--provider gcp`` or a ``gs://`` bucket is used)
stays cheap. Every SDK error is translated here into one-line
``orchestrator.errors`` classes, because the sweep engine decides what to do by
class: a ``CapacityError`` is worth one try in the next zone, a ``QuotaError``
is not, a ``PermissionDeniedError`` points at ``infra/iam/gcp-roles.md``.

Settings read from the environment (docs/tutorials/google-cloud.md):
``CLOUDPROF_GCE_ENDPOINT`` (a Compute REST endpoint, e.g. the tests' fake; no
credentials are used then), ``CLOUDPROF_SSH_SOURCE_CIDR`` (who may reach port
22; default: this machine's public address), ``CLOUDPROF_GCS_SIGNER`` (the
service account that signs GCS URLs when ADC cannot sign), plus the standard
``GOOGLE_CLOUD_PROJECT``/``CLOUDSDK_CORE_PROJECT``, ``CLOUDSDK_COMPUTE_ZONE``,
``CLOUDSDK_COMPUTE_REGION`` and ``STORAGE_EMULATOR_HOST``.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import functools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.atomic import atomic_path
from orchestrator.errors import (
    BucketError,
    CapacityError,
    CredentialsError,
    PermissionDeniedError,
    ProviderError,
    QuotaError,
    UnreachableError,
    UsageError,
)
from orchestrator.providers.base import (
    LABEL_CREATED,
    LABEL_CREATOR,
    LABEL_EXPIRES,
    LABEL_SWEEP,
    Bucket,
    Executor,
    Instance,
    Provider,
    ProviderOptions,
    Resource,
    VmRequest,
)

ENDPOINT_ENV = "CLOUDPROF_GCE_ENDPOINT"
SIGNER_ENV = "CLOUDPROF_GCS_SIGNER"
PROJECT_ENVS = ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")
ZONE_ENV = "CLOUDSDK_COMPUTE_ZONE"
REGION_ENV = "CLOUDSDK_COMPUTE_REGION"

DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
# arm64 machines (t2a, c4a) boot the arm64 build of the same image family.
DEFAULT_IMAGES = {"x86_64": DEFAULT_IMAGE, "arm64": DEFAULT_IMAGE + "-arm64"}
DEFAULT_NETWORK = "global/networks/default"
GCE_DELETE_LEAD_S = 300  # GCE deletes this long before the startup script powers off
DEFAULT_LIFETIME_S = 6 * 3600  # expiry when the engine gave none: VMs never live unbounded
IAM_DOC = "infra/iam/gcp-roles.md"
FIREWALL_DESCRIPTION = "cloudprof per-sweep SSH rule "  # then the labels as JSON
CLUSTER_DESCRIPTION = "cloudprof per-sweep cluster rule "  # then the labels as JSON
# What cleanup recognises as cloudprof's rules (firewall rules carry no labels on GCE).
RULE_DESCRIPTIONS = (FIREWALL_DESCRIPTION, CLUSTER_DESCRIPTION)
CREDENTIALS_HINT = (
    "no Google Cloud credentials: run `gcloud auth application-default login` "
    "(or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file); "
    "--dry-run needs none"
)
# What the calls in this module need on the project (infra/iam/gcp-roles.md explains each;
# a test keeps that file's gcloud command equal to this list).
GCP_PERMISSIONS = (
    "compute.instances.create", "compute.instances.get", "compute.instances.list",
    "compute.instances.delete", "compute.instances.setMetadata", "compute.instances.setLabels",
    "compute.instances.setTags", "compute.instances.setScheduling", "compute.disks.create",
    "compute.disks.setLabels", "compute.images.useReadOnly", "compute.images.getFromFamily",
    "compute.subnetworks.use", "compute.subnetworks.useExternalIp", "compute.machineTypes.get",
    "compute.regions.get", "compute.zoneOperations.get", "compute.globalOperations.get",
    "compute.firewalls.create", "compute.firewalls.delete", "compute.firewalls.list",
    "compute.networks.updatePolicy",
)
STOCKOUT_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                  "RESOURCE_POOL_EXHAUSTED", "STOCKOUT")
QUOTA_CODES = ("QUOTA_EXCEEDED", "quotaExceeded")

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


# ---------------------------------------------------------------- naming rules


def label_value(value: object) -> str:
    """GCP label values: lower-case ``[a-z0-9_-]``, at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "-", str(value).lower())[:63]


def label_key(key: str) -> str:
    """GCP label keys: like values, but starting with a letter."""
    key = label_value(key)
    return key if key[:1].isalpha() else f"k{key}"[:63]


def gce_labels(labels: dict[str, str]) -> dict[str, str]:
    return {label_key(k): label_value(v) for k, v in labels.items()}


def resource_name(*parts: str) -> str:
    """A GCE resource name (RFC 1035: ``[a-z]([-a-z0-9]*[a-z0-9])?``, ≤63) from ``parts``."""
    name = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    if not name[:1].isalpha():
        name = f"cp-{name}"
    return name[:63].rstrip("-")


def sweep_tag(sweep_id: str) -> str:
    """The network tag that the sweep's firewall rule targets."""
    return resource_name("cp-sweep", sweep_id)


def firewall_name(sweep_id: str) -> str:
    return resource_name("cp-ssh", sweep_id)


def cluster_firewall_name(sweep_id: str) -> str:
    """The sweep's inter-node rule (``VmRequest.cluster``): its VMs to each other only."""
    return resource_name("cp-cluster", sweep_id)


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


# ---------------------------------------------------------------- errors


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _api_errors() -> tuple[type[BaseException], ...]:
    """What a google call raises for reasons outside cloudprof (never its own bugs)."""
    import requests
    from google.api_core.exceptions import GoogleAPICallError
    from google.auth.exceptions import GoogleAuthError

    return GoogleAPICallError, GoogleAuthError, requests.RequestException


def _upload_retry() -> Any:
    """google-cloud-storage's own policy (backoff on 429, 5xx and dropped connections) for
    uploads: its default retries an upload only under a generation precondition, so one
    transient 503 failed the staging; rewriting an object with the same bytes is safe."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY


def translate_api_error(exc: BaseException, what: str) -> Exception:
    """An SDK exception (HTTP error from a call) as one cloudprof error."""
    import requests
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError, TransportError

    if isinstance(exc, DefaultCredentialsError):
        return CredentialsError(CREDENTIALS_HINT)
    if isinstance(exc, TransportError):  # the network, not the login
        return ProviderError(f"gcp: cannot reach Google for {what}: {_short(str(exc), 160)}")
    if isinstance(exc, GoogleAuthError):
        return CredentialsError(f"gcp: credentials failed for {what}: {_short(str(exc), 160)}; "
                                "run `gcloud auth application-default login`")
    if isinstance(exc, requests.RequestException):
        return ProviderError(f"gcp: cannot reach Compute Engine for {what}: "
                             f"{_short(str(exc), 160)}")

    message = _short(getattr(exc, "message", None) or str(exc))
    details = [str(getattr(exc, "reason", "") or "")] + [
        str(e.get("reason", "")) for e in (getattr(exc, "errors", None) or [])
        if isinstance(e, dict)]
    reasons = " ".join(details) + " " + message
    if any(code in reasons for code in STOCKOUT_CODES):
        return CapacityError(f"gcp: no capacity for {what}: {message}")
    if any(code in reasons for code in QUOTA_CODES) or "Quota " in message:
        return QuotaError(f"gcp: quota exceeded for {what}: {message}")
    if isinstance(exc, gexc.Unauthenticated | gexc.Unauthorized):
        return CredentialsError(f"gcp: credentials rejected for {what}: {message}; "
                                "run `gcloud auth application-default login`")
    if isinstance(exc, gexc.Forbidden | gexc.PermissionDenied):
        return PermissionDeniedError(f"gcp: permission denied for {what}: {message} "
                                     f"(roles needed: {IAM_DOC})")
    return ProviderError(f"gcp: {what} failed: {message}")


def translate_operation_error(op: Any, what: str) -> Exception | None:
    """The error a finished GCE operation reports (how GCE reports stockouts), if any."""
    errors = list(op.error.errors) if op.error else []
    if not errors and not op.http_error_status_code:
        return None
    codes = [e.code for e in errors]
    message = _short("; ".join(f"{e.code}: {e.message}" for e in errors)
                     or f"{op.http_error_status_code} {op.http_error_message}")
    if any(c in STOCKOUT_CODES for c in codes) or "stockout" in message.lower():
        return CapacityError(f"gcp: no capacity for {what} ({message})")
    if any(c in QUOTA_CODES for c in codes):
        return QuotaError(f"gcp: quota exceeded for {what} ({message}); "
                          "raise it in the console (IAM & Admin → Quotas)")
    if op.http_error_status_code == 403:
        return PermissionDeniedError(f"gcp: permission denied for {what} ({message}); "
                                     f"roles needed: {IAM_DOC}")
    return ProviderError(f"gcp: {what} failed ({message})")


# ---------------------------------------------------------------- compute


@dataclass
class GcpResource(Resource):
    """Anything cloudprof made in a project, for ``cloudprof cleanup`` (same shape as AWS's)."""

    kind: str  # "instance" | "firewall"
    id: str  # the GCE name
    name: str
    zone: str | None  # None for global resources (firewall rules)
    state: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def region(self) -> str | None:
        return region_of(self.zone) if self.zone else None


def list_resources(labels: dict[str, str] | None = None,
                   project: str | None = None) -> list[Resource]:
    """What cloudprof made in the project carrying all of ``labels`` (all of it when empty)."""
    return GcpProvider(ProviderOptions(project=project)).list_resources(labels)


def delete_resources(resources: Sequence[Resource], project: str | None = None) -> None:
    """Delete what ``list_resources`` found: instances first, then the rules they used."""
    GcpProvider(ProviderOptions(project=project)).delete_resources(resources)


class GcpProvider(Provider):
    """Compute Engine VMs: one per machine type of a sweep, labelled, self-deleting."""

    name = "gcp"

    def __init__(self, options: ProviderOptions | None = None) -> None:
        self.options = options or ProviderOptions()
        self._clients: dict[str, Any] = {}
        self._credentials: Any = None
        self._adc_project: str | None = None
        self._project: str | None = None
        self._lock = threading.Lock()
        self._creating: dict[str, int] = {}  # sweep id -> creations in flight (firewall guard)
        self.poll_interval = 1.0  # first wait between instance polls (tests shorten it)

    # ---- configuration

    def _endpoint(self) -> str | None:
        return os.environ.get(ENDPOINT_ENV) or None

    def _creds(self) -> Any:
        if self._credentials is None:
            if self._endpoint():
                from google.auth.credentials import AnonymousCredentials

                self._credentials, adc_project = AnonymousCredentials(), None
            else:
                import google.auth
                from google.auth.exceptions import DefaultCredentialsError

                try:
                    self._credentials, adc_project = google.auth.default(
                        scopes=["https://www.googleapis.com/auth/cloud-platform"])
                except DefaultCredentialsError:
                    raise CredentialsError(CREDENTIALS_HINT) from None
            self._adc_project = adc_project
        return self._credentials

    @property
    def project(self) -> str:
        if self._project is None:
            project = self.options.project or next(
                (os.environ[e] for e in PROJECT_ENVS if os.environ.get(e)), None)
            if not project:
                self._creds()
                project = self._adc_project
            if not project:
                raise UsageError("no Google Cloud project: pass --project or set "
                                 "GOOGLE_CLOUD_PROJECT")
            self._project = project
        return self._project

    def _client(self, kind: str) -> Any:
        with self._lock:
            if kind not in self._clients:
                from google.api_core.client_options import ClientOptions
                from google.cloud import compute_v1

                endpoint = self._endpoint()
                options = ClientOptions(api_endpoint=endpoint) if endpoint else None
                cls = getattr(compute_v1, kind)
                self._clients[kind] = cls(transport="rest", credentials=self._creds(),
                                          client_options=options)
            return self._clients[kind]

    def check_credentials(self) -> None:
        """ADC exist, can mint a token (expired logins fail here, before any input is made),
        and a project is known."""
        creds = self._creds()
        _ = self.project
        if self._endpoint():
            return
        import google.auth.transport.requests

        try:
            creds.refresh(google.auth.transport.requests.Request())
        except _api_errors() as exc:
            raise translate_api_error(exc, "refreshing Application Default Credentials"
                                      ) from None

    def zone_for(self, req: VmRequest | None = None) -> str:
        """The zone a VM goes to: the request's, the flags', the environment's, else the
        region's first."""
        zone = (req.zone if req else None) or self.options.zone or os.environ.get(ZONE_ENV)
        if zone:
            return zone
        region = (req.region if req else None) or self.options.region \
            or os.environ.get(REGION_ENV)
        if not region:
            raise UsageError("no Google Cloud zone: pass --zone or --region, or set "
                             f"{ZONE_ENV}")
        return self.zones_in_region(region)[0]

    def zones_in_region(self, region: str) -> list[str]:
        """The region's zones, in order; after a CapacityError the engine tries the next one."""
        try:
            reg = self._client("RegionsClient").get(project=self.project, region=region)
        except _api_errors() as exc:
            raise translate_api_error(exc, f"region {region}") from None
        return sorted(url.rsplit("/", 1)[-1] for url in reg.zones)

    # ---- operations

    def _retrying(self, what: str, call: Callable[[], Any], attempts: int = 4) -> Any:
        """``call()``, again after a transient 5xx/429, a few times only.

        google.api_core's ``Retry`` does the backoff (exponential with jitter, the one
        Google's clients use); it retries for a time, not a number of tries, so the
        ``on_error`` hook gives up after ``attempts`` by raising the last error.
        """
        from google.api_core import exceptions as gexc
        from google.api_core import retry as gretry

        failures: list[Exception] = []

        def give_up_after_attempts(exc: Exception) -> None:
            failures.append(exc)
            if len(failures) >= attempts:
                raise exc

        policy = gretry.Retry(
            predicate=gretry.if_exception_type(gexc.ServiceUnavailable,
                                               gexc.InternalServerError,
                                               gexc.TooManyRequests, gexc.GatewayTimeout),
            initial=self.poll_interval, maximum=10.0, multiplier=2.0, timeout=None,
            on_error=give_up_after_attempts,
        )
        try:
            return policy(call)()
        except _api_errors() as exc:
            raise translate_api_error(exc, what) from None

    def _wait_once(self, name: str, zone: str | None) -> Any:
        """One ``wait`` call: GCE returns when the operation is done or after ~2 minutes."""
        if zone:
            return self._client("ZoneOperationsClient").wait(
                project=self.project, zone=zone, operation=name)
        return self._client("GlobalOperationsClient").wait(project=self.project, operation=name)

    def _wait(self, op: Any, what: str, zone: str | None, timeout: float = 600) -> None:
        """Poll the operation ourselves: ``operation.result()`` ignores a custom endpoint."""
        deadline = time.monotonic() + timeout
        while op.status.name != "DONE":
            if time.monotonic() > deadline:
                raise ProviderError(f"gcp: {what} did not finish within {timeout:.0f} s "
                                    f"(operation {op.name})")
            op = self._retrying(what, functools.partial(self._wait_once, op.name, zone))
        error = translate_operation_error(op, what)
        if error is not None:
            raise error

    # ---- firewall

    def _ensure_firewall(self, sweep_id: str, labels: dict[str, str]) -> None:
        """The sweep's rule: tcp:22 from the caller only, to the sweep's tagged VMs."""
        from google.cloud import compute_v1

        from orchestrator.providers import remote

        self._insert_rule(compute_v1.Firewall(
            name=firewall_name(sweep_id),
            network=DEFAULT_NETWORK,
            direction="INGRESS",
            priority=1000,
            allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])],
            source_ranges=[remote.caller_cidr()],
            target_tags=[sweep_tag(sweep_id)],
            # Firewall rules carry no labels on GCE: the description holds them for cleanup.
            description=FIREWALL_DESCRIPTION + json.dumps(labels, sort_keys=True),
        ))

    def _ensure_cluster_firewall(self, sweep_id: str, labels: dict[str, str]) -> None:
        """The sweep's inter-node rule: every TCP/UDP port, from the sweep's tagged VMs to
        the sweep's tagged VMs, nothing else.

        Source tags match only traffic inside the VPC (from the VMs' internal
        addresses), so the nodes talk over ``Instance.private_address`` and no port
        but SSH is open to the internet.
        """
        from google.cloud import compute_v1

        tag = sweep_tag(sweep_id)
        self._insert_rule(compute_v1.Firewall(
            name=cluster_firewall_name(sweep_id),
            network=DEFAULT_NETWORK,
            direction="INGRESS",
            priority=1000,
            allowed=[compute_v1.Allowed(I_p_protocol="tcp"),
                     compute_v1.Allowed(I_p_protocol="udp")],
            source_tags=[tag],
            target_tags=[tag],
            description=CLUSTER_DESCRIPTION + json.dumps(labels, sort_keys=True),
        ))

    def _insert_rule(self, rule: Any) -> None:
        """Create ``rule``; one that exists already was made by another VM of the sweep
        (nodes are created in parallel: GCE's 409 is what makes this once per sweep)."""
        from google.api_core import exceptions as gexc

        what = f"firewall rule {rule.name}"
        try:
            op = self._client("FirewallsClient").insert(project=self.project,
                                                         firewall_resource=rule)
        except gexc.Conflict:
            return
        except _api_errors() as exc:
            raise translate_api_error(exc, what) from None
        self._wait(op, what, None)

    def _delete_firewall(self, name: str) -> None:
        from google.api_core import exceptions as gexc

        what = f"deleting firewall rule {name}"
        try:
            op = self._client("FirewallsClient").delete(project=self.project, firewall=name)
        except gexc.NotFound:
            return
        except _api_errors() as exc:
            raise translate_api_error(exc, what) from None
        self._wait(op, what, None)

    # ---- instances

    def _labels_for(self, req: VmRequest) -> dict[str, str]:
        now = int(time.time())
        labels = {LABEL_SWEEP: req.sweep_id, LABEL_CREATED: str(now),
                  LABEL_EXPIRES: str(now + DEFAULT_LIFETIME_S),
                  LABEL_CREATOR: os.environ.get("USER", "unknown")}
        labels.update(req.labels)
        return gce_labels(labels)

    @staticmethod
    def _image(image: str | None, machine: str = "") -> str:
        """``projects/P/global/images/...`` as is; ``P/family`` or a debian-cloud family;
        none: Debian 12 for the machine's architecture (catalog ``arch`` column)."""
        if not image:
            from orchestrator.catalog.machines import machine_arch

            return DEFAULT_IMAGES[machine_arch("gcp", machine)]
        if image.startswith(("projects/", "https://")):
            return image
        project, _, family = image.rpartition("/")
        return f"projects/{project or 'debian-cloud'}/global/images/family/{family}"

    def instance_body(self, req: VmRequest, zone: str) -> Any:
        """The Instance resource for ``req`` (separate from ``create`` so it is testable)."""
        from google.cloud import compute_v1

        labels = self._labels_for(req)
        # GCE deletes the VM at terminationTime whatever happened to the laptop, but only
        # if it is still running then (stopping a VM clears its termination timestamp),
        # so it fires ahead of the guest's own power-off at the expiry.
        deletes_at = max(int(labels[LABEL_EXPIRES]) - GCE_DELETE_LEAD_S, int(time.time()) + 60)
        scheduling: dict[str, Any] = {
            "instance_termination_action": "DELETE",  # also what preemption does to spot VMs
            "termination_time": dt.datetime.fromtimestamp(deletes_at, dt.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if req.spot:
            scheduling.update(provisioning_model="SPOT", automatic_restart=False,
                              on_host_maintenance="TERMINATE")
        else:
            scheduling.update(provisioning_model="STANDARD")
        return compute_v1.Instance(
            name=resource_name(req.name),
            machine_type=f"zones/{zone}/machineTypes/{req.machine}",
            labels=labels,
            tags=compute_v1.Tags(items=[sweep_tag(req.sweep_id)]),
            disks=[compute_v1.AttachedDisk(
                boot=True, auto_delete=True, type_="PERSISTENT",
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image=self._image(req.image, req.machine), disk_size_gb=req.disk_gb,
                    labels=labels))],
            network_interfaces=[compute_v1.NetworkInterface(
                network=DEFAULT_NETWORK,
                access_configs=[compute_v1.AccessConfig(name="External NAT",
                                                        type_="ONE_TO_ONE_NAT")])],
            metadata=compute_v1.Metadata(items=[
                compute_v1.Items(key="startup-script", value=req.startup_script),
                compute_v1.Items(key="ssh-keys",
                                 value=f"{req.ssh_user}:{req.ssh_public_key.strip()}"),
                # Only the sweep's key logs in: project-wide keys are not installed, and a
                # project-wide OS Login (which ignores metadata keys) is off for this VM.
                compute_v1.Items(key="block-project-ssh-keys", value="true"),
                compute_v1.Items(key="enable-oslogin", value="false"),
            ]),
            scheduling=compute_v1.Scheduling(**scheduling),
            # No service account: the VM holds no Google credentials at all (signed URLs).
        )

    def create(self, req: VmRequest) -> Instance:
        from google.api_core import exceptions as gexc

        zone = self.zone_for(req)
        what = f"{req.machine} in {zone}"
        try:
            mt = self._client("MachineTypesClient").get(project=self.project, zone=zone,
                                                        machine_type=req.machine)
        except gexc.NotFound:
            raise ProviderError(f"gcp: machine type {req.machine} does not exist in zone {zone} "
                                f"(see `gcloud compute machine-types list --zones={zone}`)"
                                ) from None
        except _api_errors() as exc:
            raise translate_api_error(exc, what) from None
        body = self.instance_body(req, zone)
        labels = dict(body.labels)
        with self._lock:
            self._creating[req.sweep_id] = self._creating.get(req.sweep_id, 0) + 1
        try:
            self._ensure_firewall(req.sweep_id, labels)
            if req.cluster:
                self._ensure_cluster_firewall(req.sweep_id, labels)
            op = self._client("InstancesClient").insert(project=self.project, zone=zone,
                                                        instance_resource=body)
        except _api_errors() as exc:
            error = translate_api_error(exc, what)
        else:
            error = None
        finally:
            with self._lock:
                self._creating[req.sweep_id] -= 1
        if error is not None:  # no instance to hand back, so nobody else would clean up
            self._after_failed_create(req.sweep_id)
            raise error
        return Instance(
            provider=self.name, id=body.name, name=body.name, machine=req.machine, zone=zone,
            state="PROVISIONING", user=req.ssh_user, labels=labels,
            facts={"operation": op.name, "vcpus": mt.guest_cpus,
                   "memory_gib": round(mt.memory_mb / 1024, 2)},
        )

    def _instance(self, raw: Any, zone: str) -> Instance:
        nics = list(raw.network_interfaces)
        configs = list(nics[0].access_configs) if nics else []
        return Instance(
            provider=self.name, id=raw.name, name=raw.name,
            machine=raw.machine_type.rsplit("/", 1)[-1], zone=zone, state=raw.status,
            address=(configs[0].nat_i_p or None) if configs else None,
            private_address=(nics[0].network_i_p or None) if nics else None,
            labels=dict(raw.labels),
        )

    def wait_ready(self, inst: Instance, timeout: float = 600) -> Instance:
        from google.api_core import exceptions as gexc

        what = f"{inst.machine} in {inst.zone}"
        deadline = time.monotonic() + timeout
        op_name = inst.facts.pop("operation", None)
        if op_name:
            try:
                op = self._client("ZoneOperationsClient").get(
                    project=self.project, zone=inst.zone, operation=op_name)
                self._wait(op, what, inst.zone, timeout)
            except ProviderError as exc:
                self._after_failed_create(inst.labels.get(LABEL_SWEEP) or self.options.sweep_id)
                if isinstance(exc, CapacityError) and inst.zone:
                    raise CapacityError(str(exc), zone=inst.zone,
                                        next_zones=self.next_zones(inst.zone, inst.machine)
                                        ) from None
                raise
        delay = self.poll_interval
        while True:
            try:
                raw = self._client("InstancesClient").get(project=self.project, zone=inst.zone,
                                                          instance=inst.id)
            except gexc.NotFound:
                raise ProviderError(f"gcp: instance {inst.id} in {inst.zone} disappeared "
                                    "while starting (preempted or deleted)") from None
            except _api_errors() as exc:
                raise translate_api_error(exc, what) from None
            ready = self._instance(raw, inst.zone or "")
            if ready.state == "RUNNING" and ready.address:
                ready.user, ready.port = inst.user, inst.port
                ready.facts = dict(inst.facts)
                return ready
            if ready.state in ("STOPPING", "STOPPED", "SUSPENDED", "TERMINATED"):
                raise ProviderError(f"gcp: instance {inst.id} is {ready.state} instead of "
                                    "starting (spot preemption?)")
            if time.monotonic() + delay > deadline:
                raise UnreachableError(f"gcp: instance {inst.id} not RUNNING after "
                                       f"{timeout:.0f} s (state {ready.state})")
            time.sleep(delay)
            delay = min(delay * 1.5, 5.0)

    def next_zones(self, zone: str, machine: str) -> tuple[str, ...]:
        """The region's other zones offering ``machine``, those after ``zone`` first."""
        from google.api_core import exceptions as gexc

        zones = self.zones_in_region(region_of(zone))
        pos = zones.index(zone) if zone in zones else -1
        ordered = zones[pos + 1:] + zones[:max(pos, 0)]
        offered = []
        for other in ordered:
            try:
                self._client("MachineTypesClient").get(project=self.project, zone=other,
                                                       machine_type=machine)
            except gexc.NotFound:
                continue
            offered.append(other)
        return tuple(offered)

    def _after_failed_create(self, sweep_id: str | None) -> None:
        """No VM came of it: drop the sweep's firewall rule if nothing else uses it."""
        if sweep_id:
            with contextlib.suppress(ProviderError):
                self._maybe_delete_firewall(sweep_id)

    def connect(self, inst: Instance) -> Executor:
        from orchestrator.providers.remote import connect

        return connect(inst, self.options.ssh)

    def delete(self, inst: Instance) -> None:
        from google.api_core import exceptions as gexc

        zone = inst.zone or next((i.zone for i in self.list({}) if i.id == inst.id), None)
        if zone:
            what = f"deleting instance {inst.id} in {zone}"
            try:
                op = self._client("InstancesClient").delete(project=self.project, zone=zone,
                                                            instance=inst.id)
            except gexc.NotFound:
                op = None
            except _api_errors() as exc:
                raise translate_api_error(exc, what) from None
            if op is not None:
                self._wait(op, what, zone)
        sweep_id = inst.labels.get(LABEL_SWEEP) or self.options.sweep_id
        if sweep_id:
            self._maybe_delete_firewall(sweep_id)

    def _maybe_delete_firewall(self, sweep_id: str) -> None:
        """Remove the sweep's rules (SSH, and the inter-node one of a multi-node sweep) once
        no VM of the sweep exists or is being made.

        The inter-node rule is deleted whether or not this provider made it (absent is
        fine): a resumed sweep's provider never saw the request that asked for it.
        """
        with self._lock:
            if self._creating.get(sweep_id):
                return
        if not self.list({LABEL_SWEEP: sweep_id}):
            self._delete_firewall(cluster_firewall_name(sweep_id))
            self._delete_firewall(firewall_name(sweep_id))

    def list(self, labels: dict[str, str]) -> list[Instance]:
        """Instances with all ``labels`` in every zone (all of cloudprof's when empty)."""
        wanted = gce_labels(labels) or {label_key(LABEL_SWEEP): "*"}
        expr = " AND ".join(
            f"labels.{k}:*" if v == "*" else f'labels.{k} = "{v}"' for k, v in wanted.items())
        try:
            pages = self._client("InstancesClient").aggregated_list(
                request={"project": self.project, "filter": expr})
            return [self._instance(raw, scope.rsplit("/", 1)[-1])
                    for scope, scoped in pages for raw in scoped.instances]
        except _api_errors() as exc:
            raise translate_api_error(exc, "listing instances") from None

    def list_resources(self, labels: dict[str, str] | None = None) -> list[Resource]:
        """Instances and firewall rules (SSH, inter-node) carrying ``labels``, for
        ``cloudprof cleanup``."""
        labels = labels or {}
        found: list[Resource] = [GcpResource("instance", i.id, i.name, i.zone, i.state, i.labels)
                                 for i in self.list(labels)]
        wanted = gce_labels(labels)
        try:
            rules = list(self._client("FirewallsClient").list(project=self.project))
        except _api_errors() as exc:
            raise translate_api_error(exc, "listing firewall rules") from None
        for rule in rules:
            prefix = next((p for p in RULE_DESCRIPTIONS if rule.description.startswith(p)), None)
            if prefix is None:
                continue
            try:
                rule_labels = json.loads(rule.description[len(prefix):])
            except ValueError:
                continue
            if all(rule_labels.get(k) == v for k, v in wanted.items()):
                found.append(GcpResource("firewall", rule.name, rule.name, None, "",
                                         rule_labels))
        return found

    def delete_resources(self, resources: Sequence[Resource]) -> None:
        """Delete what ``list_resources`` found: instances first, then the rules they used."""
        for res in sorted(resources, key=lambda r: r.kind != "instance"):
            self.delete_resource(res)

    def delete_resource(self, res: Resource) -> None:
        """Delete one thing ``list_resources`` found (absent is fine)."""
        if res.kind == "instance":
            self.delete(Instance(provider=self.name, id=res.id, name=res.name, machine="",
                                 zone=res.zone, labels=res.labels))
        else:
            self._delete_firewall(res.id)


# ---------------------------------------------------------------- storage

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*[a-z0-9]$")


def validate_bucket_name(name: str) -> None:
    """GCS naming rules, checked before any call so a typo costs no round trip."""
    problem = None
    if not 3 <= len(name) <= 222:
        problem = "must be 3-63 characters (up to 222 with dots)"
    elif not _BUCKET_RE.match(name):
        problem = ("may hold only lower-case letters, digits, '-', '_' and '.', "
                   "and must start and end with a letter or digit")
    elif "." not in name and len(name) > 63:
        problem = "must be at most 63 characters without dots"
    elif any(not 1 <= len(part) <= 63 for part in name.split(".")):
        problem = "each dot-separated part must be 1-63 characters"
    elif re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        problem = "must not look like an IP address"
    elif name.startswith("goog") or re.search(r"g[o0]{2}g[l1]e", name):
        problem = "must not start with 'goog' or contain 'google'"
    if problem:
        raise BucketError(f"invalid GCS bucket name {name!r}: {problem}")


_signer_lock = threading.Lock()
_emulator_signer: Any = None


def _emulator_signing_credentials() -> Any:
    """A throwaway service-account identity for the emulator, which checks no signature.

    It lets the tests run the real V4 signing code; real GCS is never given it.
    """
    global _emulator_signer
    with _signer_lock:
        if _emulator_signer is None:
            from cryptography.hazmat.primitives import serialization
            from cryptography.hazmat.primitives.asymmetric import rsa
            from google.oauth2 import service_account

            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
            _emulator_signer = service_account.Credentials.from_service_account_info({
                "type": "service_account", "client_email": "emulator@cloudprof.invalid",
                "private_key": pem, "token_uri": "https://oauth2.googleapis.com/token",
                "project_id": "emulator"})
        return _emulator_signer


class GcsBucket(Bucket):
    """``gs://name[/prefix]``: keys are relative to the prefix."""

    def __init__(self, url: str, project: str | None = None, workers: int = 8) -> None:
        if not url.startswith("gs://"):
            raise BucketError(f"not a GCS URL: {url!r} (expected gs://bucket[/prefix])")
        name, _, prefix = url[len("gs://"):].partition("/")
        validate_bucket_name(name)
        self.url = url
        self.name = name
        self.prefix = prefix.strip("/")
        self.project = project or next(
            (os.environ[e] for e in PROJECT_ENVS if os.environ.get(e)), None)
        self.workers = workers
        self._local = threading.local()
        self._checked = False

    # ---- plumbing

    def _client(self) -> Any:
        """One client per thread: uploads run in a pool and requests sessions are not shared."""
        client = getattr(self._local, "client", None)
        if client is None:
            from google.auth.exceptions import DefaultCredentialsError
            from google.cloud import storage

            try:
                client = storage.Client(project=self.project)
            except DefaultCredentialsError:
                raise CredentialsError(CREDENTIALS_HINT) from None
            except OSError as exc:  # no project found etc.
                raise CredentialsError(f"{CREDENTIALS_HINT} ({_short(str(exc), 120)})") from None
            self._local.client = client
        return client

    def _bucket(self) -> Any:
        bucket = self._client().bucket(self.name)
        if not self._checked:
            self._check(bucket)
        return bucket

    def _check(self, bucket: Any) -> None:
        """Missing bucket or no access: one line before any upload starts.

        Listing needs only storage.objects.list (what the role in infra/iam grants);
        ``get_bucket`` would need storage.buckets.get too.
        """
        try:
            list(self._client().list_blobs(bucket, max_results=1))
        except _api_errors() as exc:
            raise self._error(exc, "listing") from None
        self._checked = True

    def _error(self, exc: BaseException, action: str) -> Exception:
        from google.api_core import exceptions as gexc
        from google.auth.exceptions import DefaultCredentialsError, RefreshError

        if isinstance(exc, gexc.NotFound):
            return BucketError(f"bucket gs://{self.name} does not exist: create it with "
                               f"`gcloud storage buckets create gs://{self.name} "
                               "--location=REGION`")
        if isinstance(exc, gexc.Forbidden | gexc.Unauthorized):
            return BucketError(f"no permission for {action} in gs://{self.name}: "
                               f"{_short(getattr(exc, 'message', str(exc)), 160)} "
                               f"(roles needed: {IAM_DOC})")
        if isinstance(exc, DefaultCredentialsError | RefreshError):
            return CredentialsError(CREDENTIALS_HINT)
        if isinstance(exc, CredentialsError | BucketError):
            return exc
        return BucketError(f"gs://{self.name}: {action} failed: {_short(str(exc), 200)}")

    def _key(self, key: str) -> str:
        key = key.strip("/")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, name: str) -> str:
        return name[len(self.prefix) + 1:] if self.prefix else name

    # ---- Bucket interface

    def list(self, prefix: str) -> dict[str, str]:
        """Keys below the directory ``prefix`` ("" for all) with their md5 (hex)."""
        bucket = self._bucket()
        full = self._key(prefix) if prefix.strip("/") else self.prefix
        full = f"{full}/" if full else None
        try:
            blobs = list(self._client().list_blobs(bucket, prefix=full))
        except _api_errors() as exc:
            raise self._error(exc, "listing") from None
        return {self._rel(b.name): base64.b64decode(b.md5_hash).hex() if b.md5_hash else ""
                for b in blobs}

    # upload_dir and download_dir: Bucket's, over these two

    def put_file(self, path: Path, key: str, md5: str,
                 progress: Callable[[int], None] | None) -> None:
        try:
            self._client().bucket(self.name).blob(self._key(key)).upload_from_filename(
                str(path), checksum="md5", retry=_upload_retry())
        except _api_errors() as exc:
            raise self._error(exc, f"uploading {key}") from None
        if progress is not None:  # the client reports no bytes mid-file: one call a file
            progress(path.stat().st_size)

    def get_file(self, key: str, target: Path) -> None:
        try:
            with atomic_path(target) as tmp:
                self._client().bucket(self.name).blob(self._key(key)).download_to_filename(
                    str(tmp))
        except _api_errors() as exc:
            raise self._error(exc, f"downloading {key}") from None

    def signed_url(self, key: str, method: str = "GET", expires_s: int = 6 * 3600) -> str:
        """A V4 signed URL for one object and one method: all the VM ever gets.

        Signing needs a private key the user's ADC may not have: a service-account key
        or impersonated credentials sign directly; otherwise ``CLOUDPROF_GCS_SIGNER``
        names a service account whose key Google signs with (IAM signBlob).
        """
        method = method.upper()
        if method not in ("GET", "PUT"):
            raise UsageError(f"signed URLs are for GET or PUT, not {method}")
        blob = self._client().bucket(self.name).blob(self._key(key))
        kwargs: dict[str, Any] = {"version": "v4", "method": method,
                                  "expiration": dt.timedelta(seconds=expires_s)}
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator:
            if "://" not in emulator:
                emulator = f"http://{emulator}"
            kwargs.update(api_access_endpoint=emulator,
                          credentials=_emulator_signing_credentials())
        else:
            creds = self._client()._credentials
            signer = os.environ.get(SIGNER_ENV)
            if signer:
                import google.auth.transport.requests

                if not creds.valid:
                    creds.refresh(google.auth.transport.requests.Request())
                kwargs.update(service_account_email=signer, access_token=creds.token)
            elif not (hasattr(creds, "sign_bytes") and getattr(creds, "signer_email", None)):
                raise CredentialsError(
                    "GCS signed URLs need a signing identity: set "
                    f"{SIGNER_ENV}=SA_EMAIL (you need roles/iam.serviceAccountTokenCreator "
                    "on it), or run `gcloud auth application-default login "
                    "--impersonate-service-account=SA_EMAIL`")
        try:
            return blob.generate_signed_url(**kwargs)
        except _api_errors() as exc:
            raise self._error(exc, f"signing a URL for {key}") from None

    def delete_prefix(self, prefix: str) -> int:
        keys = list(self.list(prefix))

        def delete(key: str) -> int:
            from google.api_core import exceptions as gexc

            try:
                self._client().bucket(self.name).blob(self._key(key)).delete()
            except gexc.NotFound:
                return 0
            except _api_errors() as exc:
                raise self._error(exc, f"deleting {key}") from None
            return 1

        return sum(self._parallel(delete, keys))

    def put_bytes(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        blob = self._bucket().blob(self._key(key))
        blob.metadata = metadata or None
        try:
            blob.upload_from_string(data, content_type="application/json")
        except _api_errors() as exc:
            raise self._error(exc, f"writing {key}") from None

    def get_bytes(self, key: str) -> bytes | None:
        from google.api_core import exceptions as gexc

        try:
            return self._bucket().blob(self._key(key)).download_as_bytes()
        except gexc.NotFound:
            return None
        except _api_errors() as exc:
            raise self._error(exc, f"reading {key}") from None
