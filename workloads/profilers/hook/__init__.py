"""The sitecustomize that cloudprof puts on a --command's PYTHONPATH and the heap census it
loads (``cloudprof_heap``), which in-process trials import from here too."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

HOOK_DIR = Path(__file__).resolve().parent


def with_hook(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with this folder first on PYTHONPATH (once), so a Python command loads it."""
    new = dict(env)
    rest = [p for p in new.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(HOOK_DIR)]
    new["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR), *rest])
    return new
