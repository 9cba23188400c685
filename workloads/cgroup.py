"""A memory cgroup per trial: the kernel's own count of a whole process tree, and its limit.

No per-process counter holds a *sum* of processes once: shared pages count in each. A
memory cgroup charges every page the tree touches once, to the cgroup that touched it
first: its ``memory.stat`` gives the tree's anonymous and mapped-file pages (the held
series, ``workloads.sampler``), its high-water mark (v2 ``memory.peak``, v1
``memory.max_usage_in_bytes``) catches a burst between two samples, and its limit (v1
``memory.limit_in_bytes``, v2 ``memory.max``) is a container's: ``--memory-limit`` runs
a trial under one and reads the OOM kills.

The runner makes ``cloudprof-<pid>-<n>`` under its own memory cgroup (from
``/proc/self/cgroup`` and ``/proc/self/mountinfo``), moves the command's first
process into it between ``fork`` and ``exec`` (``write(cgroup.procs, "0")`` in
the child: the tree is in it before it does any work, and its children are
born in it), reads the peak once the tree is reaped, and removes the cgroup in
a ``finally``. Where none can be made (not root, a read-only or absent
hierarchy, a v2 parent whose ``memory`` controller is not delegated) it says why
in one line and the runner falls back to sampling. ``CLOUDPROF_NO_CGROUP=1``
forces that fallback (the tests use it to check both paths on one machine).

Caveat: both versions charge page cache to the cgroup that first read a page, so the
high-water mark of a tree that reads files is higher than what it holds (the kernel
reclaims that cache under a limit), and library pages another cgroup had cached are not
in it: the headline is the held series (``workloads.run``), this mark a bound beside it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

DISABLE_ENV = "CLOUDPROF_NO_CGROUP"
_counter = itertools.count()


class CgroupUnavailable(Exception):
    """No memory cgroup for this trial; the message says why, in one line."""


def _mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount root, mount point, super options) of every cgroup mount."""
    out = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((rest[0], fields[3], fields[4], set(rest[2].split(","))))
    return out


def _inside(mount_root: str, mount_point: str, cgroup_path: str) -> Path | None:
    """Where ``cgroup_path`` (hierarchy-relative) is on disk under a mount of ``mount_root``."""
    root = mount_root.rstrip("/")
    if root and not (cgroup_path == root or cgroup_path.startswith(root + "/")):
        return None
    return Path(mount_point) / cgroup_path[len(root):].lstrip("/")


def own_memory_cgroup(proc_cgroup: str, mountinfo: str) -> tuple[str, Path]:
    """("cgroup-v1" | "cgroup-v2", directory) of this process's memory cgroup.

    v1's memory hierarchy wins where both exist (a hybrid host's v2 mount holds no
    memory controller); v2 needs ``memory`` among its root's controllers.
    """
    mounts = _mounts(mountinfo)
    v1_path = v2_path = None
    for line in proc_cgroup.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    if v1_path is not None:
        for fstype, root, point, opts in mounts:
            if fstype == "cgroup" and "memory" in opts:
                where = _inside(root, point, v1_path)
                if where is not None and where.is_dir():
                    return "cgroup-v1", where
        raise CgroupUnavailable("the v1 memory hierarchy is not mounted here")
    if v2_path is not None:
        for fstype, root, point, _opts in mounts:
            if fstype != "cgroup2":
                continue
            where = _inside(root, point, v2_path)
            controllers = Path(point) / "cgroup.controllers"
            with contextlib.suppress(OSError):
                if where is not None and "memory" in controllers.read_text().split():
                    return "cgroup-v2", where
        raise CgroupUnavailable("no cgroup v2 mount with the memory controller")
    raise CgroupUnavailable("this process is in no memory cgroup")


