"""Whether this machine can drive a Ray cluster (``--nodes`` above 1).

Ray is an optional extra: a sweep asking for several nodes without it is refused
at spec validation, before anything is paid for, with the line that installs it.
"""

from __future__ import annotations

from orchestrator.errors import UsageError

INSTALL_HINT = "pip install 'cloudprof[ray]'"


def require_ray(nodes: int = 2) -> None:
    """Raise UsageError saying how to install Ray when ``import ray`` fails here."""
    import importlib.util

    try:  # find it without importing it (seconds): the spec is checked before every sweep
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # ValueError: an entry in sys.modules without a spec
        found = False
    if not found:
        raise UsageError(f"--nodes {nodes} needs Ray: {INSTALL_HINT}")
