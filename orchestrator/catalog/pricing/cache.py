"""The user's refreshed catalog files, and why a refresh never clobbers a hand edit.

``cloudprof catalog refresh`` writes ``<provider>.csv`` into the user's catalog
directory (``catalog.machines.user_catalog_dir``) next to ``<provider>.csv.meta.json``,
which records the SHA-256 of the bytes cloudprof wrote, where they came from
and when. A file whose bytes no longer match (a user fixed a price by hand, or
put a private price list there) is not overwritten unless the user says
``--force``, and even then it is kept beside the new one, renamed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.atomic import atomic_write_bytes
from orchestrator.catalog.machines import (
    CatalogError,
    MachineType,
    parse_catalog_file,
    render_csv,
    user_catalog_dir,
)
from orchestrator.errors import UsageError


class EditedCatalogError(UsageError):
    """The user's catalog file changed since cloudprof wrote it; refresh would lose that."""


def now_utc() -> str:
    """The fetch time stamped on every refreshed row: ISO 8601, UTC, seconds."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".meta.json")


def edited(path: Path) -> bool:
    """Whether ``path`` exists with bytes other than those cloudprof last wrote there."""
    if not path.exists():
        return False
    try:
        meta = json.loads(meta_path(path).read_text(encoding="utf-8"))
        return meta.get("sha256") != _sha256(path.read_bytes())
    except (OSError, ValueError, AttributeError):
        return True  # no (readable) record of writing it: someone else's file


def existing_rows(provider: str, directory: Path | None = None) -> list[MachineType]:
    """The rows of the user's ``<provider>.csv`` to merge a refresh into; none when there
    is no file or it no longer parses (the edit check then decides whether to replace it)."""
    path = (directory or user_catalog_dir()) / f"{provider}.csv"
    if not path.is_file():
        return []
    try:
        return parse_catalog_file(path, provider)
    except CatalogError:
        return []


def merge_rows(new: Sequence[MachineType], old: Sequence[MachineType]) -> list[MachineType]:
    """``new``, then the rows of ``old`` whose provider, region and machine ``new`` lacks."""
    keys = {(m.provider, m.region, m.name) for m in new}
    return [*new, *(m for m in old if (m.provider, m.region, m.name) not in keys)]


def write_catalog(provider: str, rows: Sequence[MachineType], source: str, *,
                  force: bool = False, directory: Path | None = None) -> Path:
    """Write ``rows`` as the user's ``<provider>.csv``; returns its path.

    Refuses (EditedCatalogError) to replace a file the user edited unless
    ``force``, which keeps the edited file as ``<provider>.csv.edited-<time>``.
    The rows are validated by the same parser sweeps use before anything is
    replaced, so a refresh can never leave an unreadable catalog behind.
    """
    if not rows:
        raise CatalogError(f"{provider}: the refresh found no machine type to write")
    directory = directory or user_catalog_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{provider}.csv"
    data = render_csv(rows).encode("utf-8")
    staged = directory / f".{provider}.csv.check"
    try:
        staged.write_bytes(data)
        parse_catalog_file(staged, provider)  # the reader's own checks, before replacing
    finally:
        staged.unlink(missing_ok=True)
    if edited(path):
        if not force:
            raise EditedCatalogError(
                f"{path} was edited since cloudprof wrote it (or not written by it); "
                "refusing to overwrite it: move it away, or pass --force to replace it "
                "(the edited file is then kept beside it)")
        stamp = now_utc().replace(":", "")
        path.rename(path.with_name(f"{path.name}.edited-{stamp}"))  # kept aside, not a write
    atomic_write_bytes(path, data)
    meta = {"sha256": _sha256(data), "source": source, "written_at": now_utc(),
            "rows": len(rows)}
    atomic_write_bytes(meta_path(path), (json.dumps(meta, indent=1) + "\n").encode("utf-8"))
    return path
