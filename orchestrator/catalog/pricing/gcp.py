"""GCP prices from the Cloud Billing Catalog API, shapes from Compute Engine.

Google prices a predefined machine type as vCPUs × the family's vCPU-hour SKU
+ GiB × its RAM GiB-hour SKU, per region, on-demand and spot ("Spot
Preemptible …" SKUs). So the refresh lists the Compute Engine service's SKUs
(``services/6F81-5844-456A``, every page), picks each family's Core and Ram
SKUs by their description, and combines them with the machine shapes of
``machineTypes.aggregatedList``. A family or region whose SKUs are missing is
left out and reported (the shipped estimate stays in use there), never guessed.

Endpoints: ``CLOUDPROF_GCP_BILLING_ENDPOINT`` (billing) and the provider's
``CLOUDPROF_GCE_ENDPOINT`` (machine types); either one set means a local
stand-in, reached without credentials.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator import sdk, settings
from orchestrator.catalog.machines import MachineType
from orchestrator.catalog.pricing.families import GCP_FAMILIES, arch_of, family_of
from orchestrator.sdk import gcp as sdk_gcp
from orchestrator.sdk.gcp import api_errors, translate_api_error

BILLING_SCOPE = "https://www.googleapis.com/auth/cloud-billing.readonly"
COMPUTE_SERVICE = "services/6F81-5844-456A"  # Compute Engine in the Cloud Billing catalog
DEFAULT_REGION = "us-central1"  # listed first: a new machine type's default region

# The start of each family's Core/Ram SKU descriptions ("N2D AMD Instance Core running
# in Americas"; spot ones are prefixed "Spot Preemptible "), compared with the vendor
# word (AMD, Arm, Intel) taken out, since Google writes it for some series only. c2's
# SKUs are "Compute optimized", m1's "Memory-optimized". Whole prefixes are compared,
# so "N2 Instance" never matches an N2D SKU.
SKU_PREFIXES: dict[str, str] = {
    "e2": "E2 Instance", "n1": "N1 Predefined Instance", "n2": "N2 Instance",
    "n2d": "N2D Instance", "n4": "N4 Instance", "c2": "Compute optimized",
    "c2d": "C2D Instance", "c3": "C3 Instance", "c3d": "C3D Instance",
    "c4": "C4 Instance", "t2d": "T2D Instance", "t2a": "T2A Instance",
    "c4a": "C4A Instance", "m1": "Memory-optimized Instance",
    "m2": "M2 Memory-optimized Instance", "m3": "M3 Memory-optimized Instance",
}  # fmt: skip
_VENDOR_RE = re.compile(r" (?:AMD|Arm|Intel)(?= )")
assert set(SKU_PREFIXES) == set(GCP_FAMILIES)
# Same family and resource, but not a predefined VM's price.
_EXCLUDE = ("Custom", "Sole Tenancy", "Extended", "Commitment", "Premium", "Reserved")
_SKU_RE = re.compile(r"^(?P<spot>Spot Preemptible )?(?P<family>.+?) (?P<kind>Core|Ram)"
                     r"(?: running)? in ")
_UNITS = {"Core": "h", "Ram": "GiBy.h"}


@dataclass
class Rates:
    """One family's per-unit prices in one region (USD), from the SKUs found."""

    core: float | None = None
    ram: float | None = None
    spot_core: float | None = None
    spot_ram: float | None = None
    skus: list[str] = field(default_factory=list)


def _unit_price(sku: Any) -> float | None:
    """The hourly USD price of a SKU: its last (paid) tier of its current pricing."""
    if not sku.pricing_info:
        return None
    expression = sku.pricing_info[0].pricing_expression
    if not expression.tiered_rates:
        return None
    money = expression.tiered_rates[-1].unit_price
    if money.currency_code and money.currency_code != "USD":
        return None
    return money.units + money.nanos / 1e9


def _classify(sku: Any) -> tuple[str, str, bool] | None:
    """(family, "Core"|"Ram", spot) of a predefined-VM SKU, else None."""
    usage = sku.category.usage_type
    if usage not in ("OnDemand", "Preemptible"):
        return None
    text = sku.description
    if any(word in text for word in _EXCLUDE):
        return None
    m = _SKU_RE.match(_VENDOR_RE.sub("", text))
    if not m:
        return None
    for family, prefix in SKU_PREFIXES.items():
        if m.group("family") == prefix:
            unit = sku.pricing_info[0].pricing_expression.usage_unit if sku.pricing_info else ""
            if unit != _UNITS[m.group("kind")]:
                return None
            return family, m.group("kind"), bool(m.group("spot")) or usage == "Preemptible"
    return None


