"""Machine types and their prices: the user's refreshed catalog, else the shipped one.

Prices carry their source and date: a sweep copies the rows it used into its
results, so an old report keeps the costs it was made with.

Two places hold catalog files (``<provider>.csv``): the user's cache,
``$CLOUDPROF_CACHE/catalog`` or ``~/.cache/cloudprof/catalog``, written by
``cloudprof catalog refresh`` with fetched, dated prices; and the shipped
``infra/catalog/`` (offline estimates, the fallback), packaged with cloudprof
(``orchestrator.packaged``). For each machine type and region the
row with the newest price date wins, so a refresh that missed a SKU falls back
to the shipped estimate for that machine, labelled as such. Nothing here calls
the network: sweeps only read files. ``CLOUDPROF_CATALOG_DIR`` replaces both
(tests, a private price list). Every file is validated when it is loaded, and a
bad row is reported with its file and line, because a silently wrong price
makes every cost figure of a sweep wrong.
"""

from __future__ import annotations

import csv
import difflib
import io
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Any

from orchestrator.catalog.pricing.families import ARCHES, arch_of
from orchestrator.errors import CloudprofError, UnknownMachineError, UsageError

CATALOG_ENV = "CLOUDPROF_CATALOG_DIR"
CACHE_ENV = "CLOUDPROF_CACHE"  # the user's cache root, shared with the local bucket
STALE_DAYS = 90  # the plan warns about prices older than this (from their price_date)
CATALOG_PROVIDERS = ("gcp", "aws")  # one file each: infra/catalog/<provider>.csv
COLUMNS = (
    "provider",
    "instance_type",
    "family",
    "arch",
    "vcpus",
    "memory_gib",
    "region",
    "price_on_demand",
    "price_spot",
    "price_source",
    "price_date",
    "fetched_at",
)
# Columns a file may lack (files written before they existed, hand-made price lists)
# or leave empty: an empty arch is the family's (see pricing.families), an empty
# fetched_at means the price was not fetched by cloudprof, an empty spot no spot offer.
NEW_COLUMNS = ("arch", "fetched_at")
EMPTY_ALLOWED = (*NEW_COLUMNS, "price_spot")
SORT_KEYS = ("name", "vcpus", "memory", "price")
REFRESH_SOURCES = ("api", "skypilot")  # where `catalog refresh` reads prices from

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
    arch: str = "x86_64"  # "x86_64" | "arm64": picks the VM image
    fetched_at: str = ""  # ISO UTC time the price was fetched; "" for estimates

    def price(self, spot: bool) -> float | None:
        return self.price_spot if spot else self.price_on_demand

    def age_days(self, today: date | None = None) -> int | None:
        """Days since the price date (None when the row has no date, e.g. an ssh host)."""
        try:
            return ((today or date.today()) - date.fromisoformat(self.price_date)).days
        except ValueError:
            return None

    @property
    def fetched(self) -> bool:
        """Whether the price was fetched from a provider or a maintained catalog."""
        return bool(self.fetched_at)

    def price_label(self, today: date | None = None) -> str:
        """Where the price comes from and how old it is, for the plan and the report."""
        age = self.age_days(today)
        old = "" if age is None else f", {age} day{'s' if age != 1 else ''} old"
        if self.fetched:
            return f"fetched {self.price_date}{old}"
        if self.price_source.startswith("offline estimate"):
            return f"shipped offline estimate of {self.price_date}{old}"
        return f"{self.price_source or 'price'} of {self.price_date}{old}"

    @property
    def source_name(self) -> str:
        """The price source in a few words (``skypilot-catalog@1a2b3c4``, ``offline
        estimate``) for a table column; ``price_source`` keeps the whole sentence."""
        return re.split(r" \(|: |; |, ", self.price_source, maxsplit=1)[0] or "-"

    def stale(self, today: date | None = None) -> bool:
        """Older than STALE_DAYS, counted from the price's own date, not from when it was
        read: a list price dated months ago has likely moved (spot prices by the hour)."""
        age = self.age_days(today)
        return age is not None and age > STALE_DAYS


def shipped_dir() -> Path:
    """The shipped ``infra/catalog``, packaged with cloudprof: offline estimates, the fallback."""
    from orchestrator.packaged import data_path

    return data_path("catalog")


def user_catalog_dir() -> Path:
    """Where ``cloudprof catalog refresh`` writes: ``$CLOUDPROF_CACHE/catalog`` or ~/.cache."""
    root = os.environ.get(CACHE_ENV)
    return (Path(root) if root else Path.home() / ".cache" / "cloudprof") / "catalog"


def catalog_dir() -> Path:
    """The one directory read when ``$CLOUDPROF_CATALOG_DIR`` is set, else the shipped one."""
    env = os.environ.get(CATALOG_ENV)
    return Path(env) if env else shipped_dir()


