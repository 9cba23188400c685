"""The USL fits a report made, kept in the store (``fits.json``) for the next report.

Fitting is most of what a report of many machines costs (a point fit and 200 bootstrap
refits per machine); the trials of a finished run do not change, so the second report
of a run reads its fits instead. Each fit is keyed by the data it was fitted to
(``orchestrator.analysis.model.fit_key``: every worker count and rate, the resamples, the
seed and the fitting's version), so a trial added or re-run refits its machine alone,
and a file from another version is simply not used.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from orchestrator.atomic import atomic_write_bytes

FITS_FILE = "fits.json"
SCHEMA = "cloudprof.fits/1"


def _read(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: fitted again and rewritten
    fits = data.get("fits") if isinstance(data, dict) and data.get("schema") == SCHEMA else None
    return fits if isinstance(fits, dict) else {}


@contextlib.contextmanager
def stored_fits(run_dir: str | Path, *, write: bool = True) -> Iterator[None]:
    """Within the block, fits of ``run_dir``'s kept data come from its fits.json; on the
    way out the fits the block used are written back (``write``), if they changed."""
    from orchestrator.analysis import model

    path = Path(run_dir) / FITS_FILE
    kept = _read(path)
    for key, state in kept.items():
        if key not in model._FITS:
            with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
                model._FITS[key] = None if state is None else model.UslModel.from_state(state)
    used: set[str] = set()
    model._FIT_LOGS.append(used)
    try:
        yield
    finally:
        model._FIT_LOGS.remove(used)
    if not write or not used or (used <= set(kept) and len(kept) == len(used)):
        return
    fits = {k: None if model._FITS[k] is None else model._FITS[k].to_state()
            for k in sorted(used)}
    with contextlib.suppress(OSError):  # a store this process cannot write: fitted next time too
        atomic_write_bytes(path, json.dumps({"schema": SCHEMA, "fits": fits}).encode())
