"""Atomic file writes: a reader sees the old file or the new one, never half of one.

The one helper of the control plane (the data plane has its own twin in
``workloads/atomic.py``: it never imports ``orchestrator``). Every result, key,
report and download goes through it, so the same three rules hold everywhere:
the temporary file lives beside the target (same file system, so the rename is
atomic), it is flushed to disk before the rename (a power cut leaves the old
file, not an empty one), and it is removed when anything goes wrong.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path | str, *, mode: int | None = 0o644) -> Iterator[Path]:
    """A fresh temporary file beside ``path`` (empty, mode 0600) for the caller to fill, or
    to replace by a hard link; on a normal exit it is synced and renamed over ``path``.

    ``mode`` is set before the rename: 0644 so a shared notebook can read results
    (mkstemp's 0600 would hide them), 0o600 for a secret (never readable by others,
    not even for an instant), None to leave it (a hard link shares someone's inode).
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


def atomic_write_bytes(path: Path | str, data: bytes, *, mode: int | None = 0o644) -> None:
    """Write ``data`` so that ``path`` holds either the old or the new content, never half."""
    with atomic_path(path, mode=mode) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path | str, text: str, *, mode: int | None = 0o644) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)