def rates_from_skus(skus: Iterable[Any]) -> dict[tuple[str, str], Rates]:
    """(family, region) -> the rates found among ``skus`` (billing_v1.Sku messages)."""
    table: dict[tuple[str, str], Rates] = {}
    for sku in skus:
        found = _classify(sku)
        price = _unit_price(sku) if found else None
        if not found or price is None:
            continue
        family, kind, spot = found
        attr = ("spot_" if spot else "") + kind.lower()
        for region in sku.service_regions:
            rates = table.setdefault((family, region), Rates())
            setattr(rates, attr, price)
            rates.skus.append(sku.sku_id)
    return table


@dataclass(frozen=True)
class Shape:
    name: str
    vcpus: int
    memory_gib: float


def shapes_from_machine_types(pairs: Iterable[tuple[str, Any]]) -> dict[str, dict[str, Shape]]:
    """region -> machine name -> shape, from ``aggregated_list`` (zone scope, response)."""
    by_region: dict[str, dict[str, Shape]] = {}
    for scope, scoped in pairs:
        zone = scope.rsplit("/", 1)[-1]
        region = zone.rsplit("-", 1)[0]
        for mt in scoped.machine_types:
            if family_of("gcp", mt.name) not in GCP_FAMILIES or mt.is_shared_cpu:
                continue
            by_region.setdefault(region, {})[mt.name] = Shape(
                mt.name, mt.guest_cpus, round(mt.memory_mb / 1024, 3))
    return by_region


@dataclass
class GcpRefresh:
    """The rows a refresh built, and what it could not price (reported, not guessed)."""

    rows: list[MachineType]
    missing: list[str]
    skus_read: int


def build_rows(rates: dict[tuple[str, str], Rates], shapes: dict[str, dict[str, Shape]],
               fetched_at: str, regions: set[str] | None = None) -> GcpRefresh:
    """Price every shape with its family's rates in its region."""
    rows: list[MachineType] = []
    missing: set[str] = set()
    day = fetched_at[:10]
    for region in sorted(shapes, key=lambda r: (r != DEFAULT_REGION, r)):
        if regions and region not in regions:
            continue
        for shape in sorted(shapes[region].values(), key=lambda s: s.name):
            family = family_of("gcp", shape.name)
            r = rates.get((family, region))
            if r is None or r.core is None or r.ram is None:
                missing.add(f"{family} in {region}")
                continue
            price = shape.vcpus * r.core + shape.memory_gib * r.ram
            spot = (shape.vcpus * r.spot_core + shape.memory_gib * r.spot_ram
                    if r.spot_core is not None and r.spot_ram is not None else None)
            if spot is not None and spot > price:
                spot = None
            rows.append(MachineType(
                provider="gcp", name=shape.name, family=family, vcpus=shape.vcpus,
                memory_gib=shape.memory_gib, region=region, price_on_demand=round(price, 6),
                price_spot=None if spot is None else round(spot, 6),
                price_source=(f"Cloud Billing Catalog API {COMPUTE_SERVICE}: "
                              f"${r.core:g}/vCPU-h + ${r.ram:g}/GiB-h, Linux on-demand"
                              + ("; spot SKUs" if spot is not None else "; no spot SKU")),
                price_date=day, arch=arch_of("gcp", shape.name), fetched_at=fetched_at))
    return GcpRefresh(rows, sorted(missing), 0)


def _billing_client() -> Any:
    endpoint = settings.GCP_BILLING_ENDPOINT.get()
    if endpoint:
        credentials, _ = sdk_gcp.credentials(BILLING_SCOPE, anonymous=True)
        return sdk.billing_v1.CloudCatalogClient(
            transport="rest", credentials=credentials,
            client_options=sdk.api_core_client_options.ClientOptions(api_endpoint=endpoint))
    credentials, _ = sdk_gcp.credentials(BILLING_SCOPE)
    return sdk.billing_v1.CloudCatalogClient(transport="rest", credentials=credentials)


def fetch(fetched_at: str, *, project: str | None = None,
          regions: set[str] | None = None) -> GcpRefresh:
    """List the SKUs and the machine types, and price every covered machine."""
    try:
        skus = list(_billing_client().list_skus(
            request={"parent": COMPUTE_SERVICE, "currency_code": "USD"}))
    except api_errors() as exc:
        raise translate_api_error(exc, "listing Compute Engine SKUs (Cloud Billing)") from None
    try:
        credentials, adc_project = sdk_gcp.credentials(
            sdk_gcp.CLOUD_PLATFORM, anonymous=bool(sdk_gcp.endpoint()))
        pages = sdk_gcp.compute_client("MachineTypesClient", credentials).aggregated_list(
            request={"project": sdk_gcp.resolve_project(project, adc_project),
                     "max_results": 500})
        shapes = shapes_from_machine_types(pages)
    except api_errors() as exc:
        raise translate_api_error(exc, "listing machine types (Compute Engine)") from None
    result = build_rows(rates_from_skus(skus), shapes, fetched_at, regions)
    result.skus_read = len(skus)
    return result
