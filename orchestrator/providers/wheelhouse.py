"""Bootstrap once per sweep: the wheels a host's trial env needs, fetched once here.

Why: every host of a sweep used to pip-install numpy, pyarrow and psutil from the
package index on its own — the same ~70 MB once per VM, and a sweep that fails
where the VMs' network reaches no index. Now this machine downloads the set once
per (requirements, Python, platform) the sweep's hosts report (``pip download
--only-binary=:all:`` for their tags), keeps it in ``$CLOUDPROF_CACHE/wheels/<key>``
(else ``~/.cache/cloudprof/wheels``) for later sweeps, and the hosts install from
it with ``pip install --no-index --find-links``. Hosts behind the sweep's bucket
fetch the set from there (staged once under ``wheels/<key>/``, like the inputs,
through signed URLs); the others get it copied over SSH. A platform with no wheel,
or a set that does not install, falls back to the index, and a line says so.

The platform is asked of the host itself (its ``python3``, machine and glibc),
so x86_64 and arm64 hosts of one sweep each get their own set.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import BucketError, RemoteCommandError
from orchestrator.providers.wheels import WHEEL_DEPS, requirements

if TYPE_CHECKING:
    from orchestrator.providers.base import Bucket, Executor

# pip's own wheel, staged with the packages: the host runs pip from it to install the set
# and pip itself into an env made without pip (infra/bootstrap/install.sh), instead of
# ensurepip's run and apt's python3-venv.
INSTALLERS = ("pip",)
CACHE_ENV = "CLOUDPROF_CACHE"  # cloudprof's cache root (shared with the catalog, inputs)
LISTING = "wheels.json"  # in a complete set's directory: what it holds and for what
HOST_DONE = ".complete"  # on a host: the set's directory holds every file
BUCKET_PREFIX = "wheels"
RETENTION_S = 7 * 86400  # a staged set outlives the last sweep that used it by a week
DOWNLOAD_TIMEOUT_S = 900
# manylinux tags start at glibc 2.5 on x86_64 (manylinux1) and 2.17 on aarch64 (2014).
OLDEST_GLIBC = {"x86_64": 5, "aarch64": 17}
ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
# A host's platform, and whether its python3 has the packages already (then its env reuses
# them: nothing to stage). Prints e.g. "need 3.11 x86_64 glibc 2.36".
PROBE = """import platform, sys
try:
    import __DEPS__
    have = "have"
except ImportError:
    have = "need"
