"""Every ``CLOUDPROF_*`` environment variable: its purpose, its type, who reads it.

One list, so a reader finds them all in one place and the docs cannot miss one
(``docs/reference/settings.md`` is checked against it by the tests). Settings come
in three kinds:

- **user settings**, read on this machine (the control plane);
- **host settings**, read by ``workloads/`` on the machine a trial runs on (which
  never imports this package: the names are listed here and read there);
- **test seams**, which point cloudprof at a local stand-in of a cloud API (the
  tests' fake Compute Engine, billing catalog or loopback sshd). A user never
  needs one; set by mistake, they send requests to the wrong place.

Code reads a setting through its ``Setting`` (``settings.CACHE.get()``), never by
spelling the name again. ``spec.environment`` checks every set value before
anything is paid for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

USER = "user"
HOST = "host"
SEAM = "test seam"


@dataclass(frozen=True)
class Setting:
    """One environment variable cloudprof reads."""

    name: str
    type: str  # the value's form, as the docs table shows it
    purpose: str
    default: str = ""  # what applies when it is unset, in words
    kind: str = USER  # USER, HOST or SEAM

    def get(self) -> str | None:
        """The value as set; None when unset or empty (an empty value means the default)."""
        return os.environ.get(self.name) or None


# ---------------------------------------------------------------- user settings

CACHE = Setting(
    "CLOUDPROF_CACHE", "directory",
    "root of cloudprof's cache: generated inputs, job archives, refreshed catalogs, the "
    "local bucket (read on the hosts too, for their input cache)", "~/.cache/cloudprof")
CATALOG_DIR = Setting(
    "CLOUDPROF_CATALOG_DIR", "directory",
    "read machine types and prices from `<dir>/<provider>.csv` only, instead of the "
    "refreshed and the shipped catalogs", "the refreshed catalog, else the shipped one")
MAX_WORKDIR = Setting(
    "CLOUDPROF_MAX_WORKDIR", "size (e.g. 512M)",
    "largest `--workdir` archive shipped to every host", "256M")
WARM_RUNNER = Setting(
    "CLOUDPROF_WARM_RUNNER", "switch (1 or 0)",
    "0 starts every trial as a fresh interpreter instead of the warm runner", "1")
DELETE_BACKOFF_S = Setting(
    "CLOUDPROF_DELETE_BACKOFF_S", "seconds (0-600)",
    "delay before the first retry of a failed VM deletion (then doubled)", "2")
AWS_IMAGE = Setting(
    "CLOUDPROF_AWS_IMAGE", "image name, SSM parameter path or AMI id",
    "the image AWS VMs boot when the request names none", "debian-12")
GCS_SIGNER = Setting(
    "CLOUDPROF_GCS_SIGNER", "service-account email",
    "the service account whose key signs GCS URLs when the credentials cannot sign",
    "the credentials' own key")
SSH_SOURCE_CIDR = Setting(
    "CLOUDPROF_SSH_SOURCE_CIDR", "CIDR",
    "who may reach a VM's port 22 (the per-sweep firewall rule or security group)",
    "this machine's public address")
SSH_USER = Setting(
    "CLOUDPROF_SSH_USER", "login name", "the login user on the hosts", "the provider's for its VMs")
SSH_KEY = Setting(
    "CLOUDPROF_SSH_KEY", "file (private key)",
    "a client private key to use instead of the sweep's generated one",
    "one generated per sweep")
SSH_HOST_KEY = Setting(
    "CLOUDPROF_SSH_HOST_KEY", "file (private key)",
    "a host private key to use instead of a generated one (for an sshd already running "
    "with it)", "one generated per sweep")
SSH_WORKDIR = Setting(
    "CLOUDPROF_SSH_WORKDIR", "absolute directory on the host",
    "the directory on each host that holds cloudprof's files", "~/.cloudprof")
SSH_PYTHON = Setting(
    "CLOUDPROF_SSH_PYTHON", "command or path",
    "the host's interpreter the bootstrap venv is built from", "python3")
SSH_BOOT_TIMEOUT = Setting(
    "CLOUDPROF_SSH_BOOT_TIMEOUT", "seconds",
    "how long to wait for a new VM's sshd, and the reconnect budget: how long to keep "
    "logging in again to any host after its connection dropped (never past the trial's "
    "time limit)", "300")

# ---------------------------------------------------------------- host settings

NO_CGROUP = Setting(
    "CLOUDPROF_NO_CGROUP", "switch (1)",
    "measure a trial's memory by sampling instead of in a cgroup of its own",
    "a cgroup where the host allows one", HOST)
PYSPY = Setting(
    "CLOUDPROF_PYSPY", "file", "the py-spy executable the CPU profile runs",
    "py-spy next to the interpreter, else on PATH", HOST)
PYSPY_RATE = Setting(
    "CLOUDPROF_PYSPY_RATE", "samples per second", "py-spy's sampling rate", "100", HOST)
PYSPY_MODE = Setting(
    "CLOUDPROF_PYSPY_MODE", "nonblocking, blocking or native",
    "how py-spy reads the program: never pausing it, pausing it, or pausing it and "
    "unwinding native frames",
    "nonblocking", HOST)
TORCH_PEAK_FILE = Setting(
    "CLOUDPROF_TORCH_PEAK_FILE", "file",
    "set by the runner for a `--command` trial on a machine with an NVIDIA driver: where "
    "the torch hook writes PyTorch's CUDA memory peak", "unset: no hook", HOST)
HEAP_FILE = Setting(
    "CLOUDPROF_HEAP_FILE", "file",
    "set by the runner for a `--profile memory` `--command` trial: where each of the job's "
    "Python processes writes its heap census (FILE.<pid>)", "unset: no census", HOST)
NODE_CGROUP_NOTE = Setting(
    "CLOUDPROF_NODE_CGROUP_NOTE", "text",
    "set by a Ray trial for its actors: why the node has no cgroup", "unset", HOST)

# ---------------------------------------------------------------- test seams

SSH_ENDPOINT = Setting(
    "CLOUDPROF_SSH_ENDPOINT", "host:port",
    "reach every VM at this address instead of the one the cloud returns (the tests' "
    "loopback sshd)", "the VM's address", SEAM)
GCE_ENDPOINT = Setting(
    "CLOUDPROF_GCE_ENDPOINT", "URL",
    "a Compute Engine REST endpoint to call, with no credentials (the tests' fake GCE)",
    "Google's", SEAM)
GCP_BILLING_ENDPOINT = Setting(
    "CLOUDPROF_GCP_BILLING_ENDPOINT", "URL",
    "a Cloud Billing catalog endpoint for `catalog refresh`, with no credentials (the "
    "tests' fake)", "Google's", SEAM)
REPORT_BUNDLE_DIR = Setting(
    "CLOUDPROF_REPORT_BUNDLE_DIR", "directory",
    "where the report page's Vega bundle is kept (the tests give their many per-test "
    "caches one, instead of 1.6 s of bundling per report)", "$CLOUDPROF_CACHE/report",
    SEAM)

SETTINGS: tuple[Setting, ...] = (
    CACHE, CATALOG_DIR, MAX_WORKDIR, WARM_RUNNER, DELETE_BACKOFF_S, AWS_IMAGE, GCS_SIGNER,
    SSH_SOURCE_CIDR, SSH_USER, SSH_KEY, SSH_HOST_KEY, SSH_WORKDIR, SSH_PYTHON, SSH_BOOT_TIMEOUT,
    NO_CGROUP, PYSPY, PYSPY_RATE, PYSPY_MODE, TORCH_PEAK_FILE, HEAP_FILE, NODE_CGROUP_NOTE,
    SSH_ENDPOINT, GCE_ENDPOINT, GCP_BILLING_ENDPOINT, REPORT_BUNDLE_DIR,
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def cache_root() -> Path:
    """``$CLOUDPROF_CACHE``, else ``~/.cache/cloudprof``: the one root of every cache."""
    root = CACHE.get()
    return Path(root) if root else Path.home() / ".cache" / "cloudprof"


def markdown_table(kind: str) -> str:
    """The docs table of one kind of setting (``docs/reference/settings.md`` holds each
    verbatim; a test compares them): ``python -m orchestrator.settings`` prints them."""
    rows = ["| variable | type | purpose | default |", "| --- | --- | --- | --- |"]
    rows += [f"| `{s.name}` | {s.type} | {s.purpose} | {s.default} |"
             for s in SETTINGS if s.kind == kind]
    return "\n".join(rows)


if __name__ == "__main__":
    for each in (USER, HOST, SEAM):
        print(f"{each}:\n\n{markdown_table(each)}\n")
