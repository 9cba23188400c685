"""Atomic file writes for the control plane: a reader sees the old file or the new one.

The helpers live in the data plane (``workloads/atomic.py``), which ships to every VM
and never imports ``orchestrator``; the control plane may import the data plane, so it
uses the very same code rather than a twin. Every result, key, report, catalog and
download goes through it, so the same rules hold everywhere: the temporary file lives
beside the target (same file system, so the rename is atomic), it is flushed to disk
before the rename, and it is removed when anything goes wrong. ``mode=0o600`` writes a
secret that is never readable by others, not even for an instant.
"""

from workloads.atomic import (
    atomic_directory,
    atomic_path,
    atomic_write_bytes,
    atomic_write_text,
    link_or_copy,
)

__all__ = ["atomic_directory", "atomic_path", "atomic_write_bytes", "atomic_write_text",
           "link_or_copy"]
