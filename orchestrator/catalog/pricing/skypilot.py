"""Import SkyPilot's machine catalog (``~/.sky/catalogs/v*/{gcp,aws}/vms.csv``).

SkyPilot keeps a catalog on disk that its maintainers refresh upstream from
the providers' price APIs; a SkyPilot user already has it. Its ``vms.csv`` has
one row per instance type, region and zone with the columns ``InstanceType``,
``vCPUs``, ``MemoryGiB``, ``AcceleratorName``, ``Price``, ``SpotPrice``,
``Region``, ``AvailabilityZone`` (and others cloudprof does not use). Rows are
combined per instance type and region: the highest on-demand and spot price of
the region's zones, so an estimate never undercounts whichever zone a sweep
lands in. Only the families cloudprof covers are kept, without accelerators.

Each price is dated by the commit that last changed the file when it is read
from a git copy of ``skypilot-org/skypilot-catalog`` (a checkout, or a bare
clone read with ``git show``), and its source is ``skypilot-catalog@<commit>``;
a plain file is dated by its modification time. The commit date is what the
age warning counts from, so a catalog left unrefreshed upstream shows its age.
A file read at a known commit whose date is unknown (``read_on``) is dated by
the day it was read, and its source says so.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.catalog.machines import NAME_RE, CatalogError, MachineType
from orchestrator.catalog.pricing.families import arch_of, covered, family_of

REQUIRED = ("InstanceType", "vCPUs", "MemoryGiB", "Price", "SpotPrice", "Region")
DEFAULT_ROOT = Path("~/.sky/catalogs")
REPO_NAME = "skypilot-catalog"


@dataclass(frozen=True)
class Origin:
    """Where one vms.csv came from and how old its prices are."""

    label: str  # "skypilot-catalog@1a2b3c4", or the file's path
    day: str  # ISO date of the prices: the commit's, else the file's modification
    fetched_at: str  # the same moment, ISO 8601 UTC
    note: str = ""  # what the date is, where it is not the commit's or the file's


def read_on(commit: str, inside: str, day: str) -> Origin:
    """The origin of ``inside`` (a path in skypilot-catalog) read at ``commit`` on ``day``.

    Read one file at a time from the repository's web view, the commit is known but not
    its date: the prices are dated by the day they were read, the one date known to be
    no earlier than theirs, and the source says so (``fetched_at`` holds the day alone,
    its time unknown).
    """
    if not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        raise CatalogError(f"not a git commit hash: {commit!r}")
    return Origin(f"{REPO_NAME}@{commit[:7]}", day, day,
                  note=f"{inside} as read on {day}, not its commit date")


def _utc(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git(args: list[str]) -> str | None:
    """A git command's output, or None where git or the repository is not there."""
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _commit_origin(git: list[str], rev: str, path: str) -> Origin | None:
    """The last commit at or before ``rev`` that changed ``path``: short hash and date."""
    out = (_git([*git, "log", "-1", "--format=%H %cI", rev, "--", path]) or "").split()
    if len(out) != 2:
        return None
    moment = datetime.fromisoformat(out[1])
    return Origin(f"{REPO_NAME}@{out[0][:7]}", moment.astimezone(timezone.utc).date().isoformat(),
                  _utc(moment))


def origin_of(path: Path) -> Origin:
    """The commit of a checked-out, unmodified vms.csv; else the file's modification time."""
    folder = str(path.resolve().parent)
    if not _git(["-C", folder, "status", "--porcelain", "--", path.name]):  # clean, if tracked
        found = _commit_origin(["-C", folder], "HEAD", path.name)
        if found is not None:
            return found
    moment = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
    return Origin(f"SkyPilot catalog {path}", moment.date().isoformat(), _utc(moment))


def is_git_dir(path: Path) -> bool:
    """A bare git repository (or a checkout's .git): read with ``git show``, no work tree."""
    return (path / "HEAD").is_file() and (path / "objects").is_dir()


