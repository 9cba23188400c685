"""``cloudprof catalog refresh``: fetch (or import) prices and write the user's catalog.

One function per source, one result shape, so the CLI only prints. A source
that cannot price some machines says which (``missing``); those keep the
shipped estimate, which sweeps then label as such.

A refresh merges into the user's file: its rows replace those of the same
machine type and region, and every other row stays, so refreshing one region
(or importing another source for it) never drops the prices of the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.catalog.machines import CATALOG_PROVIDERS, REFRESH_SOURCES, MachineType
from orchestrator.catalog.pricing.cache import existing_rows, merge_rows, now_utc, write_catalog
from orchestrator.errors import UsageError

SOURCES = REFRESH_SOURCES
AWS_DEFAULT_REGIONS = ("us-east-1", "us-west-2", "eu-west-1")  # the shipped catalog's


@dataclass
class Refreshed:
    provider: str
    path: Path
    rows: list[MachineType]
    missing: list[str]
    source: str
    kept: int = 0  # rows of earlier refreshes (other machines or regions) left in the file

    @property
    def regions(self) -> int:
        return len({m.region for m in self.rows})


def fetch_rows(provider: str, *, source: str = "api", path: Path | None = None,
               regions: Sequence[str] = (), project: str | None = None,
               fetched_at: str | None = None) -> tuple[list[MachineType], list[str], str]:
    """(rows, what could not be priced, a one-line description of the source)."""
    fetched_at = fetched_at or now_utc()
    if source == "skypilot":
        from orchestrator.catalog.pricing import skypilot

        rows, described = skypilot.load(provider, path)
        if regions:
            rows = [m for m in rows if m.region in regions]
        return rows, [], described
    if source != "api":
        raise UsageError(f"--from: choose {' or '.join(SOURCES)}, not {source!r}")
    if provider == "gcp":
        from orchestrator.catalog.pricing import gcp

        got = gcp.fetch(fetched_at, project=project, regions=set(regions) or None)
        return got.rows, got.missing, (f"Cloud Billing Catalog API ({got.skus_read} SKUs) "
                                       "+ Compute Engine machine types")
    from orchestrator.catalog.pricing import aws

    got_aws = aws.fetch(regions or AWS_DEFAULT_REGIONS, fetched_at)
    return got_aws.rows, got_aws.missing, ("AWS Price List API + EC2 instance types "
                                           "+ spot price history")


def refresh(provider: str, *, source: str = "api", path: Path | None = None,
            regions: Sequence[str] = (), project: str | None = None,
            force: bool = False) -> Refreshed:
    """Fetch ``provider``'s prices from ``source`` and write them to the user's catalog."""
    if provider not in CATALOG_PROVIDERS:
        raise UsageError(f"--provider: choose {' or '.join(CATALOG_PROVIDERS)}, "
                         f"not {provider!r}")
    rows, missing, described = fetch_rows(provider, source=source, path=path,
                                          regions=regions, project=project)
    merged = merge_rows(rows, existing_rows(provider))
    written = write_catalog(provider, merged, described, force=force)
    return Refreshed(provider, written, rows, missing, described, kept=len(merged) - len(rows))
