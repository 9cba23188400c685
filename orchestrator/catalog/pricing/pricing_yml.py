"""Import GCP prices from google-cloud-pricing-cost-calculator's ``pricing.yml``.

SkyPilot's catalog, which the shipped prices come from, lists neither c4a nor m2
in any catalog version. ``Cyclenerd/google-cloud-pricing-cost-calculator``
publishes, regenerated from Google's Cloud Billing Catalog API, one YAML file
with each Compute Engine machine type's list price per region:
``compute.instance.<machine>.cost.<region>.hour`` (on-demand, USD) and
``hour_spot`` (absent where there is no spot offer), with the machine's ``cpu``
and ``ram`` (GiB). Its ``about.timestamp`` says when the file was generated:
that is the prices' date, and the source names the repository and commit.

The file prices a machine from its series' SKU rates in every region that has
them, which is not a promise the machine is offered there: c4a is priced in the
ten regions that sell it, but m2 in every region with memory-optimized rates.
The VM's creation is what refuses a machine type a zone lacks. ``-lssd`` shapes
are left out: the file prices them as the plain machine, without their local SSD.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from datetime import datetime, timezone
from typing import Any

from orchestrator.catalog.machines import NAME_RE, CatalogError, MachineType
from orchestrator.catalog.pricing.families import arch_of, covered, family_of

REPO_NAME = "google-cloud-pricing-cost-calculator"


def _generated(doc: dict[str, Any], where: str) -> datetime:
    """When the file was generated (``about.timestamp``, Unix seconds)."""
    about = doc.get("about")
    stamp = about.get("timestamp") if isinstance(about, dict) else None
    if not isinstance(stamp, int) or stamp <= 0:
        raise CatalogError(f"{where}: not a pricing.yml: no about.timestamp")
    return datetime.fromtimestamp(stamp, timezone.utc)


def _price(cost: dict[str, Any], key: str) -> float | None:
    value = cost.get(key)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def import_pricing_yml(text: str, commit: str, where: str, regions: Collection[str],
                       families: Collection[str] | None = None) -> list[MachineType]:
    """GCP catalog rows of ``regions`` from a ``pricing.yml`` read at ``commit``: every
    covered machine type (of ``families`` where given) with an on-demand price there."""
    import yaml  # a dev dependency: only the shipped catalog's generator reads this file

    if not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        raise CatalogError(f"not a git commit hash: {commit!r}")
    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise CatalogError(f"{where}: not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise CatalogError(f"{where}: not a pricing.yml: no mapping at the top")
    moment = _generated(doc, where)
    instances = (doc.get("compute") or {}).get("instance")
    if not isinstance(instances, dict):
        raise CatalogError(f"{where}: not a pricing.yml: no compute.instance")
    day = moment.date().isoformat()
    label = f"{REPO_NAME}@{commit[:7]} (pricing.yml generated {day} from the Cloud Billing API"
    rows = []
    for name, machine in instances.items():
        if not (isinstance(name, str) and NAME_RE.match(name) and covered("gcp", name)
                and isinstance(machine, dict)) or name.endswith("-lssd"):
            continue
        family = family_of("gcp", name)
        if families is not None and family not in families:
            continue
        cpu, ram, costs = machine.get("cpu"), machine.get("ram"), machine.get("cost") or {}
        if not isinstance(cpu, int) or not isinstance(ram, (int, float)) or cpu <= 0 or ram <= 0:
            raise CatalogError(f"{where}: {name}: no cpu and ram")
        for region in regions:
            cost = costs.get(region)
            on_demand = _price(cost, "hour") if isinstance(cost, dict) else None
            if on_demand is None:
                continue
            spot = _price(cost, "hour_spot")
            spot = spot if spot is not None and spot <= on_demand else None
            rows.append(MachineType(
                provider="gcp", name=name, family=family, vcpus=cpu, memory_gib=float(ram),
                region=region, price_on_demand=on_demand, price_spot=spot,
                price_source=f"{label}; spot "
                             f"{'none listed' if spot is None else 'from the same file'})",
                price_date=day, arch=arch_of("gcp", name),
                fetched_at=moment.strftime("%Y-%m-%dT%H:%M:%SZ")))
    if not rows:
        raise CatalogError(f"{where}: no machine type of the families asked for in "
                           f"{', '.join(regions)}")
    return rows
