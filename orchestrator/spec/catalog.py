"""Machine types and their prices, from the CSV files in ``infra/catalog/``.

Prices carry their source and date: a sweep copies the rows it used into its
results, so an old report keeps the costs it was made with.

The CSV files are data, not code, so they live in ``infra/catalog/`` and are
found relative to this package (cloudprof is installed editable, ``pip install
-e .``); ``CLOUDPROF_CATALOG_DIR`` points elsewhere (tests, a private price
list). Every file is validated when it is loaded, and a bad row is reported
with its file and line, because a silently wrong price makes every cost figure
of a sweep wrong.
"""

from __future__ import annotations

import csv
import difflib
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from pathlib import Path

from orchestrator.errors import CloudprofError, UnknownMachineError, UsageError

CATALOG_ENV = "CLOUDPROF_CATALOG_DIR"
CATALOG_PROVIDERS = ("gcp", "aws")  # one file each: infra/catalog/<provider>.csv
COLUMNS = (
    "provider",
    "instance_type",
    "family",
    "vcpus",
    "memory_gib",
    "region",
    "price_on_demand",
    "price_spot",
    "price_source",
    "price_date",
)
SORT_KEYS = ("name", "vcpus", "memory", "price")

# Machine types and regions are interpolated into API calls and file names:
# letters, digits and . _ - only (this also keeps shell metacharacters out).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class CatalogError(CloudprofError):
    """A catalog file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class MachineType:
    provider: str  # "gcp" | "aws" | "ssh" | "local"
    name: str
    family: str
    vcpus: int
    memory_gib: float
    region: str
    price_on_demand: float | None  # USD per hour
    price_spot: float | None
    price_source: str
    price_date: str  # ISO date

    def price(self, spot: bool) -> float | None:
        return self.price_spot if spot else self.price_on_demand


def catalog_dir() -> Path:
    """Where the CSV files are: ``$CLOUDPROF_CATALOG_DIR`` or the checkout's ``infra/catalog``."""
    env = os.environ.get(CATALOG_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "infra" / "catalog"


def _positive_float(text: str, column: str, where: str, *, optional: bool = False) -> float | None:
    if optional and text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise CatalogError(f"{where}: {column} must be a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise CatalogError(f"{where}: {column} must be positive, got {text!r}")
    return value


def _parse_row(row: dict[str, str], where: str, provider: str) -> MachineType:
    cells = {k: (v or "").strip() for k, v in row.items() if k is not None}
    if None in row:
        raise CatalogError(f"{where}: more cells than the {len(COLUMNS)} columns")
    for column in COLUMNS:
        if column != "price_spot" and not cells.get(column):
            raise CatalogError(f"{where}: empty {column}")
    if cells["provider"] != provider:
        raise CatalogError(f"{where}: provider {cells['provider']!r} in the {provider} catalog")
    for column in ("instance_type", "region", "family"):
        if not NAME_RE.match(cells[column]):
            raise CatalogError(f"{where}: invalid {column} {cells[column]!r}")
    try:
        vcpus = int(cells["vcpus"])
    except ValueError:
        raise CatalogError(f"{where}: vcpus must be an integer, got {cells['vcpus']!r}") from None
    if vcpus <= 0:
        raise CatalogError(f"{where}: vcpus must be positive, got {vcpus}")
    memory = _positive_float(cells["memory_gib"], "memory_gib", where)
    on_demand = _positive_float(cells["price_on_demand"], "price_on_demand", where)
    spot = _positive_float(cells["price_spot"], "price_spot", where, optional=True)
    if spot is not None and on_demand is not None and spot > on_demand:
        raise CatalogError(f"{where}: price_spot {spot} is above price_on_demand {on_demand}")
    day = cells["price_date"]
    try:
        if not _DATE_RE.match(day):
            raise ValueError
        date.fromisoformat(day)
    except ValueError:
        raise CatalogError(f"{where}: price_date must be YYYY-MM-DD, got {day!r}") from None
    return MachineType(
        provider=provider,
        name=cells["instance_type"],
        family=cells["family"],
        vcpus=vcpus,
        memory_gib=memory or 0.0,
        region=cells["region"],
        price_on_demand=on_demand,
        price_spot=spot,
        price_source=cells["price_source"],
        price_date=day,
    )


def parse_catalog_file(path: Path, provider: str) -> list[MachineType]:
    """Rows of one provider's CSV, validated; raises CatalogError naming ``path:line``."""
    try:
        fh = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"cannot read catalog {path}: {exc.strerror or exc}") from None
    rows: list[MachineType] = []
    seen: dict[tuple[str, str], int] = {}
    with fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise CatalogError(f"{path}:1: missing column(s) {', '.join(missing)}")
        try:
            for row in reader:
                where = f"{path}:{reader.line_num}"
                machine = _parse_row(row, where, provider)
                key = (machine.name, machine.region)
                if key in seen:
                    raise CatalogError(
                        f"{where}: {machine.name} in {machine.region} already on line {seen[key]}"
                    )
                seen[key] = reader.line_num
                rows.append(machine)
        except csv.Error as exc:
            raise CatalogError(f"{path}:{reader.line_num}: {exc}") from None
    if not rows:
        raise CatalogError(f"{path}: no machine types")
    return rows


@lru_cache(maxsize=8)
def _load_dir(directory: Path) -> tuple[MachineType, ...]:
    rows: list[MachineType] = []
    for provider in CATALOG_PROVIDERS:
        rows.extend(parse_catalog_file(directory / f"{provider}.csv", provider))
    return tuple(rows)


def load_catalog(provider: str | None = None) -> list[MachineType]:
    """Every catalog row (one per machine type and region), optionally of one provider.

    The first row of a machine type in its file is its default region.
    """
    rows = _load_dir(catalog_dir())
    return [m for m in rows if provider is None or m.provider == provider]


def check_name(name: str, what: str = "machine type") -> str:
    """Refuse names that could smuggle shell syntax or path parts into a command."""
    if not NAME_RE.match(name):
        raise UsageError(
            f"invalid {what} {name!r}: use only letters, digits, '.', '_' and '-' "
            "(at most 63 characters)"
        )
    return name


def suggest(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The nearest names to ``word``, best first (for 'did you mean' messages).

    difflib's ratio, less 0.05 per character of length difference, so that a
    mistyped digit (n2-highcpu-81) suggests n2-highcpu-80 before n2-highcpu-8;
    ties go to the nearest trailing number (80 before 16).
    """
    pool = difflib.get_close_matches(word, sorted(set(candidates)), n=max(n, 10), cutoff=0.6)

    def score(candidate: str) -> float:
        ratio = difflib.SequenceMatcher(None, word, candidate).ratio()
        return ratio - 0.05 * abs(len(candidate) - len(word))

    def distance(candidate: str) -> float:
        a, b = re.search(r"(\d+)$", word), re.search(r"(\d+)$", candidate)
        return abs(int(a.group(1)) - int(b.group(1))) if a and b else math.inf

    return sorted(pool, key=lambda c: (-round(score(c), 9), distance(c), c))[:n]


def lookup(name: str, provider: str | None = None, region: str | None = None) -> MachineType:
    """The catalog row of ``name`` (in ``region``, else its default region).

    Raises UnknownMachineError with the nearest names, or UsageError when the
    machine type has no price in ``region``.
    """
    check_name(name)
    rows = load_catalog(provider)
    matches = [m for m in rows if m.name == name]
    if not matches:
        where = f" for provider {provider}" if provider else ""
        close = suggest(name, (m.name for m in rows))
        hint = f"; did you mean {', '.join(close)}?" if close else "; see `cloudprof catalog`"
        raise UnknownMachineError(f"unknown machine type {name!r}{where}{hint}")
    if region is None:
        return matches[0]
    for machine in matches:
        if machine.region == region:
            return machine
    regions = ", ".join(m.region for m in matches)
    raise UsageError(
        f"machine type {name!r} has no catalog price in region {region!r}; "
        f"regions with a price: {regions}"
    )


def filter_catalog(
    rows: Iterable[MachineType],
    *,
    provider: str | None = None,
    family: str | None = None,
    region: str | None = None,
    min_vcpus: int | None = None,
    max_vcpus: int | None = None,
    max_price: float | None = None,
    spot: bool = False,
) -> list[MachineType]:
    """Rows matching every given filter.

    ``family`` matches the family column (``n2``, ``c6i``) or a name prefix
    (``n2-highcpu`` matches ``n2-highcpu-80``). ``max_price`` applies to the
    spot price with ``spot`` (rows without a spot price are then dropped).
    """

    def keep(m: MachineType) -> bool:
        if provider is not None and m.provider != provider:
            return False
        if family is not None and not (
            m.family == family or m.name.startswith((f"{family}-", f"{family}."))
        ):
            return False
        if region is not None and m.region != region:
            return False
        if min_vcpus is not None and m.vcpus < min_vcpus:
            return False
        if max_vcpus is not None and m.vcpus > max_vcpus:
            return False
        price = m.price(spot)
        if spot and price is None:
            return False
        return max_price is None or (price is not None and price <= max_price)

    return [m for m in rows if keep(m)]


def _name_key(name: str) -> tuple[object, ...]:
    """Natural order: n2-highcpu-8 before n2-highcpu-16, c6i.2xlarge before c6i.12xlarge."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def sort_catalog(
    rows: Iterable[MachineType], key: str = "name", *, spot: bool = False
) -> list[MachineType]:
    """Rows sorted by ``key`` (one of SORT_KEYS), ties broken by provider, name, region."""
    if key not in SORT_KEYS:
        raise UsageError(f"cannot sort by {key!r}; choose one of {', '.join(SORT_KEYS)}")

    def tie(m: MachineType) -> tuple[object, ...]:
        return (m.provider, _name_key(m.name), m.region)

    primary = {
        "name": lambda m: (),
        "vcpus": lambda m: (m.vcpus,),
        "memory": lambda m: (m.memory_gib,),
        "price": lambda m: (m.price(spot) is None, m.price(spot) or 0.0),
    }[key]
    return sorted(rows, key=lambda m: (*primary(m), *tie(m)))
