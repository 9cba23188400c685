"""Atomic file writes: a reader sees the old file or the new one, never half of one.

The one helper of both planes: the data plane's summaries, time series, input
manifests and transferred files, and (through ``orchestrator/atomic.py``, since what
ships to a VM never imports ``orchestrator``) every file the control plane writes.
The same three rules hold everywhere:
the temporary file lives beside the target (same file system, so the rename is
atomic), it is flushed to disk before the rename (a power cut leaves the old
file, not an empty one; a hard link, which writes no byte, needs no flush), and it
is removed when anything goes wrong.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path | str, *, mode: int | None = 0o644) -> Iterator[Path]:
    """A fresh temporary file beside ``path`` (empty, mode 0600) for the caller to fill, or
    to replace by a hard link; on a normal exit it is synced and renamed over ``path``.

    ``mode`` is set before the rename: 0644 so others can read results (mkstemp's
    0600 would hide them), 0o600 for a secret (never readable by others, not even for
    an instant), None to leave it (a hard link shares someone's inode).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def link_into_place(src: Path | str, path: Path | str) -> bool:
    """Hard-link ``src`` at ``path``, replacing what is there; False where it cannot be linked
    (another filesystem). Linked under a temporary name and renamed, so ``path`` is never
    missing or partial; no fsync: no byte was written, ``src`` is the data."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.link")
    try:
        tmp.unlink(missing_ok=True)
        os.link(src, tmp)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    return True


def link_or_copy(src: Path | str, tmp: Path | str) -> bool:
    """Fill ``tmp`` (an :func:`atomic_path` temporary) with ``src``'s bytes: a hard link
    where the filesystem allows (no byte is written; True), a copy elsewhere (False).

    Only for a ``src`` nobody rewrites in place afterwards (the link shares its inode):
    a result file written through :func:`atomic_path`, a fetched copy about to be
    removed. ``atomic_path`` still syncs ``tmp`` before its rename, which for a linked
    file flushes ``src``'s own data if its writer had not (nothing, when it had).
    """
    tmp = Path(tmp)
    try:
        tmp.unlink(missing_ok=True)
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
        return False
    return True


def atomic_write_bytes(path: Path | str, data: bytes, *, mode: int | None = 0o644) -> None:
    """Write ``data`` so that ``path`` holds either the old or the new content, never half."""
    with atomic_path(path, mode=mode) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path | str, text: str, *, mode: int | None = 0o644) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


@contextlib.contextmanager
def atomic_directory(path: Path | str, is_complete: Callable[[Path], bool]) -> Iterator[Path]:
    """A fresh temporary directory beside ``path`` for the caller to fill; renamed into place
    on a normal exit, so a crash or Ctrl-C mid-way leaves nothing that looks complete.

    When ``path`` appeared meanwhile (another process filled the same one), a complete
    copy there is kept and ours dropped; an incomplete one (a stale partial copy) is
    replaced. Either way ``path`` is complete afterwards.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        try:
            os.rename(tmp, path)
        except OSError:  # ``path`` exists: a concurrent run won, or a stale partial copy
            if not is_complete(path):
                shutil.rmtree(path, ignore_errors=True)
                os.rename(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_directory(path: Path | str) -> bool:
    """Take ``path`` away from its name at once (renamed aside), then delete it; so a
    reader never finds half a directory under its name. False when it could not be moved
    (gone already, or in use under a name another process just took)."""
    path = Path(path)
    doomed = path.with_name(f".{path.name}.{os.getpid()}.removing")
    try:
        os.rename(path, doomed)
    except OSError:
        return False
    shutil.rmtree(doomed, ignore_errors=True)
    return True
