"""The shipped catalog (``infra/catalog/*.csv``), generated here.

No price API can be called where cloudprof is built, so the shipped prices are
imported from SkyPilot's catalog (``skypilot-org/skypilot-catalog``): from a
git copy (``--skypilot GIT_DIR``: each row sourced ``skypilot-catalog@<commit>``
and dated by that commit), or from single ``vms.csv`` files read at a known
commit (``--skypilot-file gcp=PATH --commit gcp=SHA --read-on DAY``: dated by
the day read, which the source says, since the commit's date is unknown).
Families a newer catalog version added come from a second file of the same
provider (``--skypilot-file gcp@v8=PATH --commit gcp@v8=SHA``), each row
sourced by the file and commit it was read from. The GCP families no SkyPilot
catalog version lists (c4a, m2) come from google-cloud-pricing-cost-calculator's
``pricing.yml`` (``--pricing-yml PATH --pricing-yml-commit SHA``, see
``pricing_yml``), dated by the time that file was generated.

Machines the import does not price keep an estimate, labelled "offline
estimate (not fetched)" on every row: fitted to the family's imported rows of
the region where there are some (``fitted``), else computed from the
per-family rates below, remembered from the providers' price pages around
``ESTIMATE_DATE`` (one place to correct a rate):

* GCP: vCPUs × USD per vCPU-hour + GiB × USD per GiB-hour, the way Google
  prices its predefined machine types (and the way the refresh computes them);
* AWS: vCPUs × USD per vCPU-hour, since EC2 prices grow linearly with size
  within a family;
* other regions: the first region's price × a regional factor; spot: on-demand
  × a typical spot fraction (none for GCP's memory-optimized series, which
  have no spot offering in the shipped regions).

``python -m orchestrator.catalog.pricing.shipped`` without options writes the
remembered estimates alone; ``cloudprof catalog refresh`` fetches current
prices into the user's cache.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.catalog.machines import COLUMNS, CatalogError, MachineType
from orchestrator.catalog.pricing.families import AWS_FAMILIES, GCP_FAMILIES, arch_of

if TYPE_CHECKING:
    from orchestrator.catalog.pricing.fitted import Fitter

ESTIMATE_DATE = "2025-06-01"
SHIPPED_MARK = "offline estimate"  # in every shipped row's price_source

# ---- GCP: USD per vCPU-hour and per GiB-hour in us-central1, on-demand.
GCP_RATES: dict[str, tuple[float, float]] = {
    "e2": (0.021811, 0.002923), "n1": (0.031611, 0.004237), "n2": (0.031611, 0.004237),
    "n2d": (0.027502, 0.003686), "n4": (0.030400, 0.003560), "c2": (0.033982, 0.004554),
    "c2d": (0.029563, 0.003959), "c3": (0.034650, 0.004645), "c3d": (0.029563, 0.003959),
    "c4": (0.034840, 0.003964), "t2d": (0.027502, 0.003686), "t2a": (0.022000, 0.002750),
    "c4a": (0.030975, 0.003380), "m1": (0.034806, 0.005112), "m2": (0.034806, 0.005112),
    "m3": (0.037500, 0.005025),
}  # fmt: skip
GCP_REGIONS = {"us-central1": 1.0, "europe-west4": 1.1, "asia-east1": 1.16}
GCP_SPOT_FRACTION = 0.30
GCP_NO_SPOT = ("m1", "m2", "m3")
GCP_MEMORY_REGIONS = ("us-central1", "europe-west4")  # where the m-series rows are listed

# Predefined shapes: series -> (GiB per vCPU, vCPU counts).
_STD = (2, 4, 8, 16, 32)
GCP_SHAPES: dict[str, tuple[float, tuple[int, ...]]] = {
    "e2-standard": (4, _STD), "e2-highcpu": (1, _STD), "e2-highmem": (8, (2, 4, 8, 16)),
    "n1-standard": (3.75, (1, 2, 4, 8, 16, 32, 64, 96)),
    "n1-highcpu": (0.9, (2, 4, 8, 16, 32, 64, 96)),
    "n1-highmem": (6.5, (2, 4, 8, 16, 32, 64, 96)),
    "n2-standard": (4, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)),
    "n2-highcpu": (1, (2, 4, 8, 16, 32, 48, 64, 80, 96)),
    "n2-highmem": (8, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)),
    "n2d-standard": (4, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 224)),
    "n2d-highcpu": (1, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 224)),
    "n2d-highmem": (8, (2, 4, 8, 16, 32, 48, 64, 80, 96)),
    "n4-standard": (4, (2, 4, 8, 16, 32, 48, 64, 80)),
    "n4-highcpu": (2, (2, 4, 8, 16, 32, 48, 64, 80)),
    "n4-highmem": (8, (2, 4, 8, 16, 32, 48, 64, 80)),
    "c2-standard": (4, (4, 8, 16, 30, 60)),
    "c2d-standard": (4, (2, 4, 8, 16, 32, 56, 112)),
    "c2d-highcpu": (2, (2, 4, 8, 16, 32, 56, 112)),
    "c2d-highmem": (8, (2, 4, 8, 16, 32, 56, 112)),
    "c3-standard": (4, (4, 8, 22, 44, 88, 176)),
    "c3-highcpu": (2, (4, 8, 22, 44, 88, 176)),
    "c3-highmem": (8, (4, 8, 22, 44, 88, 176)),
    "c3d-standard": (4, (4, 8, 16, 30, 60, 90, 180, 360)),
    "c3d-highcpu": (2, (4, 8, 16, 30, 60, 90, 180, 360)),
    "c3d-highmem": (8, (4, 8, 16, 30, 60, 90, 180, 360)),
    "c4-standard": (3.75, (2, 4, 8, 16, 32, 48, 96, 192)),
    "c4-highcpu": (2, (2, 4, 8, 16, 32, 48, 96, 192)),
    "c4-highmem": (7.75, (2, 4, 8, 16, 32, 48, 96, 192)),
    "t2d-standard": (4, (1, 2, 4, 8, 16, 32, 48, 60)),
    "t2a-standard": (4, (1, 2, 4, 8, 16, 32, 48)),
    "c4a-standard": (4, (1, 2, 4, 8, 16, 32, 48, 64, 72)),
    "c4a-highcpu": (2, (1, 2, 4, 8, 16, 32, 48, 64, 72)),
    "c4a-highmem": (8, (1, 2, 4, 8, 16, 32, 48, 64, 72)),
}
# Memory-optimized machines are not a ratio × size: name -> (vCPUs, GiB).
GCP_FIXED: dict[str, tuple[int, float]] = {
    "m1-ultramem-40": (40, 961), "m1-ultramem-80": (80, 1922), "m1-ultramem-160": (160, 3844),
    "m1-megamem-96": (96, 1433.6),
    "m2-megamem-416": (416, 5888), "m2-ultramem-208": (208, 5888),
    "m2-ultramem-416": (416, 11776),
    "m3-megamem-64": (64, 976), "m3-megamem-128": (128, 1952),
    "m3-ultramem-32": (32, 976), "m3-ultramem-64": (64, 1952), "m3-ultramem-128": (128, 3904),
}  # fmt: skip

# ---- AWS: USD per vCPU-hour in us-east-1, Linux, shared tenancy, on-demand.
AWS_RATES: dict[str, float] = {
    "c6i": 0.0425, "m6i": 0.048, "r6i": 0.063,
    "c6a": 0.03825, "m6a": 0.0432, "r6a": 0.0567,
    "c7i": 0.044625, "m7i": 0.0504, "r7i": 0.06615,
    "c7a": 0.05132, "m7a": 0.05796, "r7a": 0.076075,
    "c7g": 0.03625, "m7g": 0.0408, "r7g": 0.05355,
    "c8g": 0.03988, "m8g": 0.04488, "r8g": 0.05891,
}  # fmt: skip
AWS_REGIONS = {"us-east-1": 1.0, "us-west-2": 1.0, "eu-west-1": 1.073}
AWS_SPOT_FRACTION = 0.40
AWS_GIB_PER_VCPU = {"c": 2, "m": 4, "r": 8}
_AWS_SIZES = {"large": 2, "xlarge": 4, "2xlarge": 8, "4xlarge": 16, "8xlarge": 32,
              "12xlarge": 48, "16xlarge": 64, "24xlarge": 96, "32xlarge": 128,
              "48xlarge": 192}
AWS_LARGEST = {"6i": 128, "6a": 192, "7i": 192, "7a": 192, "7g": 64, "8g": 192}  # vCPUs

# Families whose every row in the shipped regions was read from the sources the
# shipped files were imported from (single files, read page by page). A
# size of these families the source does not list is not sold (c7i has no
# 32xlarge: it goes from 24xlarge to 48xlarge), so its estimate is dropped; a
# family read in part keeps fitted estimates for its unread sizes.
READ_IN_FULL: dict[str, frozenset[str]] = {
    "gcp": frozenset({"c2", "c2d", "c3", "c3d", "c4", "c4a", "e2", "m1", "m2", "m3", "n1", "n2",
                      "n2d", "n4", "t2a", "t2d"}),
    "aws": frozenset(AWS_FAMILIES),
}


def _money(value: float) -> str:
    return f"{round(value, 6):g}"


def gcp_rows() -> list[dict[str, str]]:
    """Every shipped GCP row, machine by machine, regions in ``GCP_REGIONS`` order."""
    machines: list[tuple[str, int, float]] = []
    for series, (ratio, sizes) in GCP_SHAPES.items():
        machines += [(f"{series}-{v}", v, v * ratio) for v in sizes]
    machines += [(name, v, gib) for name, (v, gib) in GCP_FIXED.items()]
    rows = []
    for name, vcpus, gib in machines:
        family = name.split("-", 1)[0]
        assert family in GCP_FAMILIES, name
        cpu_rate, ram_rate = GCP_RATES[family]
        base = vcpus * cpu_rate + gib * ram_rate
        regions = GCP_MEMORY_REGIONS if family in GCP_NO_SPOT else tuple(GCP_REGIONS)
        for region in regions:
            factor = GCP_REGIONS[region]
            price = base * factor
            spot = "" if family in GCP_NO_SPOT else _money(price * GCP_SPOT_FRACTION)
            source = (f"{SHIPPED_MARK} (not fetched): {family} ${cpu_rate}/vCPU-h + "
                      f"${ram_rate}/GiB-h in us-central1"
                      + (f" x{factor} for {region}" if factor != 1.0 else "")
                      + ", from memory of cloud.google.com/compute/vm-instance-pricing; "
                      + ("spot: none listed" if not spot else
                         f"spot: typical {GCP_SPOT_FRACTION} of on-demand"))
            rows.append(_row("gcp", name, family, vcpus, gib, region, price, spot, source))
    return rows


def aws_rows() -> list[dict[str, str]]:
    """Every shipped AWS row: c/m/r of each generation, sizes up to the generation's largest."""
    rows = []
    for family in AWS_FAMILIES:
        kind, gen = family[0], family[1:]
        rate = AWS_RATES[family]
        for size, vcpus in _AWS_SIZES.items():
            if vcpus > AWS_LARGEST[gen]:
                continue
            gib = vcpus * AWS_GIB_PER_VCPU[kind]
            for region, factor in AWS_REGIONS.items():
                price = vcpus * rate * factor
                source = (f"{SHIPPED_MARK} (not fetched): {family} ${rate}/vCPU-h in us-east-1"
                          + (f" x{factor} for {region}" if factor != 1.0 else "")
                          + ", Linux on-demand, from memory of aws.amazon.com/ec2/pricing; "
                          f"spot: typical {AWS_SPOT_FRACTION} of on-demand, varies by zone")
                rows.append(_row("aws", f"{family}.{size}", family, vcpus, gib, region, price,
                                 _money(price * AWS_SPOT_FRACTION), source))
    return rows


