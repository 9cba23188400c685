"""Google Cloud: Compute Engine machines (``GcpProvider``); GCS buckets are ``gcp_storage``.

The google libraries are read through ``orchestrator.sdk`` so that importing this
module (the CLI does it only when ``--provider gcp`` is used) stays cheap. Every
SDK error becomes a one-line ``orchestrator.errors`` class (``sdk.gcp``), because
the sweep engine decides what to do by class: a ``CapacityError`` is worth one try
in the next zone, a ``QuotaError`` is not, a ``PermissionDeniedError`` points at
``infra/iam/gcp-roles.md``.

Settings read from the environment (docs/tutorials/google-cloud.md):
``CLOUDPROF_GCE_ENDPOINT`` (a Compute REST endpoint, e.g. the tests' fake; no
credentials are used then), ``CLOUDPROF_SSH_SOURCE_CIDR`` (who may reach port
22; default: this machine's public address), ``CLOUDPROF_GCS_SIGNER`` (the
service account that signs GCS URLs when ADC cannot sign), plus the standard
``GOOGLE_CLOUD_PROJECT``/``CLOUDSDK_CORE_PROJECT``, ``CLOUDSDK_COMPUTE_ZONE``,
``CLOUDSDK_COMPUTE_REGION`` and ``STORAGE_EMULATOR_HOST``.
"""

from __future__ import annotations

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
from typing import Any

from orchestrator import sdk
from orchestrator.errors import (
    CapacityError,
    ProviderError,
    UnreachableError,
    UsageError,
)
from orchestrator.providers.base import (
    LABEL_CREATED,
    LABEL_CREATOR,
    LABEL_EXPIRES,
    LABEL_SWEEP,
    Executor,
    Instance,
    Provider,
    ProviderOptions,
    Resource,
    VmRequest,
)
from orchestrator.sdk import gcp as sdk_gcp
from orchestrator.sdk.gcp import (
    CLOUD_PLATFORM,
    api_errors,
    compute_client,
    project_from_env,
    resolve_project,
    translate_api_error,
    translate_operation_error,
)

ZONE_ENV = "CLOUDSDK_COMPUTE_ZONE"
REGION_ENV = "CLOUDSDK_COMPUTE_REGION"

DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
# arm64 machines (t2a, c4a) boot the arm64 build of the same image family.
DEFAULT_IMAGES = {"x86_64": DEFAULT_IMAGE, "arm64": DEFAULT_IMAGE + "-arm64"}
DEFAULT_NETWORK = "global/networks/default"
GCE_DELETE_LEAD_S = 300  # GCE deletes this long before the startup script powers off
DEFAULT_LIFETIME_S = 6 * 3600  # expiry when the engine gave none: VMs never live unbounded
FIREWALL_DESCRIPTION = "cloudprof per-sweep SSH rule "  # then the labels as JSON
CLUSTER_DESCRIPTION = "cloudprof per-sweep cluster rule "  # then the labels as JSON
# What cleanup recognises as cloudprof's rules (firewall rules carry no labels on GCE).
RULE_DESCRIPTIONS = (FIREWALL_DESCRIPTION, CLUSTER_DESCRIPTION)
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
        return sdk_gcp.endpoint()

    def _creds(self) -> Any:
        if self._credentials is None:
            self._credentials, self._adc_project = sdk_gcp.credentials(
                CLOUD_PLATFORM, anonymous=bool(self._endpoint()))
        return self._credentials

    @property
    def project(self) -> str:
        if self._project is None:
            if not (self.options.project or project_from_env()):
                self._creds()  # ADC may name the project
            self._project = resolve_project(self.options.project, self._adc_project)
        return self._project

    def _client(self, kind: str) -> Any:
        with self._lock:
            if kind not in self._clients:
                self._clients[kind] = compute_client(kind, self._creds())
            return self._clients[kind]

    def check_credentials(self) -> None:
        """ADC exist, can mint a token (expired logins fail here, before any input is made),
        and a project is known."""
        creds = self._creds()
        _ = self.project
        if self._endpoint():
            return
        try:
            creds.refresh(sdk.google_auth_requests.Request())
        except api_errors() as exc:
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
        except api_errors() as exc:
            raise translate_api_error(exc, f"region {region}") from None
        return sorted(url.rsplit("/", 1)[-1] for url in reg.zones)

    # ---- operations

    def _retrying(self, what: str, call: Callable[[], Any], attempts: int = 4) -> Any:
        """``call()``, again after a transient 5xx/429, a few times only.

        google.api_core's ``Retry`` does the backoff (exponential with jitter, the one
        Google's clients use); it retries for a time, not a number of tries, so the
        ``on_error`` hook gives up after ``attempts`` by raising the last error.
        """
        failures: list[Exception] = []

        def give_up_after_attempts(exc: Exception) -> None:
            failures.append(exc)
            if len(failures) >= attempts:
                raise exc

        gexc = sdk.api_core_exceptions
        policy = sdk.api_core_retry.Retry(
            predicate=sdk.api_core_retry.if_exception_type(
                gexc.ServiceUnavailable, gexc.InternalServerError, gexc.TooManyRequests,
                gexc.GatewayTimeout),
            initial=self.poll_interval, maximum=10.0, multiplier=2.0, timeout=None,
            on_error=give_up_after_attempts,
        )
        try:
            return policy(call)()
        except api_errors() as exc:
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
        from orchestrator.providers import remote

        self._insert_rule(sdk.compute_v1.Firewall(
            name=firewall_name(sweep_id),
            network=DEFAULT_NETWORK,
            direction="INGRESS",
            priority=1000,
            allowed=[sdk.compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])],
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
        tag = sweep_tag(sweep_id)
        self._insert_rule(sdk.compute_v1.Firewall(
            name=cluster_firewall_name(sweep_id),
            network=DEFAULT_NETWORK,
            direction="INGRESS",
            priority=1000,
            allowed=[sdk.compute_v1.Allowed(I_p_protocol="tcp"),
                     sdk.compute_v1.Allowed(I_p_protocol="udp")],
            source_tags=[tag],
            target_tags=[tag],
            description=CLUSTER_DESCRIPTION + json.dumps(labels, sort_keys=True),
        ))

    def _insert_rule(self, rule: Any) -> None:
        """Create ``rule``; one that exists already was made by another VM of the sweep
        (nodes are created in parallel: GCE's 409 is what makes this once per sweep)."""
        what = f"firewall rule {rule.name}"
        try:
            op = self._client("FirewallsClient").insert(project=self.project,
                                                         firewall_resource=rule)
        except sdk.api_core_exceptions.Conflict:
            return
        except api_errors() as exc:
            raise translate_api_error(exc, what) from None
        self._wait(op, what, None)

    def _delete_firewall(self, name: str) -> None:
        what = f"deleting firewall rule {name}"
        try:
            op = self._client("FirewallsClient").delete(project=self.project, firewall=name)
        except sdk.api_core_exceptions.NotFound:
            return
        except api_errors() as exc:
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
        return sdk.compute_v1.Instance(
            name=resource_name(req.name),
            machine_type=f"zones/{zone}/machineTypes/{req.machine}",
            labels=labels,
            tags=sdk.compute_v1.Tags(items=[sweep_tag(req.sweep_id)]),
            disks=[sdk.compute_v1.AttachedDisk(
                boot=True, auto_delete=True, type_="PERSISTENT",
                initialize_params=sdk.compute_v1.AttachedDiskInitializeParams(
                    source_image=self._image(req.image, req.machine), disk_size_gb=req.disk_gb,
                    labels=labels))],
            network_interfaces=[sdk.compute_v1.NetworkInterface(
                network=DEFAULT_NETWORK,
                access_configs=[sdk.compute_v1.AccessConfig(name="External NAT",
                                                        type_="ONE_TO_ONE_NAT")])],
            metadata=sdk.compute_v1.Metadata(items=[
                sdk.compute_v1.Items(key="startup-script", value=req.startup_script),
                sdk.compute_v1.Items(key="ssh-keys",
                                 value=f"{req.ssh_user}:{req.ssh_public_key.strip()}"),
                # Only the sweep's key logs in: project-wide keys are not installed, and a
                # project-wide OS Login (which ignores metadata keys) is off for this VM.
                sdk.compute_v1.Items(key="block-project-ssh-keys", value="true"),
                sdk.compute_v1.Items(key="enable-oslogin", value="false"),
            ]),
            scheduling=sdk.compute_v1.Scheduling(**scheduling),
            # No service account: the VM holds no Google credentials at all (signed URLs).
        )

    def create(self, req: VmRequest) -> Instance:
        zone = self.zone_for(req)
        what = f"{req.machine} in {zone}"
        try:
            mt = self._client("MachineTypesClient").get(project=self.project, zone=zone,
                                                        machine_type=req.machine)
        except sdk.api_core_exceptions.NotFound:
            raise ProviderError(f"gcp: machine type {req.machine} does not exist in zone {zone} "
                                f"(see `gcloud compute machine-types list --zones={zone}`)"
                                ) from None
        except api_errors() as exc:
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
        except api_errors() as exc:
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
            except sdk.api_core_exceptions.NotFound:
                raise ProviderError(f"gcp: instance {inst.id} in {inst.zone} disappeared "
                                    "while starting (preempted or deleted)") from None
            except api_errors() as exc:
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
        zones = self.zones_in_region(region_of(zone))
        pos = zones.index(zone) if zone in zones else -1
        ordered = zones[pos + 1:] + zones[:max(pos, 0)]
        offered = []
        for other in ordered:
            try:
                self._client("MachineTypesClient").get(project=self.project, zone=other,
                                                       machine_type=machine)
            except sdk.api_core_exceptions.NotFound:
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
        zone = inst.zone or next((i.zone for i in self.list({}) if i.id == inst.id), None)
        if zone:
            what = f"deleting instance {inst.id} in {zone}"
            try:
                op = self._client("InstancesClient").delete(project=self.project, zone=zone,
                                                            instance=inst.id)
            except sdk.api_core_exceptions.NotFound:
                op = None
            except api_errors() as exc:
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
        except api_errors() as exc:
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
        except api_errors() as exc:
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