@dataclass
class TrialCgroup:
    """One trial's memory cgroup: ``join_fd`` is written "0" by the child before exec."""

    version: str  # "cgroup-v1" | "cgroup-v2"
    path: Path
    join_fd: int

    @classmethod
    def create(cls, name: str | None = None) -> TrialCgroup:
        """Make the cgroup, or raise CgroupUnavailable with the reason."""
        if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
            raise CgroupUnavailable(f"{DISABLE_ENV} is set")
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError as exc:
            raise CgroupUnavailable(f"cannot read /proc/self/cgroup: {exc.strerror}") from None
        version, parent = own_memory_cgroup(proc_cgroup, mountinfo)
        _remove_stale(parent)
        path = parent / (name or f"cloudprof-{os.getpid()}-{next(_counter)}")
        try:
            path.mkdir()
        except OSError as exc:
            raise CgroupUnavailable(f"cannot make a memory cgroup in {parent}: "
                                    f"{exc.strerror or exc}") from None
        peak_file = "memory.peak" if version == "cgroup-v2" else "memory.max_usage_in_bytes"
        try:
            if not (path / peak_file).exists():  # v2: memory not delegated, or a kernel < 5.19
                raise CgroupUnavailable(f"{path} has no {peak_file}")
            join_fd = os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except (OSError, CgroupUnavailable) as exc:
            with contextlib.suppress(OSError):
                path.rmdir()
            if isinstance(exc, CgroupUnavailable):
                raise
            raise CgroupUnavailable(f"cannot join {path}: {exc.strerror or exc}") from None
        return cls(version, path, join_fd)

    def join_in_child(self) -> None:
        """In the child between fork and exec: move this process (pid 0 = the writer) in."""
        os.write(self.join_fd, b"0")

    def peak_bytes(self) -> int | None:
        """The cgroup's high-water mark since it was made (None when unreadable)."""
        name = "memory.peak" if self.version == "cgroup-v2" else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    @property
    def stat_path(self) -> Path:
        """memory.stat: the tree's anonymous and mapped-file pages, each charged once."""
        return self.path / "memory.stat"

    def set_limit(self, limit_bytes: int) -> None:
        """Put the tree under a container's memory limit (v1 ``memory.limit_in_bytes``, v2
        ``memory.max``), with no swap past it where the kernel keeps swap apart (v1
        ``memory.memsw.limit_in_bytes``, v2 ``memory.swap.max``): a container that swaps
        instead of dying would make a too-small limit look enough. Raises CgroupUnavailable."""
        limit = str(int(limit_bytes))
        files = ((("memory.limit_in_bytes", limit), ("memory.memsw.limit_in_bytes", limit))
                 if self.version == "cgroup-v1"
                 else (("memory.max", limit), ("memory.swap.max", "0")))
        for i, (name, value) in enumerate(files):
            try:
                (self.path / name).write_text(value)
            except OSError as exc:
                if i == 0 or not isinstance(exc, FileNotFoundError):
                    raise CgroupUnavailable(f"cannot set {self.path / name}: "
                                            f"{exc.strerror or exc}") from None

    def usage_bytes(self) -> int | None:
        """What the cgroup is charged now (v1 ``memory.usage_in_bytes``, v2 ``memory.current``):
        once the tree is reaped, the page cache it read and left behind."""
        name = "memory.current" if self.version == "cgroup-v2" else "memory.usage_in_bytes"
        try:
            return int((self.path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def oom_kills(self) -> int | None:
        """Processes of the tree the kernel's OOM killer killed under the cgroup's limit (v1
        ``memory.oom_control``, v2 ``memory.events``: ``oom_kill N``); None when unreadable."""
        name = "memory.oom_control" if self.version == "cgroup-v1" else "memory.events"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            return None
        return None

    def remove(self, wait_s: float = 5.0) -> str | None:
        """Kill what is still in the cgroup (a command's leftover background process), then
        remove it; a one-line problem, or None when it is gone."""
        with contextlib.suppress(OSError):
            os.close(self.join_fd)
        return remove_cgroup(self.path, wait_s)


def remove_cgroup(path: Path, wait_s: float = 5.0) -> str | None:
    """Kill every process still in the memory cgroup at ``path``, then remove it; a
    one-line problem, or None when it is gone (or never was)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            path.rmdir()
            return None
        except FileNotFoundError:
            return None
        except OSError as exc:  # EBUSY: processes still in it (or exiting)
            if time.monotonic() >= deadline:
                return f"could not remove the memory cgroup {path}: {exc.strerror or exc}"
        for pid in _pids(path):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _remove_stale(parent: Path) -> None:
    """Empty cgroups of runners that were killed before their ``finally`` (their pid is gone)."""
    with contextlib.suppress(OSError):
        for child in parent.glob("cloudprof-*-*"):
            pid = child.name.split("-")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists() and not _pids(child):
                with contextlib.suppress(OSError):
                    child.rmdir()


# -- a Ray node's cgroup, read from inside it ---------------------------------------------------

NODE_PREFIX = "cloudprof-node-"  # ``ray_trial start`` names a node's cgroup with it


def node_cgroup_name(temp_dir: str, index: int) -> str:
    """The memory cgroup of node ``index`` of the cluster under ``temp_dir`` (unique per
    cluster and node, so the nodes of one cluster on one host each have their own)."""
    return f"{NODE_PREFIX}{Path(temp_dir).name}-{index}"


def this_node_cgroup() -> tuple[str, Path]:
    """(version, directory) of the Ray node's cgroup this process was born in: the node's
    ``ray start`` joined it, and every Ray process of the node (raylet, workers, this
    actor) inherited it. Raises CgroupUnavailable when this process is in no such cgroup."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        raise CgroupUnavailable(f"{DISABLE_ENV} is set")
    try:
        version, path = own_memory_cgroup(Path("/proc/self/cgroup").read_text(),
                                          Path("/proc/self/mountinfo").read_text())
    except OSError as exc:
        raise CgroupUnavailable(f"cannot read /proc/self/cgroup: {exc.strerror}") from None
    if not path.name.startswith(NODE_PREFIX):
        raise CgroupUnavailable("this node's Ray was not started in a memory cgroup of its own")
    return version, path


class PeakWindow:
    """A cgroup's high-water mark from a moment on (a trial's start), where the kernel
    allows a reset: v1 sets ``memory.max_usage_in_bytes`` to the current usage when 0 is
    written to it; v2 resets ``memory.peak`` for the descriptor that wrote to it (kernels
    6.12 and later), so that descriptor stays open until :meth:`read`. Elsewhere the
    figure is the cgroup's peak since it was made (``scope`` says which)."""

    def __init__(self, version: str, path: Path) -> None:
        self.version, self.path = version, path
        self.scope = "cgroup lifetime"  # "trial" once a reset took
        name = "memory.peak" if version == "cgroup-v2" else "memory.max_usage_in_bytes"
        try:
            self._fd = os.open(path / name, os.O_RDWR | os.O_CLOEXEC)
        except PermissionError:  # v2 before 6.12: memory.peak is read-only
            self._fd = os.open(path / name, os.O_RDONLY | os.O_CLOEXEC)

    def reset(self) -> str:
        """Start the window now; returns its scope ("trial" or "cgroup lifetime")."""
        try:
            os.pwrite(self._fd, b"0" if self.version == "cgroup-v1" else b"reset\n", 0)
            self.scope = "trial"
        except OSError:  # v2 before 6.12 (EINVAL), or no permission: the lifetime peak
            self.scope = "cgroup lifetime"
        return self.scope

    def read(self) -> int | None:
        """The peak in bytes since :meth:`reset` (or since the cgroup was made)."""
        try:
            return int(os.pread(self._fd, 64, 0).split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