def read_git_dir(provider: str, git_dir: Path) -> tuple[str, Origin, str]:
    """(text, origin, where) of the newest ``catalogs/v*/<provider>/vms.csv`` at HEAD."""
    git = [f"--git-dir={git_dir}"]
    listed = (_git([*git, "ls-tree", "--name-only", "HEAD", "catalogs/"]) or "").split()
    versions = sorted((n for n in listed if re.fullmatch(r"catalogs/v\d+", n)),
                      key=lambda n: -int(n.rsplit("v", 1)[1]))
    for version in versions:
        inside = f"{version}/{provider}/vms.csv"
        text = _git([*git, "show", f"HEAD:{inside}"])
        origin = _commit_origin(git, "HEAD", inside)
        if text is not None and origin is not None:
            return text, origin, f"{git_dir}:{inside}"
    raise CatalogError(f"no SkyPilot catalog for {provider} in the git repository {git_dir} "
                       f"(looked for catalogs/v*/{provider}/vms.csv at HEAD)")


def find_vms_csv(provider: str, path: Path | None = None) -> Path:
    """The ``vms.csv`` of ``provider`` under ``path``: a catalogs root (newest ``v*``
    wins), one version's directory, or the file itself."""
    root = (path or DEFAULT_ROOT).expanduser()
    if root.is_file():
        return root
    if (root / "catalogs").is_dir():  # a checkout of skypilot-catalog itself
        root = root / "catalogs"
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


def load(provider: str, path: Path | None = None) -> tuple[list[MachineType], str]:
    """(rows, a one-line description of the source) from a vms.csv, a catalogs
    folder, a checkout of skypilot-catalog or a bare git copy of it."""
    root = (path or DEFAULT_ROOT).expanduser()
    if root.is_dir() and is_git_dir(root):
        text, origin, where = read_git_dir(provider, root)
        return import_vms_csv(provider, io.StringIO(text), origin, where), (
            f"SkyPilot catalog {where} ({origin.label}, {origin.day})")
    vms = find_vms_csv(provider, path)
    try:
        fh = vms.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"cannot read {vms}: {exc.strerror or exc}") from None
    with fh:
        origin = origin_of(vms)
        rows = import_vms_csv(provider, fh, origin, str(vms))
    dated = (f"{origin.label}, {origin.day}" if origin.label.startswith(REPO_NAME)
             else f"modified {origin.day}")
    return rows, f"SkyPilot catalog {vms} ({dated})"


def import_vms_csv(provider: str, lines: Iterable[str], origin: Origin,
                   where: str) -> list[MachineType]:
    """Catalog rows from one SkyPilot ``vms.csv``, dated and sourced by ``origin``."""
    reader = csv.DictReader(lines)
    missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise CatalogError(f"{where}:1: not a SkyPilot vms.csv: missing column(s) "
                           f"{', '.join(missing)}")
    rows = [
        MachineType(
            provider=provider, name=name, family=family_of(provider, name), vcpus=vcpus,
            memory_gib=gib, region=region, price_on_demand=on_demand, price_spot=spot,
            price_source=f"{origin.label} ({origin.note + '; ' if origin.note else ''}"
                         f"{zones}; spot "
                         f"{'none listed' if spot is None else 'from the same file'})",
            price_date=origin.day, arch=arch_of(provider, name), fetched_at=origin.fetched_at,
        )
        for name, region, vcpus, gib, on_demand, spot, zones in _per_region(provider, reader)
    ]
    if not rows:
        raise CatalogError(f"{where}: no machine type of the families cloudprof covers")
    return rows


def _per_region(provider: str, reader: Iterable[dict[str, str]]
                ) -> list[tuple[str, str, int, float, float, float | None, str]]:
    """One entry per covered machine type and region: the highest price of its zones."""
    # (machine, region) -> (vcpus, GiB, on-demand prices, spot prices)
    found: dict[tuple[str, str], tuple[int, float, list[float], list[float]]] = {}
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
    out = []
    for (name, region), (vcpus, gib, prices, spots) in found.items():
        on_demand = max(prices)
        spot = max(spots) if spots else None
        if spot is not None and spot > on_demand:
            spot = None  # a zone's spot above list price: not a usable spot price
        zones = f"highest of {len(prices)} zone(s)" if len(prices) > 1 else "one zone"
        out.append((name, region, vcpus, gib, on_demand, spot, zones))
    return out
