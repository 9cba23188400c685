"""Shipping a user's job: the workdir archive, its setup, and the trial's command line.

The user's project directory (``--workdir``) is packed once per content into a
deterministic ``.tar.gz`` named by its hash, kept in the cache, uploaded once to
the sweep's bucket under ``jobs/<hash>/`` (labelled like the inputs, so
``cloudprof cleanup`` knows it) and unpacked once per host by
``python -m workloads.job unpack``; ``--setup`` runs there once after it
(``python -m workloads.job setup``). Trials then run with the copy as working
directory and on PYTHONPATH (``workloads.run --chdir``).

The copy, and what ``--setup`` installed into it, live in the host's cache
(``Executor.cache_dir``: cloudprof's cache dir on this machine, the login user's
home on a VM), in a directory named by the workdir's hash and, with ``--setup``,
a digest of (setup command, interpreter): a later sweep of the same
project on the same host finds its environment built and skips the setup (a
pip install of scikit-learn is half a minute and some 360 MB). Run directories
keep the setup's log, never the environment.

Packing honours the directory's ``.gitignore`` and ``.cloudprofignore``
(gitignore rules, via ``pathspec``) and always leaves out ``.git``, caches and
virtual environments; a directory above the size limit is refused before
anything is created, naming its largest files.

Files that commonly hold credentials (``SECRET_PATTERNS``: ``.env``, keys,
cloud credentials) are left out too, with one line naming them: the archive
is kept in the bucket for days, on every VM and in the cache. A ``!NAME`` line
in ``.cloudprofignore`` (read after them) ships one anyway; ``.gitignore``
cannot, so a repository's own negations never ship a secret by accident.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import posixpath
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import settings
from orchestrator.atomic import atomic_path
from orchestrator.errors import RemoteCommandError, UsageError
from orchestrator.formatting import fmt_bytes
from orchestrator.spec.job import MAX_BYTES_ENV, max_bytes

if TYPE_CHECKING:
    from orchestrator.providers.base import Bucket, CommandResult, Executor

ARCHIVE_NAME = "workdir.tar.gz"
IGNORE_FILES = (".gitignore", ".cloudprofignore")
# Never shipped: version control, caches, virtual environments, cloudprof's own runs.
ALWAYS_IGNORED = (".git/", "__pycache__/", "*.pyc", ".venv/", "venv/", ".mypy_cache/",
                  ".pytest_cache/", ".ruff_cache/", ".ipynb_checkpoints/", "runs/")
# Left out unless .cloudprofignore re-includes them (``!.env``): where credentials live.
SECRET_PATTERNS = (".env", ".env.*", "*.pem", "id_*", ".aws/", "**/.config/gcloud/",
                   "*credentials*")
CHUNK = 1 << 20


@dataclass
class JobArchive:
    """A packed workdir: its hash names the bucket prefix and the copy on every host."""

    hash: str
    path: Path  # the archive in the local cache
    source: Path
    files: int
    size: int  # bytes of the files (uncompressed)

    @property
    def prefix(self) -> str:
        return f"jobs/{self.hash}"

    @property
    def key(self) -> str:
        return f"{self.prefix}/{ARCHIVE_NAME}"


def cache_dir() -> Path:
    return settings.cache_root() / "jobs"


def _ignore_lines(root: Path, name: str) -> list[str]:
    """The patterns of one ignore file at the top of ``root``, each checked: a file that
    cannot be read or a line that is no gitignore pattern is one line naming it."""
    import pathspec

    path = root / name
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"--workdir: {path} is not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"--workdir: cannot read {path}: {exc.strerror or exc}") from None
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        try:
            pathspec.GitIgnoreSpec.from_lines([line])
        except ValueError:
            raise UsageError(f"--workdir: {path}, line {number}: {line!r} is not a gitignore "
                             "pattern (a lone '!' or a trailing '\\'?)") from None
    return lines


def _name_of(rel: str) -> str:
    """A path as the archive stores it; a name that is not UTF-8 cannot be stored."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(rel).decode("utf-8", "backslashreplace")
        raise UsageError(f"--workdir: the name '{shown}' is not UTF-8; rename it, or leave it "
                         "out with .cloudprofignore") from None
    return rel


