"""An integer two processes share without a lock or a message.

The profiling agent samples from its own process, so the runner's unit counter
and the agent's latest RSS must be readable across the process boundary at
100 Hz without waking the other side. A memfd (an anonymous file; a temporary
file where the kernel lacks memfd) mapped into both processes holds one
aligned int64: one process writes it, the other reads it, and an aligned 8-byte
load or store is atomic on the CPUs we run on.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref


class SharedInt:
    """One int64 in shared memory; ``fileno()`` goes to the other process via ``pass_fds``."""

    def __init__(self, fd: int | None = None) -> None:
        """A new cell, or with ``fd`` the other process's (which stays that process's to close)."""
        owner = fd is None
        if fd is None:
            try:
                fd = os.memfd_create("cloudprof-shared-int", os.MFD_CLOEXEC)
            except (AttributeError, OSError):
                import tempfile  # only here: the sampler process imports this module

                with tempfile.TemporaryFile() as f:
                    fd = os.dup(f.fileno())
            os.ftruncate(fd, 8)
        self._fd = fd
        self._map = mmap.mmap(fd, 8)
        self._cell = ctypes.c_int64.from_buffer(self._map)
        if owner:
            weakref.finalize(self, _close, fd)

    def fileno(self) -> int:
        return self._fd

    @property
    def value(self) -> int:
        return self._cell.value

    @value.setter
    def value(self, v: int) -> None:
        self._cell.value = v


def _close(fd: int) -> None:
    try:  # noqa: SIM105 - no contextlib in the sampler process (sampler.py)
        os.close(fd)
    except OSError:
        pass
