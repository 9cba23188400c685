"""AWS prices: the Price List API (on-demand), EC2 shapes and spot price history.

Per region: ``describe_instance_types`` gives each covered type's vCPUs, memory
and architecture; the Price List API's ``get_products`` (Linux, shared tenancy,
no pre-installed software, capacity status Used) gives its on-demand hourly
price; ``describe_spot_price_history`` gives the current Linux/UNIX spot price
in each availability zone, of which the highest is kept (an estimate must not
undercount whichever zone a sweep lands in). A type without an on-demand price
is left out and reported (the shipped estimate stays in use for it).

Every call pages (``NextToken``) through boto3's paginators. Endpoints follow
boto3's own ``AWS_ENDPOINT_URL_PRICING`` / ``AWS_ENDPOINT_URL_EC2``. The Price
List API answers only in a few regions; ``us-east-1`` serves every region's
prices.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from orchestrator.catalog.machines import MachineType
from orchestrator.catalog.pricing.families import ARCHES, AWS_FAMILIES, X86, covered, family_of
from orchestrator.sdk.aws import new_session, translated

PRICING_REGION = "us-east-1"
PRODUCT_FILTERS = {  # one Linux on-demand price per instance type and region
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}


@dataclass(frozen=True)
class Shape:
    name: str
    vcpus: int
    memory_gib: float
    arch: str


def shapes_from_pages(pages: Iterable[dict[str, Any]]) -> dict[str, Shape]:
    """Instance type -> shape, from ``describe_instance_types`` pages."""
    shapes = {}
    for page in pages:
        for it in page.get("InstanceTypes", []):
            name = it["InstanceType"]
            if not covered("aws", name):
                continue
            arches = it.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
            arch = next((a for a in arches if a in ARCHES), X86)
            shapes[name] = Shape(name, int(it["VCpuInfo"]["DefaultVCpus"]),
                                 round(it["MemoryInfo"]["SizeInMiB"] / 1024, 3), arch)
    return shapes


def on_demand_from_pages(pages: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Instance type -> hourly USD, from ``get_products`` pages (PriceList JSON strings)."""
    prices: dict[str, float] = {}
    for page in pages:
        for text in page.get("PriceList", []):
            product = json.loads(text)
            name = product.get("product", {}).get("attributes", {}).get("instanceType", "")
            if not covered("aws", name):
                continue
            for term in product.get("terms", {}).get("OnDemand", {}).values():
                for dim in term.get("priceDimensions", {}).values():
                    usd = float(dim.get("pricePerUnit", {}).get("USD", 0) or 0)
                    if dim.get("unit") == "Hrs" and usd > 0:
                        prices[name] = max(usd, prices.get(name, 0.0))
    return prices


def spot_from_pages(pages: Iterable[dict[str, Any]]) -> dict[str, tuple[float, int]]:
    """Instance type -> (highest current spot price over zones, number of zones)."""
    latest: dict[tuple[str, str], tuple[datetime, float]] = {}
    for page in pages:
        for item in page.get("SpotPriceHistory", []):
            key = (item["InstanceType"], item["AvailabilityZone"])
            stamp = item["Timestamp"]
            if key not in latest or stamp > latest[key][0]:
                latest[key] = (stamp, float(item["SpotPrice"]))
    out: dict[str, tuple[float, int]] = {}
    for (name, _zone), (_, price) in latest.items():
        best, zones = out.get(name, (0.0, 0))
        out[name] = (max(best, price), zones + 1)
    return out


@dataclass
class AwsRefresh:
    rows: list[MachineType]
    missing: list[str]


def build_rows(region: str, shapes: dict[str, Shape], on_demand: dict[str, float],
               spot: dict[str, tuple[float, int]], fetched_at: str) -> AwsRefresh:
    rows, missing = [], []
    for name in sorted(shapes):
        shape = shapes[name]
        price = on_demand.get(name)
        if price is None:
            missing.append(f"{name} in {region}")
            continue
        spot_price, zones = spot.get(name, (None, 0))
        if spot_price is not None and spot_price > price:
            spot_price = None
        rows.append(MachineType(
            provider="aws", name=name, family=family_of("aws", name), vcpus=shape.vcpus,
            memory_gib=shape.memory_gib, region=region, price_on_demand=price,
            price_spot=spot_price,
            price_source=("AWS Price List API, Linux shared on-demand; spot: "
                          + (f"describe_spot_price_history, highest of {zones} zone(s)"
                             if spot_price is not None else "none listed")),
            price_date=fetched_at[:10], arch=shape.arch, fetched_at=fetched_at))
    return AwsRefresh(rows, missing)


def fetch_region(region: str, fetched_at: str, session: Any = None) -> AwsRefresh:
    """The covered machine types of ``region``, priced."""
    session = session or new_session(region)
    ec2 = session.client("ec2", region_name=region)
    pricing = session.client("pricing", region_name=PRICING_REGION)
    with translated(f"aws: listing instance types in {region}"):
        shapes = shapes_from_pages(ec2.get_paginator("describe_instance_types").paginate(
            Filters=[{"Name": "instance-type", "Values": [f"{f}.*" for f in AWS_FAMILIES]}]))
    if not shapes:
        return AwsRefresh([], [f"every covered family in {region} (no instance type listed)"])
    filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v}
               for k, v in {"regionCode": region, **PRODUCT_FILTERS}.items()]
    with translated(f"aws: reading the Price List for {region}"):
        on_demand = on_demand_from_pages(pricing.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1"))
    with translated(f"aws: reading spot price history in {region}"):
        spot = spot_from_pages(ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=sorted(shapes), ProductDescriptions=["Linux/UNIX"],
            StartTime=datetime.now(timezone.utc)))
    return build_rows(region, shapes, on_demand, spot, fetched_at)


def fetch(regions: Iterable[str], fetched_at: str) -> AwsRefresh:
    rows: list[MachineType] = []
    missing: list[str] = []
    for region in regions:
        part = fetch_region(region, fetched_at)
        rows += part.rows
        missing += part.missing
    return AwsRefresh(rows, missing)
