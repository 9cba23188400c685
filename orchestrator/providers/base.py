"""The one interface every provider and bucket implements.

A provider makes machines exist (``create``/``delete``/``list``) and reachable
(``wait_ready``/``connect``), and lists and deletes what its sweeps left in a cloud
(``list_resources``/``delete_resources``, for ``cloudprof cleanup``); an
:class:`Executor` runs commands and moves files on one machine. The sweep engine
(``orchestrator.engine.sweep``) and cleanup only talk to these classes, so a new
cloud is one new module in this package plus a line in
``orchestrator.providers.__init__``.
"""

from __future__ import annotations

import abc
import getpass
import hashlib
import json
import posixpath
import re
import time
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

# A labelled bucket prefix keeps its labels in a small marker object under this
# root, one per prefix (``.cloudprof-labels/results/<sweep>/labels.json``), not
# inside the prefix itself: the sweep lists ``inputs/<hash>/`` to build what VMs
# download, and cleanup finds every labelled prefix with one short listing.
LABELS_ROOT = ".cloudprof-labels"
LABELS_FILE = "labels.json"
BUCKET_PREFIX = "bucket-prefix"  # Resource.kind of a labelled prefix


def creator_label() -> str:
    """The local user as a label value (GCP label values allow [a-z0-9_-], 63 chars)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return (re.sub(r"[^a-z0-9_-]+", "-", user.lower()).strip("-") or "unknown")[:63]


def sweep_labels(sweep: str, created: float, expires: float) -> dict[str, str]:
    """cloudprof's four labels, as every resource of a sweep carries them."""
    return {LABEL_SWEEP: sweep, LABEL_CREATOR: creator_label(),
            LABEL_CREATED: str(int(created)), LABEL_EXPIRES: str(int(expires))}


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
    # A node of a multi-node (Ray) sweep: the provider also opens every TCP/UDP port
    # between this sweep's own VMs, and to nothing else (docs/tutorials/scale-out.md): one rule
    # per sweep, deleted with the sweep's last VM like its SSH rule.
    cluster: bool = False
    node: int = 0  # which node of the machine (0: Ray's head); ssh: the group's i-th host


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
    # Where the sweep's other VMs reach it (AWS PrivateIpAddress, GCE networkIP): the
    # inter-node rule admits only traffic inside the network, so Ray binds to this one.
    # None for local and ssh hosts.
    private_address: str | None = None
    port: int = 22
    user: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    facts: dict[str, object] = field(default_factory=dict)  # vcpus, memory_gib read from host



class Resource:
    """Something a sweep made in a cloud (an instance, key pair, security group, firewall
    rule), as a provider's ``list_resources`` returns it and ``delete_resources`` takes it.

    ``cloudprof cleanup`` handles every cloud's leftovers through this one shape
    (``aws.AwsResource``, ``gcp.GcpResource`` are dataclasses deriving from it; so is
    :class:`LabelledPrefix`, which ``Bucket.labelled_prefixes`` returns), so it never
    makes a cloud call itself; what cleanup decides on comes from the labels.
    """

    kind: str  # "instance", a per-sweep "key-pair", "security-group", "firewall", or
    # "bucket-prefix" (LabelledPrefix: a bucket lists it, not a provider)
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
class LabelledPrefix(Resource):
    """A bucket prefix a sweep wrote, with the labels of its marker object.

    ``sweeps`` maps every sweep that still uses the prefix to that sweep's own expiry:
    an inputs prefix is a cache shared by sweeps, and cleanup must not delete it under
    one that has not expired. The ``expires`` label adds the prefix's retention to the
    latest of them.
    """

    id: str  # the prefix, "results/<sweep>/" or "inputs/<hash>/"
    region: str  # the bucket's URL: where the prefix lives
    labels: dict[str, str] = field(default_factory=dict)
    sweeps: dict[str, float] = field(default_factory=dict)
    kind: str = BUCKET_PREFIX
    name: str = ""
    state: str = ""
    zone: str | None = None

    def users_alive(self, now: float, besides: str | None = None) -> list[str]:
        """Sweeps other than ``besides`` that use the prefix and have not expired yet."""
        return sorted(s for s, expires in self.sweeps.items() if s != besides and expires > now)

