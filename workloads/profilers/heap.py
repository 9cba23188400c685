"""The heap at the peak for a ``--profile memory`` trial, beside memray's call sites.

An in-process workload is watched from a thread of the runner's own process; a
``--command`` job's Python processes each run the same census from the
start-up hook (``hook/cloudprof_heap.py``) and write it to
``heap_census.json.<pid>`` in the trial's folder; the trial's summary keeps the
census of the process with the highest resident memory, and says of how many.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workloads.profilers.hook import cloudprof_heap, with_hook

HEAP_FILE = "heap_census.json"


def watch_in_process() -> cloudprof_heap.HeapWatch:
    """A census thread in this (the runner's) process; ``stop()`` returns what it found."""
    return cloudprof_heap.HeapWatch().start()


def heap_env(env: Mapping[str, str], out: Path) -> dict[str, str]:
    """``env`` for a profiled command: the hook on PYTHONPATH, writing into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    new = with_hook(env)
    new[cloudprof_heap.FILE_ENV] = str(out / HEAP_FILE)
    return new


def read_heap(out: Path) -> dict[str, Any] | None:
    """The census of the command's process with the highest resident memory (None: no
    Python process of the command wrote one)."""
    found = []
    for path in sorted(out.glob(f"{HEAP_FILE}.*")):
        if path.suffix == ".tmp":
            continue
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    found = [f for f in found if isinstance(f, dict) and isinstance(f.get("rss_bytes"), int)]
    if not found:
        return None
    best = max(found, key=lambda f: f["rss_bytes"])
    return {**best, "processes": len(found)}
