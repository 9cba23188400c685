"""Import SkyPilot's machine catalog (``~/.sky/catalogs/v*/{gcp,aws}/vms.csv``).

SkyPilot keeps a catalog on disk that its maintainers refresh upstream from
the providers' price APIs; a SkyPilot user already has it. Its ``vms.csv`` has
one row per instance type, region and zone with the columns ``InstanceType``,
``vCPUs``, ``MemoryGiB``, ``AcceleratorName``, ``Price``, ``SpotPrice``,
``Region``, ``AvailabilityZone`` (and others cloudprof does not use). Rows are
combined per instance type and region: the highest on-demand and spot price of
the region's zones, so an estimate never undercounts whichever zone a sweep
lands in. Only the families cloudprof covers are kept, without accelerators.
"""

from __future__ import annotations

import csv
import re
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.catalog.machines import NAME_RE, CatalogError, MachineType
from orchestrator.catalog.pricing.families import arch_of, covered, family_of

REQUIRED = ("InstanceType", "vCPUs", "MemoryGiB", "Price", "SpotPrice", "Region")
DEFAULT_ROOT = Path("~/.sky/catalogs")


def find_vms_csv(provider: str, path: Path | None = None) -> Path:
    """The ``vms.csv`` of ``provider`` under ``path``: a catalogs root (newest ``v*``
    wins), one version's directory, or the file itself."""
    root = (path or DEFAULT_ROOT).expanduser()
    if root.is_file():
        return root
    candidates = [root / provider / "vms.csv"]
    versions = [d for d in root.glob("v*") if re.fullmatch(r"v\d+", d.name)]
    candidates += [d / provider / "vms.csv"
                   for d in sorted(versions, key=lambda d: -int(d.name[1:]))]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise CatalogError(f"no SkyPilot catalog for {provider} under {root} "
                       f"(looked for {provider}/vms.csv and v*/{provider}/vms.csv)")


def _number(text: str | None) -> float | None:
    try:
        value = float(text or "")
    except ValueError:
        return None
    return value if value > 0 else None


def import_vms_csv(provider: str, path: Path) -> list[MachineType]:
    """Catalog rows from one SkyPilot ``vms.csv``, dated by the file's modification time."""
    try:
        fh = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"cannot read {path}: {exc.strerror or exc}") from None
    modified = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
    fetched_at = modified.strftime("%Y-%m-%dT%H:%M:%SZ")
    # machine -> region -> (vcpus, GiB, on-demand prices, spot prices)
    found: dict[tuple[str, str], tuple[int, float, list[float], list[float]]] = {}
    with fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise CatalogError(f"{path}:1: not a SkyPilot vms.csv: missing column(s) "
                               f"{', '.join(missing)}")
        for row in reader:
            name, region = (row.get("InstanceType") or "").strip(), (row.get("Region") or "")
            if (row.get("AcceleratorName") or "").strip() or not covered(provider, name):
                continue
            vcpus, gib = _number(row.get("vCPUs")), _number(row.get("MemoryGiB"))
            price = _number(row.get("Price"))
            if not (NAME_RE.match(name) and NAME_RE.match(region)) or not vcpus or not gib:
                continue
            if price is None or vcpus != int(vcpus):  # no price here; shared-core machines
                continue
            entry = found.setdefault((name, region), (int(vcpus), gib, [], []))
            entry[2].append(price)
            spot = _number(row.get("SpotPrice"))
            if spot is not None:
                entry[3].append(spot)
    rows = []
    for (name, region), (vcpus, gib, prices, spots) in found.items():
        on_demand = max(prices)
        spot = max(spots) if spots else None
        if spot is not None and spot > on_demand:
            spot = None  # a zone's spot above list price: not a usable spot price
        zones = f"highest of {len(prices)} zone(s)" if len(prices) > 1 else "one zone"
        rows.append(MachineType(
            provider=provider, name=name, family=family_of(provider, name), vcpus=vcpus,
            memory_gib=gib, region=region, price_on_demand=on_demand, price_spot=spot,
            price_source=f"SkyPilot catalog {path} ({zones}; spot "
                         f"{'none listed' if spot is None else 'from the same file'})",
            price_date=modified.date().isoformat(), arch=arch_of(provider, name),
            fetched_at=fetched_at,
        ))
    if not rows:
        raise CatalogError(f"{path}: no machine type of the families cloudprof covers")
    return rows