@dataclass
class CommandResult:
    exit_code: int
    stdout_tail: str  # last lines, for error messages
    stderr_tail: str

    def last_line(self, default: str = "(no output)",
                  skip: Callable[[str], bool] | None = None) -> str:
        """The last non-blank line of stderr (of stdout when stderr is empty), stripped.

        The one line a failed command's error message quotes; ``skip`` drops lines that
        are not the command's own words (the runner's progress lines).
        """
        lines = [ln.strip() for ln in (self.stderr_tail or self.stdout_tail or "").splitlines()
                 if ln.strip() and not (skip is not None and skip(ln))]
        return lines[-1] if lines else default


def file_md5(path: Path, chunk: int = 1 << 20) -> str:
    """The md5 (hex) of a file's content, read in chunks: how every bucket tells an object
    that is already there (its stored md5) from one that must be sent again."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class Executor(abc.ABC):
    """Runs commands and moves files on one host (a subprocess, or SSH)."""

    workdir: str  # directory on the host that holds cloudprof's files
    python: str  # interpreter on the host that has ``workloads`` importable

    @property
    def cache_dir(self) -> str:
        """Directory on the host that outlives a sweep: the job's copies and what
        ``--setup`` built in them (``orchestrator.engine.jobs``), reused by later sweeps.
        By default the host's workdir, in the login user's home on a VM."""
        return self.workdir

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
        """Copy one file from the host; raise FileNotFoundError when it is absent.

        A failure to write ``local`` (disk full, permissions) is the OSError itself,
        never a remote error: the engine must tell its own disk failing from the host's.
        """

    def put_bytes(self, data: bytes, remote: str) -> None:
        """Write ``data`` to ``remote``; by default through a temporary local file, which an
        executor that can send from memory avoids (so that a full local disk does not stop
        a finished trial's results from reaching the bucket)."""
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / posixpath.basename(remote)
            local.write_bytes(data)
            self.put(local, remote)

    def ensure_workloads(self, wheels: Any = None) -> None:  # noqa: B027 - optional hook
        """Make ``python -m workloads.run`` runnable on the host (ship the wheel over SSH;
        ``wheels``: the sweep's staged wheel set, ``wheelhouse.WheelSource``).

        A no-op where the host already runs this checkout (the local provider).
        """

    def ensure_profiler(self, kind: str) -> str | None:
        """Make ``--profile kind`` possible on the host; None, or one line saying why not.

        A no-op where the host runs this checkout's environment (the local
        provider): the runner itself says when py-spy or memray is missing.
        """
        return None

    def ensure_ray(self) -> str | None:
        """Make ``ray start`` and ``import ray`` work in the trial env; None, or one line
        saying why not.

        Asked only for a multi-node sweep (Ray is an optional extra, never installed
        for the others). By default a check only, in the host's own interpreter: an
        executor that can install into its host's env (SSH) overrides it.
        """
        from orchestrator.ray_support import RAY_FOUND_CHECK, RAY_INSTALL_HINT

        result = self.run([self.python, "-c", RAY_FOUND_CHECK], timeout=120)
        if result.exit_code == 0:
            return None

        return f"ray is not importable by {self.python}: {RAY_INSTALL_HINT}"

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


class Provider(abc.ABC):
    """Creates, reaches and deletes the machines of a sweep."""

    name: ClassVar[str]
    creates_machines: ClassVar[bool] = True  # False for local and ssh: nothing to delete
    # Whether the sweep may work on several of this provider's machines at once. The
    # local provider says no: its "machines" share this one computer, so trials run
    # one machine after another and each measures alone.
    concurrent_machines: ClassVar[bool] = True

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

    def check_nodes(self, machine: str, nodes: int) -> list[str]:
        """Before anything is created: refuse (UsageError) a machine that cannot be ``nodes``
        nodes of one cluster; the warnings to print. A cloud makes any number alike."""
        return []

    # -- leftovers: what ``cloudprof cleanup`` and a failed teardown's message list

    def list_resources(self, labels: dict[str, str] | None = None) -> list[Resource]:
        """Everything this provider made that carries all of ``labels`` (every cloudprof
        resource when None or empty): instances and what was made for them (key pairs,
        security groups, firewall rules), each a :class:`Resource` with its labels.

        By default nothing: a provider that makes no machines (local, ssh) leaves
        nothing behind in a cloud. A cloud overrides it and :meth:`delete_resources`.
        """
        return []

    def delete_resources(self, resources: Sequence[Resource]) -> None:
        """Delete what :meth:`list_resources` returned: instances first, then what they
        used; absent is fine. A failure raises a ProviderError subclass.

        By default there is never anything to delete (see :meth:`list_resources`).
        """
        if resources:
            raise NotImplementedError(f"{self.name} lists no resources, so deletes none")


class Bucket(abc.ABC):
    """Object storage for a sweep's inputs and results."""

    url: str  # "gs://name", "s3://name" or a local directory path
    workers: int = 8  # parallel transfers of upload_dir/download_dir

    def upload_dir(self, local_dir: Path, prefix: str,
                   progress: Callable[[int], None] | None = None) -> list[str]:
        """Upload every file below ``local_dir`` under ``prefix`` (in parallel).

        Skips objects whose content hash already matches; returns the keys uploaded.
        ``progress`` is called (from any thread) with each number of bytes sent, as
        they are sent, for a display of bytes and MB/s.

        Written once over :meth:`put_file`, so that what is skipped and how keys are
        formed is the same in every cloud; a bucket with no objects to send (the local
        one) overrides it.
        """
        from orchestrator.errors import BucketError

        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise BucketError(f"nothing to upload: {local_dir} is not a directory")
        existing = self.list(prefix)
        todo: list[tuple[Path, str, str]] = []
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            key = f"{prefix.strip('/')}/{path.relative_to(local_dir).as_posix()}".lstrip("/")
            md5 = file_md5(path)
            if existing.get(key) != md5:
                todo.append((path, key, md5))

        def upload(item: tuple[Path, str, str]) -> str:
            path, key, md5 = item
            self.put_file(path, key, md5, progress)
            return key

        return self._parallel(upload, todo)

    def download_dir(self, prefix: str, local_dir: Path) -> list[Path]:
        """Download every object below ``prefix``; returns the local paths.

        A local file whose md5 is already the object's is kept as it is; the others are
        written whole or not at all (:meth:`get_file`). Written once over ``get_file``;
        the local bucket overrides it.
        """
        local_dir = Path(local_dir)
        root = prefix.strip("/")

        def download(item: tuple[str, str]) -> Path:
            key, md5 = item
            target = local_dir / (key[len(root):].lstrip("/") if root else key)
            if not (md5 and target.is_file() and file_md5(target) == md5):
                self.get_file(key, target)
            return target

        return self._parallel(download, sorted(self.list(prefix).items()))

    def put_file(self, path: Path, key: str, md5: str,
                 progress: Callable[[int], None] | None) -> None:
        """Send one file to ``key`` (``md5``: its content hash, stored where the store's own
        does not say it); report the bytes sent to ``progress``. One cloud call, the one
        to retry; a bucket that uses ``upload_dir`` as written here implements it."""
        raise NotImplementedError(f"{type(self).__name__} uploads through its own upload_dir")

    def get_file(self, key: str, target: Path) -> None:
        """Write object ``key`` to ``target`` atomically (parents made); a bucket that uses
        ``download_dir`` as written here implements it."""
        raise NotImplementedError(f"{type(self).__name__} downloads through its own "
                                  "download_dir")

    def _parallel(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``fn`` over ``items`` on ``workers`` threads, results in order; the first error
        raised is raised."""
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(max_workers=self.workers) as pool:
            return list(pool.map(fn, items))

    @abc.abstractmethod
    def list(self, prefix: str) -> dict[str, str]:
        """Keys below ``prefix`` mapped to their content hash (md5 hex)."""

    @abc.abstractmethod
    def signed_url(self, key: str, method: str = "GET", expires_s: int = 6 * 3600) -> str:
        """A URL a VM can GET (inputs) or PUT (results) with no credentials of the user."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete every object below ``prefix``; returns how many."""

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        """Write one small object (``metadata`` as object metadata where the store has it)."""

    @abc.abstractmethod
    def get_bytes(self, key: str) -> bytes | None:
        """One small object's content; None when it does not exist."""

    # -- labelled prefixes: written once here, over the two primitives above

    def label_prefix(self, prefix: str, sweep: str, sweep_expires: float,
                     retention_s: float) -> LabelledPrefix:
        """Write (or refresh) ``prefix``'s marker before anything else goes under it.

        A prefix shared by sweeps (the inputs cache) keeps the creation time of its
        first sweep, names the latest in ``cloudprof-sweep``, remembers every sweep
        still running on it, and expires ``retention_s`` after the last of them.
        Concurrent sweeps refreshing one marker may drop each other's entry: the
        expiry still only moves later, so the prefix is never deleted early by it.
        """
        now = time.time()
        old = self.prefix_labels(prefix)
        sweeps = {s: t for s, t in (old.sweeps if old else {}).items() if t > now}
        sweeps[sweep] = float(int(sweep_expires))
        created = old.created_at if old and old.created_at is not None else now
        expires = max(sweep_expires + retention_s, (old.expires_at or 0) if old else 0)
        labels = sweep_labels(sweep, created, expires)
        body = {"bucket": self.url, "prefix": _dir(prefix), "labels": labels, "sweeps": sweeps}
        self.put_bytes(marker_key(prefix), json.dumps(body, indent=1).encode(), labels)
        return LabelledPrefix(id=_dir(prefix), region=self.url, labels=labels, sweeps=sweeps)

    def prefix_labels(self, prefix: str) -> LabelledPrefix | None:
        """The labels of ``prefix``; None when it has no marker."""
        data = self.get_bytes(marker_key(prefix))
        return None if data is None else self._parse_marker(_dir(prefix), data)

    def labelled_prefixes(self) -> list[LabelledPrefix]:
        """Every prefix of this bucket with a marker (a marker that does not parse shows
        with no labels, so cleanup lists it but never picks it by expiry)."""
        tail = f"/{LABELS_FILE}"
        out = []
        for key in sorted(self.list(f"{LABELS_ROOT}/")):
            if key.startswith(f"{LABELS_ROOT}/") and key.endswith(tail):
                data = self.get_bytes(key)
                if data is not None:
                    out.append(self._parse_marker(key[len(LABELS_ROOT) + 1:-len(LABELS_FILE)],
                                                  data))
        return out

    def delete_labelled(self, prefix: str) -> int:
        """Delete ``prefix``, its marker last: a failure half-way leaves it still labelled."""
        deleted = self.delete_prefix(_dir(prefix))
        self.delete_prefix(f"{LABELS_ROOT}/{_dir(prefix)}")
        return deleted

    def _parse_marker(self, prefix: str, data: bytes) -> LabelledPrefix:
        try:
            body = json.loads(data)
            labels = {str(k): str(v) for k, v in body["labels"].items()}
            sweeps = {str(k): float(v) for k, v in body.get("sweeps", {}).items()}
        except (ValueError, TypeError, KeyError, AttributeError):
            labels, sweeps = {}, {}
        return LabelledPrefix(id=prefix, region=self.url, labels=labels, sweeps=sweeps)


def _dir(prefix: str) -> str:
    return f"{prefix.strip('/')}/"


def marker_key(prefix: str) -> str:
    """The key of ``prefix``'s marker object."""
    return f"{LABELS_ROOT}/{_dir(prefix)}{LABELS_FILE}"


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
    ssh: Any = None  # the sweep's orchestrator.providers.remote.SshKeys, set by the engine
    sweep_id: str | None = None