def _row(provider: str, name: str, family: str, vcpus: int, gib: float, region: str,
         price: float, spot: str, source: str) -> dict[str, str]:
    return {
        "provider": provider, "instance_type": name, "family": family,
        "arch": arch_of(provider, name), "vcpus": str(vcpus), "memory_gib": f"{gib:g}",
        "region": region, "price_on_demand": _money(price), "price_spot": spot,
        "price_source": source, "price_date": ESTIMATE_DATE, "fetched_at": "",
    }  # fmt: skip


def render(rows: list[dict[str, str]]) -> str:
    """CSV text of ``rows`` with the catalog's header."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def shipped_texts() -> dict[str, str]:
    """File name -> the text the shipped file must have."""
    return {"gcp.csv": render(gcp_rows()), "aws.csv": render(aws_rows())}


def imported_rows(provider: str, estimates: list[dict[str, str]],
                  imported: list[MachineType],
                  complete: Collection[str] = ()) -> list[dict[str, str]]:
    """``estimates`` with each (machine, region) of ``imported`` replaced by its row,
    then ``imported``'s other machines of the same regions (names in natural order).

    A machine ``imported`` prices in some shipped regions but not in others is not
    offered there: its estimates for those regions are dropped, not kept. So is a
    machine it does not price of a family in ``complete`` (read in full) that it has
    rows of: the source lists every size the provider sells. Any other machine it
    does not price keeps an estimate, fitted to the family's imported rows of the
    region where there are some (``fitted``).
    """
    from orchestrator.catalog.machines import _name_key, to_cells
    from orchestrator.catalog.pricing.fitted import Fitter

    regions = list(GCP_REGIONS if provider == "gcp" else AWS_REGIONS)
    sold_in_full = set(complete) & {m.family for m in imported}
    imported = [m for m in imported if m.region in regions]
    found = {(m.name, m.region): to_cells(m) for m in imported}
    priced = {name for name, _ in found}
    fitter = Fitter.of(imported)
    out = [found.pop((r["instance_type"], r["region"]), None) or _refit(provider, r, fitter)
           for r in estimates
           if (r["instance_type"], r["region"]) in found
           or (r["instance_type"] not in priced and r["family"] not in sold_in_full)]
    extra = sorted(found, key=lambda key: (_name_key(key[0]), regions.index(key[1])))
    return out + [found[key] for key in extra]


def _refit(provider: str, row: dict[str, str], fitter: Fitter) -> dict[str, str]:
    """``row``, an estimate, re-priced by ``fitter`` where it has a fit (else as is)."""
    vcpus, gib = int(row["vcpus"]), float(row["memory_gib"])
    got = fitter.prices(row["family"], row["region"], vcpus, gib)
    if got is None:
        return row
    on_demand, spot, how, day = got
    return {**_row(provider, row["instance_type"], row["family"], vcpus, gib, row["region"],
                   on_demand, "" if spot is None else _money(spot),
                   f"{SHIPPED_MARK} (not fetched): {how}"), "price_date": day}


def texts_from(imported: dict[str, list[MachineType]],
               complete: dict[str, Collection[str]] | None = None) -> dict[str, str]:
    """File name -> the shipped file's text with ``imported``'s prices (provider -> rows);
    a provider or machine not imported keeps its estimates, unless its family is one of
    ``complete[provider]`` (default ``READ_IN_FULL``): then the source does not sell it."""
    complete = READ_IN_FULL if complete is None else complete
    return {f"{p}.csv": render(imported_rows(p, rows(), imported.get(p, []), complete.get(p, ())))
            for p, rows in (("gcp", gcp_rows), ("aws", aws_rows))}


def skypilot_texts(git_dir: Path) -> dict[str, str]:
    """File name -> the shipped file's text with the prices of a skypilot-catalog copy,
    which holds every row: each family it lists is read in full."""
    from orchestrator.catalog.pricing import skypilot

    imported = {p: skypilot.load(p, git_dir)[0] for p in ("gcp", "aws")}
    return texts_from(imported, {p: {m.family for m in rows} for p, rows in imported.items()})


def file_texts(files: dict[str, Path], commits: dict[str, str], day: str,
               version: str = "v7", pricing_yml: tuple[Path, str] | None = None
               ) -> dict[str, str]:
    """File name -> the shipped file's text with the prices of single ``vms.csv`` files
    (key -> local path), each read from skypilot-catalog at ``commits[key]`` on ``day``:
    where no git copy can be had, the files themselves (or the rows of them that were
    read, in their format) carry the prices, dated by the day of reading.

    A key is a provider (``gcp``: its file is ``catalogs/<version>/gcp/vms.csv``) or a
    provider and a catalog version (``gcp@v8``), so one provider's rows can come from
    two files, such as the families a newer catalog version added; each row keeps its
    own file's source. A (machine, region) priced by two of the files is refused: which
    file a shipped price came from would no longer be clear.

    ``pricing_yml`` (a path and the commit of google-cloud-pricing-cost-calculator it
    was read at) prices the GCP families none of the SkyPilot files lists (c4a, m2),
    dated by the time that file says it was generated (see ``pricing_yml.py``).
    """
    from orchestrator.catalog.pricing import skypilot

    imported: dict[str, list[MachineType]] = {}
    for key, path in files.items():
        if key not in commits:
            raise CatalogError(f"--commit {key}=SHA: the commit {path} was read at")
        provider, _, own_version = key.partition("@")
        inside = f"catalogs/{own_version or version}/{provider}/vms.csv"
        origin = skypilot.read_on(commits[key], inside, day)
        with path.open(newline="", encoding="utf-8") as fh:
            rows = skypilot.import_vms_csv(provider, fh, origin, str(path))
        known = {(m.name, m.region) for m in imported.get(provider, [])}
        twice = sorted(f"{m.name} in {m.region}" for m in rows if (m.name, m.region) in known)
        if twice:
            raise CatalogError(f"{path}: priced by another file too: {', '.join(twice[:3])}")
        imported.setdefault(provider, []).extend(rows)
    if pricing_yml is not None:
        imported.setdefault("gcp", [])
        imported["gcp"] += _pricing_yml_rows(*pricing_yml, imported["gcp"])
    return texts_from(imported)


def _pricing_yml_rows(path: Path, commit: str, listed: list[MachineType]) -> list[MachineType]:
    """The rows of a pricing.yml for the shipped GCP families none of ``listed`` is of."""
    from orchestrator.catalog.pricing.pricing_yml import import_pricing_yml

    families = set(GCP_FAMILIES) - {m.family for m in listed}
    return import_pricing_yml(path.read_text(encoding="utf-8"), commit, str(path),
                              tuple(GCP_REGIONS), families)


def _pairs(values: list[str], what: str) -> dict[str, str]:
    """``["gcp=x", "gcp@v8=y"]`` -> ``{"gcp": "x", "gcp@v8": "y"}``, providers checked."""
    out = {}
    for value in values:
        key, sep, rest = value.partition("=")
        provider, at, version = key.partition("@")
        if (not sep or provider not in ("gcp", "aws") or not rest
                or (at and not re.fullmatch(r"v\d+", version))):
            raise SystemExit(f"{what}: expected gcp=..., aws=... or gcp@v8=..., got {value!r}")
        out[key] = rest
    return out


def main(argv: list[str] | None = None) -> None:
    """Rewrite ``infra/catalog/*.csv`` from the tables above, or from SkyPilot's catalog."""
    import argparse
    from datetime import date

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--skypilot", type=Path, metavar="GIT_DIR",
                        help="a git copy of skypilot-org/skypilot-catalog to take prices from")
    parser.add_argument("--skypilot-file", action="append", default=[],
                        metavar="PROVIDER[@VERSION]=PATH",
                        help="a vms.csv of skypilot-catalog (or rows of it, with its header); "
                             "gcp@v8=PATH: one of catalogs/v8/ besides --catalog-version's")
    parser.add_argument("--commit", action="append", default=[], metavar="PROVIDER[@VERSION]=SHA",
                        help="the skypilot-catalog commit each --skypilot-file was read at")
    parser.add_argument("--read-on", default=date.today().isoformat(), metavar="YYYY-MM-DD",
                        help="the day the files were read: their prices' date (default: today)")
    parser.add_argument("--catalog-version", default="v7", help="catalogs/<version>/ read")
    parser.add_argument("--pricing-yml", type=Path, metavar="PATH",
                        help="google-cloud-pricing-cost-calculator's pricing.yml (or the "
                             "machines of it read): the GCP families no vms.csv lists")
    parser.add_argument("--pricing-yml-commit", metavar="SHA",
                        help="the commit of that repository the pricing.yml was read at")
    args = parser.parse_args(argv)
    if args.pricing_yml is not None and not (args.skypilot_file and args.pricing_yml_commit):
        raise SystemExit("--pricing-yml goes with --skypilot-file and --pricing-yml-commit SHA")
    if args.skypilot_file:
        files = {p: Path(v) for p, v in _pairs(args.skypilot_file, "--skypilot-file").items()}
        extra = None if args.pricing_yml is None else (args.pricing_yml, args.pricing_yml_commit)
        try:
            date.fromisoformat(args.read_on)
            texts = file_texts(files, _pairs(args.commit, "--commit"), args.read_on,
                               args.catalog_version, extra)
        except (CatalogError, OSError, ValueError) as exc:
            raise SystemExit(f"error: {exc}") from None
    elif args.skypilot is not None:
        texts = skypilot_texts(args.skypilot)
    else:
        texts = shipped_texts()
    target = Path(__file__).resolve().parents[3] / "infra" / "catalog"
    for name, text in texts.items():
        (target / name).write_text(text, encoding="utf-8")
        print(f"wrote {target / name} ({text.count(chr(10)) - 1} rows)")


if __name__ == "__main__":
    main()
