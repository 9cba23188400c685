"""Ray as an optional extra: the one place that says whether this machine has it.

A multi-node sweep (``--nodes 2`` and up) forms a Ray cluster, driven from this
machine; a single-node sweep never touches Ray. So Ray is not a dependency
(``pip install "cloudprof[ray]"`` adds it), and whether it is here is asked
with ``importlib.util.find_spec`` — importing Ray costs a second and a half,
which ``cloudprof --help`` and every single-node sweep must not pay.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from orchestrator.errors import UsageError

RAY_EXTRA = "cloudprof[ray]"
RAY_INSTALL_HINT = f"pip install '{RAY_EXTRA}'"
# ``python -c`` on a host: exit 0 when its interpreter finds Ray. Asked of every node of a
# multi-node sweep before ``ray start``; an import would cost each node half a second of
# CPU (several seconds of wall on a busy host) only to be thrown away.
RAY_FOUND_CHECK = ("import importlib.util, sys; "
                   "sys.exit(importlib.util.find_spec('ray') is None)")


def ray_available() -> bool:
    """Whether ``import ray`` can find Ray in this interpreter (without importing it)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # a broken ``ray`` entry on sys.path
        return False


def require_ray(nodes: Iterable[int] | int) -> None:
    """Refuse a multi-node sweep on a machine without Ray, before anything is paid for.

    ``nodes``: the sweep's node counts (or the largest). Raises UsageError with the
    one line that says how to install it; a sweep of one node needs nothing.
    """
    most = nodes if isinstance(nodes, int) else max(nodes, default=1)
    if most > 1 and not ray_available():
        raise UsageError(f"--nodes {most} needs Ray: {RAY_INSTALL_HINT}")