def catalog_files(provider: str) -> list[Path]:
    """The files a provider's rows are read from, the user's refreshed one first."""
    if os.environ.get(CATALOG_ENV):
        return [catalog_dir() / f"{provider}.csv"]
    user = user_catalog_dir() / f"{provider}.csv"
    return [user, shipped_dir() / f"{provider}.csv"] if user.is_file() else [
        shipped_dir() / f"{provider}.csv"]


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
        if column not in EMPTY_ALLOWED and not cells.get(column):
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
    arch = cells.get("arch") or arch_of(provider, cells["instance_type"])
    if arch not in ARCHES:
        raise CatalogError(f"{where}: arch must be {' or '.join(ARCHES)}, got {arch!r}")
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
        arch=arch,
        fetched_at=cells.get("fetched_at", ""),
    )


def to_cells(m: MachineType) -> dict[str, str]:
    """A row as the catalog files write it (full precision), keyed by COLUMNS."""
    return {
        "provider": m.provider, "instance_type": m.name, "family": m.family, "arch": m.arch,
        "vcpus": str(m.vcpus), "memory_gib": f"{m.memory_gib:g}", "region": m.region,
        "price_on_demand": "" if m.price_on_demand is None else repr(m.price_on_demand),
        "price_spot": "" if m.price_spot is None else repr(m.price_spot),
        "price_source": m.price_source, "price_date": m.price_date, "fetched_at": m.fetched_at,
    }  # fmt: skip


def to_record(m: MachineType) -> dict[str, Any]:
    """A row for JSON, keyed by COLUMNS: numbers as numbers, null for no price or fetch time."""
    return {
        "provider": m.provider, "instance_type": m.name, "family": m.family, "arch": m.arch,
        "vcpus": m.vcpus, "memory_gib": m.memory_gib, "region": m.region,
        "price_on_demand": m.price_on_demand, "price_spot": m.price_spot,
        "price_source": m.price_source, "price_date": m.price_date,
        "fetched_at": m.fetched_at or None,
    }  # fmt: skip


def render_csv(rows: Iterable[MachineType]) -> str:
    """CSV text of ``rows`` in the catalog files' format (header included)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(to_cells(m) for m in rows)
    return out.getvalue()


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
        missing = [c for c in COLUMNS if c not in header and c not in NEW_COLUMNS]
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


@lru_cache(maxsize=16)
def _parse_cached(path: Path, provider: str, mtime_ns: int, size: int) -> tuple[MachineType, ...]:
    """One file's rows, parsed again only when the file changes (a refresh mid-process)."""
    return tuple(parse_catalog_file(path, provider))


def _read(path: Path, provider: str) -> tuple[MachineType, ...]:
    try:
        stat = path.stat()
    except OSError:
        return tuple(parse_catalog_file(path, provider))  # raises the one-line error
    return _parse_cached(path, provider, stat.st_mtime_ns, stat.st_size)


def merge_freshest(*sources: Iterable[MachineType]) -> list[MachineType]:
    """One row per (machine type, region): the newest price date, earlier source on a tie.

    Rows are ordered as in the *last* source (the shipped fallback), then the
    others' extra rows in their own order: which region is a machine type's
    default (its first row) stays cloudprof's choice, whatever order a refresh
    or an imported catalog lists regions in.
    """
    materialized = [list(rows) for rows in sources]
    best: dict[tuple[str, str], MachineType] = {}
    for rows in materialized:
        for m in rows:
            key = (m.name, m.region)
            if key not in best or m.price_date > best[key].price_date:
                best[key] = m
    order: dict[tuple[str, str], None] = {}
    for rows in [materialized[-1], *materialized[:-1]] if materialized else []:
        for m in rows:
            order.setdefault((m.name, m.region), None)
    return [best[key] for key in order]


def load_catalog(provider: str | None = None) -> list[MachineType]:
    """Every catalog row (one per machine type and region), optionally of one provider.

    The freshest price of each machine type and region across the user's
    refreshed catalog and the shipped one; the first row of a machine type is
    its default region.
    """
    rows: list[MachineType] = []
    for name in CATALOG_PROVIDERS:
        if provider is None or provider == name:
            rows += merge_freshest(*(_read(p, name) for p in catalog_files(name)))
    return rows


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


def machine_arch(provider: str, name: str) -> str:
    """The CPU architecture of a machine type: its catalog row's, else its family's.

    Providers pick the boot image with it (an arm64 machine cannot boot an x86 image).
    """
    try:
        rows = load_catalog(provider) if provider in CATALOG_PROVIDERS else []
    except CloudprofError:  # an unreadable catalog: the family still tells
        rows = []
    for m in rows:
        if m.name == name:
            return m.arch
    return arch_of(provider, name)


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
