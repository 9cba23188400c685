"""The one interface every provider and bucket implements.

A provider makes machines exist (``create``/``delete``/``list``) and reachable
(``wait_ready``/``connect``); an :class:`Executor` runs commands and moves files
on one machine. The sweep engine (``orchestrator.sweep``) only talks to these
classes, so a new cloud is one new module in this package plus a line in
``orchestrator.providers.__init__``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

# Label keys every resource a sweep creates carries (GCP label keys allow
# [a-z0-9_-]; AWS tags accept the same), values are lower-case too.
LABEL_SWEEP = "cloudprof-sweep"
LABEL_CREATOR = "cloudprof-creator"
LABEL_CREATED = "cloudprof-created"  # unix seconds
LABEL_EXPIRES = "cloudprof-expires"  # unix seconds


@dataclass
class VmRequest:
    """Everything a provider needs to create one VM of a sweep."""

    sweep_id: str
    name: str  # unique, DNS-safe: "cp-<sweep>-<machine-slug>"
    machine: str  # machine type, e.g. "n2-highcpu-80" or "c6i.large"
    region: str | None
    zone: str | None
    spot: bool
    labels: dict[str, str]
    ssh_user: str
    ssh_public_key: str  # OpenSSH one-liner of the sweep's key
    startup_script: str  # shell script run at first boot (infra/startup.sh, rendered)
    image: str | None = None  # provider default when None (GCP image family / SSM parameter)
    disk_gb: int = 20


@dataclass
class Instance:
    """A machine as the provider reports it."""

    provider: str
    id: str  # provider's id: GCE instance name, EC2 instance id, ssh host alias, "local"
    name: str
    machine: str
    zone: str | None = None
    state: str = "unknown"  # provider's own state string
    address: str | None = None  # where SSH reaches it (after CLOUDPROF_SSH_ENDPOINT)
    port: int = 22
    user: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    facts: dict[str, object] = field(default_factory=dict)  # vcpus, memory_gib read from host



class Resource:
    """Something a sweep made in a cloud (an instance, key pair, security group, firewall
    rule), as a cloud module's ``list_resources`` returns it and ``delete_resources`` takes it.

    ``cloudprof cleanup`` handles every cloud's leftovers through this one shape
    (``aws.AwsResource``, ``gcp.GcpResource`` are dataclasses deriving from it), so it
    never makes a cloud call itself; what cleanup decides on comes from the labels.
    """

    kind: str  # "instance", or a per-sweep resource: "key-pair", "security-group", "firewall"
    id: str
    name: str
    state: str
    labels: dict[str, str]
    zone: str | None
    region: str | None

    @property
    def sweep_id(self) -> str | None:
        return self.labels.get(LABEL_SWEEP)

    @property
    def expires_at(self) -> float | None:
        """Unix time of the expiry label (None when absent or unreadable)."""
        return _label_time(self.labels, LABEL_EXPIRES)

    @property
    def created_at(self) -> float | None:
        return _label_time(self.labels, LABEL_CREATED)


def _label_time(labels: dict[str, str], key: str) -> float | None:
    try:
        return float(labels[key])
    except (KeyError, ValueError):
        return None

@dataclass
class CommandResult:
    exit_code: int
    stdout_tail: str  # last lines, for error messages
    stderr_tail: str


class Executor(abc.ABC):
    """Runs commands and moves files on one host (a subprocess, or SSH)."""

    workdir: str  # directory on the host that holds cloudprof's files
    python: str  # interpreter on the host that has ``workloads`` importable

    @abc.abstractmethod
    def run(
        self,
        argv: Sequence[str],
        *,
        on_line: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run ``argv`` (never through an unquoted shell); stream each stderr/stdout line."""

    @abc.abstractmethod
    def put(self, local: Path, remote: str) -> None:
        """Copy one local file to ``remote`` (a path on the host)."""

    @abc.abstractmethod
    def get(self, remote: str, local: Path) -> None:
        """Copy one file from the host; raise FileNotFoundError when it is absent."""

    def ensure_workloads(self) -> None:  # noqa: B027 - optional hook
        """Make ``python -m workloads.run`` runnable on the host (ship the wheel over SSH).

        A no-op where the host already runs this checkout (the local provider).
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


class Provider(abc.ABC):
    """Creates, reaches and deletes the machines of a sweep."""

    name: ClassVar[str]
    creates_machines: ClassVar[bool] = True  # False for local and ssh: nothing to delete

    @abc.abstractmethod
    def check_credentials(self) -> None:
        """Raise CredentialsError saying how to set them up (and that --dry-run needs none)."""

    @abc.abstractmethod
    def create(self, req: VmRequest) -> Instance:
        """Start creating the VM; return at once with its id (record it before waiting)."""

    @abc.abstractmethod
    def wait_ready(self, inst: Instance, timeout: float = 600) -> Instance:
        """Wait until running with an address; raise ProviderError subclasses on failure."""

    @abc.abstractmethod
    def connect(self, inst: Instance) -> Executor:
        """An executor on the instance (waits for SSH with backoff where there is SSH)."""

    @abc.abstractmethod
    def delete(self, inst: Instance) -> None:
        """Delete the instance and what was made for it; idempotent, absent is fine."""

    @abc.abstractmethod
    def list(self, labels: dict[str, str]) -> list[Instance]:
        """Instances carrying all of ``labels`` (used by cleanup and resume)."""


class Bucket(abc.ABC):
    """Object storage for a sweep's inputs and results."""

    url: str  # "gs://name", "s3://name" or a local directory path

    @abc.abstractmethod
    def upload_dir(self, local_dir: Path, prefix: str) -> list[str]:
        """Upload every file below ``local_dir`` under ``prefix`` (in parallel).

        Skips objects whose content hash already matches; returns the keys uploaded.
        """

    @abc.abstractmethod
    def download_dir(self, prefix: str, local_dir: Path) -> list[Path]:
        """Download every object below ``prefix``; returns the local paths."""

    @abc.abstractmethod
    def list(self, prefix: str) -> dict[str, str]:
        """Keys below ``prefix`` mapped to their content hash (md5 hex)."""

    @abc.abstractmethod
    def signed_url(self, key: str, method: str = "GET", expires_s: int = 6 * 3600) -> str:
        """A URL a VM can GET (inputs) or PUT (results) with no credentials of the user."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete every object below ``prefix``; returns how many."""


@dataclass
class ProviderOptions:
    """What the CLI/config give a provider; each provider reads the fields it needs."""

    region: str | None = None
    zone: str | None = None
    project: str | None = None  # GCP project (else from the environment / ADC)
    hosts_file: Path | None = None  # ssh provider: TOML list of hosts
    hosts: list[str] = field(default_factory=list)  # ssh provider: user@addr[:port]
    ssh_key: Path | None = None  # use this private key instead of a per-sweep one
    workdir: Path | None = None  # local provider: where its "hosts" live
    ssh: Any = None  # the sweep's orchestrator.remote.SshKeys, set by the engine
    sweep_id: str | None = None