def _unreadable(path: Path, exc: OSError) -> UsageError:
    return UsageError(f"--workdir: cannot read {path}: {exc.strerror or exc}; fix its "
                      "permissions, or leave it out with .cloudprofignore")


def list_files(root: Path, left_out: list[str] | None = None) -> list[tuple[str, Path, int]]:
    """(relative path, path, size) of every file to ship, sorted, ignore rules applied.

    ``left_out`` receives what ``SECRET_PATTERNS`` alone kept from shipping (a directory
    as ``name/``). A directory that cannot be listed, or a shipped file that cannot be
    read, is a UsageError naming it: silently leaving it out would run another job.
    """
    import pathspec

    rules = list(ALWAYS_IGNORED) + _ignore_lines(root, ".gitignore")
    own = _ignore_lines(root, ".cloudprofignore")
    plain = pathspec.GitIgnoreSpec.from_lines(rules + own)
    spec = pathspec.GitIgnoreSpec.from_lines(rules + list(SECRET_PATTERNS) + own)

    def refused(rel: str) -> bool:
        if not spec.match_file(rel):
            return False
        if left_out is not None and not plain.match_file(rel):
            left_out.append(rel)
        return True

    def walk_error(exc: OSError) -> None:
        raise _unreadable(Path(exc.filename or root), exc)

    out = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=walk_error):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(d for d in dirnames if not refused(f"{rel_dir}{d}/"))
        for name in sorted(filenames):
            rel = f"{rel_dir}{name}"
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file() or refused(rel):
                continue
            if not os.access(path, os.R_OK):
                raise _unreadable(path, PermissionError(13, "Permission denied"))
            out.append((_name_of(rel), path, path.stat().st_size))
    return sorted(out)


def _say_left_out(root: Path, left_out: list[str]) -> None:
    """One line on stderr: what may hold secrets and was not shipped, and how to ship it."""
    if not left_out:
        return
    shown = ", ".join(left_out[:5]) + (f" and {len(left_out) - 5} more"
                                       if len(left_out) > 5 else "")
    sys.stderr.write(f"warning: --workdir {root}: left out {shown}, which may hold secrets; "
                     "to ship one, add a line !NAME to its .cloudprofignore\n")
    sys.stderr.flush()


def _check_size(root: Path, files: list[tuple[str, Path, int]], limit: int) -> None:
    total = sum(size for _, _, size in files)
    if total <= limit:
        return
    largest = sorted(files, key=lambda f: -f[2])[:3]
    names = ", ".join(f"{rel} ({fmt_bytes(size)})" for rel, _, size in largest)
    raise UsageError(f"--workdir {root}: {fmt_bytes(total)} to ship is above the "
                     f"{fmt_bytes(limit)} limit; "
                     f"largest: {names} — add them to .cloudprofignore (or raise "
                     f"${MAX_BYTES_ENV})")


def _file_digest(path: Path) -> bytes:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.digest()


def pack_workdir(root: Path, limit: int | None = None) -> JobArchive:
    """Pack ``root`` (once per content: the cache keeps each hash's archive).

    The hash covers each shipped file's path, executable bit and content, so the
    same tree gives the same hash on any laptop and any change gives a new one.
    """
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise UsageError(f"--workdir: {root} is not a directory")
    left_out: list[str] = []
    files = list_files(root, left_out)
    _say_left_out(root, left_out)
    if not files:
        raise UsageError(f"--workdir {root}: nothing to ship (every file is ignored)")
    _check_size(root, files, max_bytes() if limit is None else limit)
    digest = hashlib.sha256()
    modes = {}
    for rel, path, _ in files:
        modes[rel] = 0o755 if os.access(path, os.X_OK) else 0o644
        try:
            digest.update(f"{rel}\0{modes[rel]:o}\0".encode() + _file_digest(path))
        except OSError as exc:
            raise _unreadable(path, exc) from None
    job_hash = digest.hexdigest()[:16]
    size = sum(s for _, _, s in files)
    out = cache_dir() / job_hash / ARCHIVE_NAME
    if not out.is_file():
        _write_archive(out, files, modes)
    return JobArchive(job_hash, out, root, len(files), size)