print(have, "%d.%d" % sys.version_info[:2], platform.machine(), *platform.libc_ver())
""".replace("__DEPS__", ", ".join(WHEEL_DEPS))


class WheelsUnavailable(Exception):
    """No wheel set for a platform: the host installs from the index instead."""


@dataclass(frozen=True)
class HostPlatform:
    """What decides which wheels a host can install: its Python and its platform."""

    python: str  # "3.11"
    machine: str  # "x86_64" | "aarch64" (arm64 hosts report either)
    glibc: str | None = None  # "2.36"; None: another libc (musl), no manylinux wheel

    @classmethod
    def parse(cls, line: str) -> HostPlatform | None:
        """From :data:`PROBE`'s output less its first word ("3.11 x86_64 glibc 2.36");
        None when unreadable."""
        words = line.split()
        if len(words) < 2 or not all(p.isdigit() for p in words[0].split(".")):
            return None
        glibc = words[3] if len(words) >= 4 and words[2] == "glibc" else None
        return cls(words[0], ARCHES.get(words[1], words[1]), glibc)

    @property
    def label(self) -> str:
        libc = f"glibc {self.glibc}" if self.glibc else "no glibc"
        return f"cp{self.python.replace('.', '')} {self.machine} {libc}"

    def tags(self) -> list[str]:
        """Its manylinux platform tags, newest first (pip takes them as given, never
        widening them); empty where no manylinux wheel can be installed."""
        oldest = OLDEST_GLIBC.get(self.machine)
        if oldest is None or not self.glibc:
            return []
        major, _, minor = self.glibc.partition(".")
        if major != "2" or not minor.isdigit():
            return []
        tags = [f"manylinux_2_{m}_{self.machine}" for m in range(int(minor), oldest - 1, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        return tags + [f"{name}_{self.machine}" for m, name in legacy.items()
                       if oldest <= m <= int(minor)]

    def abis(self) -> list[str]:
        return [f"cp{self.python.replace('.', '')}", "abi3", "none"]


def cache_key(reqs: Sequence[str], platform: HostPlatform) -> str:
    """The set's name: the same requirements for the same Python and tags share one."""
    blob = json.dumps({"requirements": sorted(reqs), "python": platform.python,
                       "implementation": "cp", "abis": platform.abis(),
                       "platforms": platform.tags()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_root() -> Path:
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "cloudprof"
    return Path(root) / "wheels"


@dataclass
class WheelSet:
    """A complete set of wheels on this machine."""

    key: str
    directory: Path
    files: list[str]
    cached: bool  # found in the cache, not downloaded now
    seconds: float

    @property
    def size(self) -> int:
        return sum((self.directory / name).stat().st_size for name in self.files)


def download_command(reqs: Sequence[str], platform: HostPlatform, dest: Path) -> list[str]:
    """``pip download`` of ``reqs`` as wheels for ``platform`` (never this machine's)."""
    argv = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-input",
            "--disable-pip-version-check", "--quiet", "--implementation", "cp",
            "--python-version", platform.python, "--dest", str(dest)]
    for abi in platform.abis():
        argv += ["--abi", abi]
    for tag in platform.tags():
        argv += ["--platform", tag]
    return [*argv, *reqs]


def fetch(reqs: Sequence[str], platform: HostPlatform, root: Path | None = None) -> WheelSet:
    """The wheel set for ``platform``: from the cache, else downloaded into it (once, even
    for several sweeps at a time: a lock per set). WheelsUnavailable when pip finds none."""
    if not platform.tags():
        raise WheelsUnavailable(f"no manylinux wheels for {platform.label}")
    root = root or cache_root()
    key = cache_key(reqs, platform)
    final = root / key
    start = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    with (root / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / LISTING).exists():
            files = json.loads((final / LISTING).read_text())["files"]
            return WheelSet(key, final, files, True, time.monotonic() - start)
        tmp = root / f"{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            done = subprocess.run(download_command(reqs, platform, tmp), capture_output=True,
                                  text=True, timeout=DOWNLOAD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise WheelsUnavailable(f"pip download failed: {exc}") from None
        if done.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            lines = [ln for ln in done.stderr.splitlines() if ln.startswith("ERROR")]
            raise WheelsUnavailable((lines or done.stderr.splitlines() or ["pip failed"])[-1])
        files = sorted(p.name for p in tmp.glob("*.whl"))
        (tmp / LISTING).write_text(json.dumps({"requirements": list(reqs), "files": files,
                                               "platform": platform.label,
                                               "tags": platform.tags()}, indent=1))
        shutil.rmtree(final, ignore_errors=True)  # a set without its listing is half-made
        tmp.rename(final)
    return WheelSet(key, final, files, False, time.monotonic() - start)


def staged_requirements() -> list[str]:
    """What a sweep stages for a host that lacks them: the data plane's packages and the
    installers of ``INSTALLERS``."""
    return [*requirements(), *INSTALLERS]


def _name(requirement: str) -> str:
    """``numpy`` of ``numpy>=1.24``."""
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]


def _mb(size: int) -> str:
    return f"{size / 1e6:.0f} MB"


class SweepWheels:
    """One sweep's wheel sets: each fetched once, staged once per bucket, shared by its hosts.

    ``log`` gets the progress lines (the sweep's display); safe to use from every
    machine thread at once.
    """

    def __init__(self, log: Callable[[str], None], url_lifetime_s: int, sweep: str,
                 reqs: Sequence[str] | None = None, root: Path | None = None) -> None:
        self.log, self.url_lifetime_s, self.sweep = log, url_lifetime_s, sweep
        self.reqs = list(reqs) if reqs is not None else staged_requirements()
        self.root = root
        self._lock = threading.Lock()
        self._locks: dict[Any, threading.Lock] = {}
        self._sets: dict[HostPlatform, WheelSet | None] = {}
        self._manifests: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def _once(self, key: Any) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(key, threading.Lock())

    def wheel_set(self, platform: HostPlatform) -> WheelSet | None:
        """The set for ``platform``, fetched by the first host to ask; None: the index."""
        with self._once(platform):
            if platform not in self._sets:
                what = ", ".join(_name(r) for r in self.reqs)
                try:
                    found = fetch(self.reqs, platform, self.root)
                except WheelsUnavailable as exc:
                    self.log(f"wheels: none for {platform.label} ({exc}); its hosts install "
                             "from the package index")
                    found = None
                else:
                    how = ("from the cache" if found.cached
                           else f"downloaded in {found.seconds:.0f} s")
                    self.log(f"wheels: {what} for {platform.label}: {len(found.files)} files, "
                             f"{_mb(found.size)}, {how}")
                self._sets[platform] = found
            return self._sets[platform]

    def manifest(self, bucket: Bucket, found: WheelSet) -> list[dict[str, Any]]:
        """Signed URLs of the set in ``bucket``, uploaded once per sweep (objects already
        there, from an earlier sweep, are kept)."""
        with self._once((bucket.url, found.key)):
            if (bucket.url, found.key) not in self._manifests:
                prefix = f"{BUCKET_PREFIX}/{found.key}"
                start = time.monotonic()
                bucket.label_prefix(prefix, self.sweep, time.time() + self.url_lifetime_s,
                                    RETENTION_S)
                sent = bucket.upload_dir(found.directory, prefix)
                objects = bucket.list(prefix + "/")
                self.log(f"wheels: staged in {bucket.url.rstrip('/')}/{prefix}/ ({len(sent)} "
                         f"uploaded, {time.monotonic() - start:.1f} s)")
                self._manifests[(bucket.url, found.key)] = [
                    {"url": bucket.signed_url(f"{prefix}/{name}", expires_s=self.url_lifetime_s),
                     "path": name, "md5": objects.get(f"{prefix}/{name}")}
                    for name in found.files]
            return self._manifests[(bucket.url, found.key)]

    def source(self, bucket: Bucket | None) -> WheelSource:
        """What one host installs from: through ``bucket``, else copied over its executor."""
        return WheelSource(self, bucket)


@dataclass
class WheelSource:
    """The sweep's wheels as one host gets them (see :meth:`deliver`)."""

    wheels: SweepWheels
    bucket: Bucket | None

    def deliver(self, ex: Executor, workloads_wheel: str) -> str | None:
        """Put the set for ``ex``'s platform on the host; its directory there, or None when
        the host must use the index (unknown platform, no wheels, a failed fetch).

        ``workloads_wheel`` (already on the host) serves as the host's
        ``workloads.transfer`` before any env exists: the base interpreter imports it
        from the wheel file itself.
        """
        base = str(getattr(ex, "base_python", "python3"))
        probe = ex.run([base, "-c", PROBE], timeout=60)
        have, _, rest = probe.stdout_tail.strip().partition(" ")
        platform = HostPlatform.parse(rest) if probe.exit_code == 0 else None
        if platform is None or have == "have":  # the image has them: the env reuses them
            return None
        found = self.wheels.wheel_set(platform)
        if found is None:
            return None
        dest = f"{ex.workdir}/wheelhouse/{found.key}"
        if ex.run(["test", "-e", f"{dest}/{HOST_DONE}"], timeout=60).exit_code == 0:
            return dest  # an earlier sweep on this host copied it
        start = time.monotonic()
        try:
            if self.bucket is not None:
                self._from_bucket(ex, found, dest, base, workloads_wheel)
            else:
                for name in found.files:
                    ex.put(found.directory / name, f"{dest}/{name}")
        # a lost connection is not caught: the engine reconnects and bootstraps again
        except (WheelsUnavailable, OSError, BucketError, RemoteCommandError) as exc:
            self.wheels.log(f"wheels: {_label(ex)}: staged wheels not fetched ({exc}); "
                            "installing from the package index")
            return None
        ex.put_bytes(b"", f"{dest}/{HOST_DONE}")
        how = "fetched from the bucket" if self.bucket is not None else "copied over SSH"
        self.wheels.log(f"wheels: {_label(ex)}: {_mb(found.size)} {how} in "
                        f"{time.monotonic() - start:.1f} s")
        return dest

    def _from_bucket(self, ex: Executor, found: WheelSet, dest: str, base: str,
                     workloads_wheel: str) -> None:
        assert self.bucket is not None
        entries = self.wheels.manifest(self.bucket, found)
        manifest = f"{ex.workdir}/manifests/wheels-{found.key}.json"
        ex.put_bytes(json.dumps(entries).encode(), manifest)
        got = ex.run(["env", f"PYTHONPATH={workloads_wheel}", base, "-m", "workloads.transfer",
                      "get", manifest, dest], timeout=1800)
        with contextlib.suppress(Exception):
            ex.run(["rm", "-f", manifest], timeout=60)
        if got.exit_code != 0:
            raise WheelsUnavailable(got.last_line(f"exit code {got.exit_code}"))

    def installed(self, ex: Executor, source: str, seconds: float) -> None:
        """One line per host: where its env's packages came from."""
        where = "staged wheels" if source == "staged" else "the package index"
        self.wheels.log(f"bootstrap: {_label(ex)} installed from {where} in {seconds:.0f} s")


def _label(ex: Executor) -> str:
    target = getattr(ex, "target", None)
    return str(getattr(target, "label", "host"))