def _write_archive(out: Path, files: list[tuple[str, Path, int]], modes: dict[str, int]) -> None:
    """A reproducible tar.gz (fixed times and owners, sorted), written beside and renamed."""
    with atomic_path(out) as tmp, open(tmp, "wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, path, _ in files:
            data = path.read_bytes()
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), modes[rel], 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))


# ------------------------------------------------------------------ on a host


def _last(result: CommandResult) -> str:
    lines = [ln.strip() for ln in (result.stderr_tail or result.stdout_tail or "").splitlines()
             if ln.strip() and not ln.startswith("progress ")]
    return lines[-1] if lines else f"exit code {result.exit_code}"


def copy_name(job_hash: str, setup: str | None, ex: Executor) -> str:
    """The copy's directory name in the host's cache: one per (workdir hash, setup) there.

    The host is where the cache lives; its interpreter is in the key too, since
    what pip installed for one Python (a new cloudprof venv on a VM is a new
    path) is not reused by another. Hosts that share a home share their copies
    as they share cloudprof's venv there.
    """
    if not setup:
        return job_hash
    material = "\0".join((setup, ex.python))
    return f"{job_hash}-s{hashlib.sha256(material.encode()).hexdigest()[:12]}"


def stage_on_host(ex: Executor, job: JobArchive, bucket: Bucket | None,
                  put_manifest: Callable[[list[dict[str, Any]], str], str],
                  setup: str | None = None, *, url_lifetime_s: int) -> tuple[str, str]:
    """The job's copy in the host's cache, unpacked once per (hash, ``setup``, host):
    (its directory, "unpacked"/"reused").

    With a bucket the host fetches the archive itself from a signed URL (as it
    fetches the inputs), valid ``url_lifetime_s`` (the sweep's: as long as its VMs may
    live, not a fixed 6 h); without one it is copied over the executor.
    """
    jobs_dir = posixpath.join(ex.cache_dir, "jobs")
    dest = posixpath.join(jobs_dir, copy_name(job.hash, setup, ex))
    archive_dir = posixpath.join(jobs_dir, "archives", job.hash)
    archive = posixpath.join(archive_dir, ARCHIVE_NAME)
    if bucket is not None:
        md5 = bucket.list(job.key).get(job.key)
        entries = [{"url": bucket.signed_url(job.key, expires_s=url_lifetime_s),
                    "path": ARCHIVE_NAME, "md5": md5}]
        manifest = put_manifest(entries, f"job-{job.hash}.json")
        result = ex.run([ex.python, "-m", "workloads.transfer", "get", manifest, archive_dir],
                        timeout=3600)
        if result.exit_code != 0:
            raise RemoteCommandError(f"fetching the job's archive failed: {_last(result)}")
    else:
        ex.put(job.path, archive)
    result = ex.run([ex.python, "-m", "workloads.job", "unpack", archive, dest], timeout=3600)
    if result.exit_code != 0:
        raise RemoteCommandError(f"unpacking the job's archive failed: {_last(result)}")
    state = "reused" if "reused" in (result.stdout_tail or "") else "unpacked"
    return dest, state


def setup_on_host(ex: Executor, dest: str, command: str, log: Path) -> str:
    """Run --setup in the copy once ("ran"/"reused": an earlier sweep on this host built it);
    its output goes to ``log`` (the store).

    A failure raises RemoteCommandError with the command's last lines: the
    machine fails, the sweep goes on with the others.
    """
    from workloads.job import SETUP_LOG

    result = ex.run([ex.python, "-m", "workloads.job", "setup", dest, command], timeout=3600)
    with contextlib.suppress(OSError):  # FileNotFoundError included: no log is no reason
        ex.get(posixpath.join(dest, SETUP_LOG), log)
    if result.exit_code != 0:
        raise RemoteCommandError(f"--setup failed: {_last(result).removeprefix('error: ')}")
    if "reused" not in (result.stdout_tail or ""):
        return "ran"
    with contextlib.suppress(OSError):  # the log is the build's, from an earlier sweep: say so
        log.write_text(f"# --setup not run: {dest} was set up by an earlier sweep on this "
                       "host; that setup's log follows\n" + log.read_text(errors="replace"))
    return "reused"
