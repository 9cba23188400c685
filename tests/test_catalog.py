"""The machine/price catalog: the shipped CSV files, their validation, lookups and filters."""

from __future__ import annotations

import csv
import re
from datetime import date, timedelta
from pathlib import Path

import pytest

from orchestrator.catalog import machines as catalog
from orchestrator.catalog.machines import (
    COLUMNS,
    CatalogError,
    check_name,
    filter_catalog,
    load_catalog,
    lookup,
    parse_catalog_file,
    sort_catalog,
    suggest,
)
from orchestrator.errors import UnknownMachineError, UsageError

GOOD_ROW = {
    "provider": "gcp",
    "instance_type": "n2-highcpu-2",
    "family": "n2",
    "vcpus": "2",
    "memory_gib": "2",
    "region": "us-central1",
    "price_on_demand": "0.07",
    "price_spot": "0.02",
    "price_source": "test figure",
    "price_date": "2024-06-01",
}


def write_csv(path: Path, rows: list[dict[str, str]], columns: tuple[str, ...] = COLUMNS) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


# ---------------------------------------------------------------- shipped data


def test_shipped_catalog_covers_the_articles_machines_and_aws_families() -> None:
    names = {m.name for m in load_catalog()}
    for v in (2, 4, 8, 16, 32, 48, 64, 80, 96):
        assert f"n2-highcpu-{v}" in names
    for v in (2, 4, 8, 16, 32, 48, 64, 80, 96, 128):
        assert f"n2-standard-{v}" in names
    for v in (4, 8, 16, 30, 60):
        assert f"c2-standard-{v}" in names
    assert {"m1-ultramem-40", "m1-ultramem-80", "m1-ultramem-160"} <= names
    assert any(n.startswith("e2-standard-") for n in names)
    assert any(n.startswith("e2-highcpu-") for n in names)
    aws = load_catalog("aws")
    for family in ("c6i", "c7i", "m6i", "m7i", "r6i"):
        sizes = {m.name.split(".")[1] for m in aws if m.family == family}
        assert {"large", "xlarge", "2xlarge", "16xlarge"} <= sizes, family
    for provider in ("gcp", "aws"):
        assert len({m.region for m in load_catalog(provider)}) >= 3


def shipped_row(name: str, region: str, provider: str = "gcp") -> catalog.MachineType:
    """The row of the shipped file itself (not the merged lookup) for a machine and region."""
    rows = parse_catalog_file(catalog.shipped_dir() / f"{provider}.csv", provider)
    return next(m for m in rows if (m.name, m.region) == (name, region))


SKYPILOT_SOURCE = re.compile(
    r"skypilot-catalog@([0-9a-f]{7}) \(catalogs/v\d+/(gcp|aws)/vms\.csv as read on "
    r"(\d{4}-\d{2}-\d{2}), not its commit date; ")
PRICING_YML_SOURCE = re.compile(
    r"google-cloud-pricing-cost-calculator@([0-9a-f]{7}) \(pricing\.yml generated "
    r"(\d{4}-\d{2}-\d{2}) from the Cloud Billing API; ")


def read_from_a_source(m: catalog.MachineType) -> bool:
    """Whether a shipped row was imported from a source (not an estimate)."""
    return bool(SKYPILOT_SOURCE.match(m.price_source) or PRICING_YML_SOURCE.match(m.price_source))


def test_every_shipped_price_is_dated_and_names_its_source_or_says_it_is_an_estimate() -> None:
    imported = 0
    for m in load_catalog():
        assert m.price_on_demand is not None and m.price_on_demand > 0
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", m.price_date)
        found = SKYPILOT_SOURCE.match(m.price_source)
        if found:  # read from SkyPilot's catalog: its file, commit and the day it was read
            imported += 1
            assert found.group(2) == m.provider and found.group(3) == m.price_date
            assert m.fetched and m.fetched_at == m.price_date
            assert m.source_name == f"skypilot-catalog@{found.group(1)}"
        elif found := PRICING_YML_SOURCE.match(m.price_source):  # GCP families SkyPilot lacks
            imported += 1
            assert m.provider == "gcp" and m.family in ("c4a", "m2")
            assert found.group(2) == m.price_date and m.fetched_at.startswith(m.price_date)
            assert m.source_name == f"google-cloud-pricing-cost-calculator@{found.group(1)}"
        else:  # anything else must say it was not fetched
            assert m.price_source.startswith("offline estimate (not fetched): ")
            assert not m.fetched and m.source_name == "offline estimate"
    assert imported, "no shipped price comes from SkyPilot's catalog"


def test_shipped_spot_prices_are_below_on_demand() -> None:
    rows = load_catalog()
    spot = [m for m in rows if m.price_spot is not None]
    assert len(spot) > len(rows) / 2
    assert all(m.price_spot < m.price_on_demand for m in spot)  # type: ignore[operator]


def test_shipped_prices_are_consistent_within_a_family_and_region() -> None:
    """A price typo (a misplaced digit) shows up as an outlier in USD per vCPU-hour."""
    groups: dict[tuple[str, str, float], list[float]] = {}
    for m in load_catalog():
        if m.provider == "gcp" and m.family == "m1":
            continue  # memory-dominated: priced per machine
        ratio = m.memory_gib / m.vcpus
        groups.setdefault((m.name.rsplit("-", 1)[0].split(".")[0], m.region, ratio), []).append(
            m.price_on_demand / m.vcpus  # type: ignore[operator]
        )
    for key, per_vcpu in groups.items():
        assert max(per_vcpu) <= min(per_vcpu) * 1.01, key


def test_default_region_is_the_first_row_and_a_region_can_be_asked_for() -> None:
    assert lookup("n2-highcpu-80").region == "us-central1"
    assert lookup("c6i.large").provider == "aws"
    eu = lookup("n2-highcpu-80", region="europe-west4")
    assert eu.region == "europe-west4"
    assert eu.price_on_demand != lookup("n2-highcpu-80").price_on_demand


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"vcpus": "two"}, "vcpus must be an integer"),
        ({"vcpus": "0"}, "vcpus must be positive"),
        ({"memory_gib": "-4"}, "memory_gib must be positive"),
        ({"price_on_demand": "abc"}, "price_on_demand must be a number"),
        ({"price_on_demand": "0"}, "price_on_demand must be positive"),
        ({"price_on_demand": ""}, "empty price_on_demand"),
        ({"price_spot": "0.5"}, "price_spot 0.5 is above price_on_demand 0.07"),
        ({"price_date": "06/01/2024"}, "price_date must be YYYY-MM-DD"),
        ({"price_date": "2024-13-01"}, "price_date must be YYYY-MM-DD"),
        ({"price_source": ""}, "empty price_source"),
        ({"provider": "aws"}, "provider 'aws' in the gcp catalog"),
        ({"instance_type": "n2;reboot"}, "invalid instance_type"),
    ],
)
def test_a_bad_row_is_reported_with_file_and_line(
    tmp_path: Path, change: dict[str, str], expected: str
) -> None:
    bad = {**GOOD_ROW, "instance_type": "n2-highcpu-4", **change}
    path = write_csv(tmp_path / "gcp.csv", [GOOD_ROW, bad])
    with pytest.raises(CatalogError) as info:
        parse_catalog_file(path, "gcp")
    message = str(info.value)
    assert message.startswith(f"{path}:3: ")  # header is line 1, the bad row line 3
    assert expected in message
    assert "\n" not in message


def test_missing_column_duplicate_row_extra_cell_and_empty_file(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "a.csv", [], columns=tuple(c for c in COLUMNS if c != "price_date"))
    with pytest.raises(CatalogError, match=r"a\.csv:1: missing column\(s\) price_date"):
        parse_catalog_file(path, "gcp")

    path = write_csv(tmp_path / "b.csv", [GOOD_ROW, GOOD_ROW])
    with pytest.raises(
        CatalogError, match=r"b\.csv:3: n2-highcpu-2 in us-central1 already on line 2"
    ):
        parse_catalog_file(path, "gcp")

    path = write_csv(tmp_path / "c.csv", [GOOD_ROW])
    path.write_text(
        path.read_text() + "gcp,x,n2,x86_64,2,2,us-central1,0.1,,src,2024-06-01,,extra\n"
    )
    with pytest.raises(CatalogError, match=r"c\.csv:3: more cells"):
        parse_catalog_file(path, "gcp")

    path = write_csv(tmp_path / "d.csv", [])
    with pytest.raises(CatalogError, match="no machine types"):
        parse_catalog_file(path, "gcp")


def test_an_empty_spot_price_means_none(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "gcp.csv", [{**GOOD_ROW, "price_spot": ""}])
    (machine,) = parse_catalog_file(path, "gcp")
    assert machine.price_spot is None
    assert machine.price(spot=True) is None
    assert machine.price(spot=False) == 0.07


def test_catalog_dir_from_the_environment_and_a_broken_file_fails_the_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_csv(tmp_path / "gcp.csv", [GOOD_ROW])
    write_csv(tmp_path / "aws.csv", [{**GOOD_ROW, "provider": "aws", "instance_type": "c6i.large"}])
    monkeypatch.setenv(catalog.CATALOG_ENV, str(tmp_path))
    assert [m.name for m in load_catalog()] == ["n2-highcpu-2", "c6i.large"]
    broken = tmp_path / "broken"
    broken.mkdir()
    write_csv(broken / "gcp.csv", [{**GOOD_ROW, "vcpus": "-1"}])
    monkeypatch.setenv(catalog.CATALOG_ENV, str(broken))
    with pytest.raises(CatalogError, match=r"gcp\.csv:2: vcpus must be positive"):
        load_catalog()
    (broken / "gcp.csv").write_text((tmp_path / "gcp.csv").read_text())
    with pytest.raises(CatalogError, match=r"cannot read catalog .*aws\.csv"):
        load_catalog()


# ---------------------------------------------------------------- lookups


def test_unknown_machine_suggests_the_nearest_names() -> None:
    with pytest.raises(UnknownMachineError) as info:
        lookup("n2-highcpu-81")
    message = str(info.value)
    assert message.startswith("unknown machine type 'n2-highcpu-81'; did you mean n2-highcpu-80")
    with pytest.raises(UnknownMachineError, match=r"did you mean c6i\.large"):
        lookup("c6i.larg")
    with pytest.raises(UnknownMachineError, match="for provider aws"):
        lookup("n2-highcpu-80", provider="aws")
    assert suggest("m1-ultramem-4", [m.name for m in load_catalog()])[0] == "m1-ultramem-40"


def test_a_region_without_a_price_lists_the_regions_that_have_one() -> None:
    with pytest.raises(UsageError, match=r"no catalog price in region 'asia-east1'.*us-central1"):
        lookup("t2a-standard-8", region="asia-east1")


@pytest.mark.parametrize("name", ["n2;rm -rf /", "$(reboot)", "a b", "`id`", "x|y", "-rf", ""])
def test_names_with_shell_metacharacters_are_refused(name: str) -> None:
    with pytest.raises(UsageError, match="use only letters, digits"):
        check_name(name)
    with pytest.raises(UsageError):
        lookup(name)


# ---------------------------------------------------------------- filters and sort


def test_filters() -> None:
    rows = load_catalog()
    highcpu = filter_catalog(rows, family="n2-highcpu", region="us-central1")
    assert {m.name for m in highcpu} == {
        f"n2-highcpu-{v}" for v in (2, 4, 8, 16, 32, 48, 64, 80, 96)
    }
    n2 = filter_catalog(rows, family="n2")
    assert {m.name.rsplit("-", 1)[0] for m in n2} == {"n2-highcpu", "n2-standard", "n2-highmem"}
    sized = filter_catalog(rows, provider="aws", min_vcpus=64, max_vcpus=96)
    assert sized and all(m.provider == "aws" and 64 <= m.vcpus <= 96 for m in sized)
    cheap = filter_catalog(rows, max_price=0.1)
    assert cheap and all(m.price_on_demand <= 0.1 for m in cheap)  # type: ignore[operator]
    cheap_spot = filter_catalog(rows, max_price=0.1, spot=True)
    assert len(cheap_spot) > len(cheap)
    assert all(m.price_spot is not None and m.price_spot <= 0.1 for m in cheap_spot)
    assert not any(m.family == "m2" for m in filter_catalog(rows, spot=True))


def test_sorts() -> None:
    rows = filter_catalog(load_catalog(), family="n2-highcpu", region="us-central1")
    by_name = [m.name for m in sort_catalog(rows, "name")]
    assert by_name[:3] == ["n2-highcpu-2", "n2-highcpu-4", "n2-highcpu-8"]  # natural order
    prices = [m.price_on_demand for m in sort_catalog(load_catalog(), "price")]
    assert prices == sorted(prices)  # type: ignore[type-var]
    memory = [m.memory_gib for m in sort_catalog(load_catalog("aws"), "memory")]
    assert memory == sorted(memory)
    vcpus = [m.vcpus for m in sort_catalog(rows, "vcpus")]
    assert vcpus == sorted(vcpus)
    with pytest.raises(UsageError, match="cannot sort by 'cost'"):
        sort_catalog(rows, "cost")


# ---------------------------------------------------------------- families, arch, freshness


def test_the_shipped_files_are_exactly_what_the_importer_makes_of_their_imported_rows() -> None:
    """A hand edit of a shipped estimate or fitted price (instead of the rate table or the
    imported rows they come from) is caught here: re-importing the files' own imported
    rows gives the files again, byte for byte."""
    from orchestrator.catalog.pricing.shipped import texts_from

    imported = {p: [m for m in load_catalog(p) if read_from_a_source(m)]
                for p in catalog.CATALOG_PROVIDERS}
    for name, text in texts_from(imported).items():
        assert (catalog.shipped_dir() / name).read_text(encoding="utf-8") == text, name


def test_a_family_read_in_full_offers_only_the_sizes_its_source_lists(tmp_path: Path) -> None:
    """c7i goes from 24xlarge to 48xlarge: read in full, it gets no made-up 32xlarge; read
    in part, the size not read keeps an estimate fitted to the read ones."""
    from orchestrator.catalog.pricing import skypilot
    from orchestrator.catalog.pricing.shipped import AWS_REGIONS, SHIPPED_MARK, texts_from

    header = ("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,"
              "Price,SpotPrice,Region,AvailabilityZone")
    lines = [header] + [f"c7i.{size},,,{v}.0,{2 * v}.0,,{v * 0.0525:.4f},{v * 0.02:.4f},"
                        f"{region},{region}-az1"
                        for size, v in (("24xlarge", 96), ("48xlarge", 192))
                        for region in AWS_REGIONS]
    origin = skypilot.read_on("27f67dd", "catalogs/v7/aws/vms.csv", "2026-11-26")
    imported = {"aws": skypilot.import_vms_csv("aws", lines, origin, "vms.csv")}

    def c7i(complete: set[str]) -> dict[str, list[catalog.MachineType]]:
        path = tmp_path / "aws.csv"
        path.write_text(texts_from(imported, {"aws": complete})["aws.csv"], encoding="utf-8")
        sizes: dict[str, list[catalog.MachineType]] = {}
        for m in parse_catalog_file(path, "aws"):
            if m.family == "c7i":
                sizes.setdefault(m.name, []).append(m)
        return sizes

    in_full, in_part = c7i({"c7i"}), c7i(set())
    assert set(in_full) == {"c7i.24xlarge", "c7i.48xlarge"}
    assert all(m.price_source.startswith("skypilot-catalog@27f67dd")
               for rows in in_full.values() for m in rows)
    assert {"c7i.large", "c7i.32xlarge"} <= set(in_part)
    for m in in_part["c7i.32xlarge"]:
        assert "fitted to skypilot-catalog@27f67dd rows of c7i" in m.price_source
        assert m.price_on_demand == pytest.approx(128 * 0.0525)
    # a family not in the import at all keeps its remembered estimates either way
    assert any(m.family == "m7i" and SHIPPED_MARK in m.price_source
               for m in parse_catalog_file(tmp_path / "aws.csv", "aws"))


def test_two_files_of_one_provider_keep_each_rows_own_source(tmp_path: Path) -> None:
    """Families a newer catalog version added come from its file, the others from the
    older one: every row names the file and commit it was read from, and a machine
    priced by both files is refused rather than silently taken from one."""
    from orchestrator.catalog.pricing.shipped import file_texts

    header = ("InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,"
              "Region,AvailabilityZone,Price,SpotPrice")
    v7, v8 = tmp_path / "v7.csv", tmp_path / "v8.csv"
    v7.write_text(f"{header}\nn2-standard-4,4.0,16.0,,,,us-central1,us-central1-a,0.19,0.06\n",
                  encoding="utf-8")
    v8.write_text(f"{header}\nc4-standard-4,4.0,15.0,,,,us-central1,us-central1-a,0.2,0.08\n"
                  "c4-standard-4,4.0,15.0,,,,us-central1,us-central1-b,0.21,0.09\n",
                  encoding="utf-8")
    commits = {"gcp": "6f65ab58724c0a5b17dbb81ee124e7d7dee0d4a5", "gcp@v8": "8427bbf"}
    text = file_texts({"gcp": v7, "gcp@v8": v8}, commits, "2026-11-26")["gcp.csv"]
    (tmp_path / "gcp.csv").write_text(text, encoding="utf-8")
    rows = {(m.name, m.region): m for m in parse_catalog_file(tmp_path / "gcp.csv", "gcp")}
    n2, c4 = rows[("n2-standard-4", "us-central1")], rows[("c4-standard-4", "us-central1")]
    assert n2.price_source.startswith("skypilot-catalog@6f65ab5 (catalogs/v7/gcp/vms.csv")
    assert c4.price_source.startswith("skypilot-catalog@8427bbf (catalogs/v8/gcp/vms.csv")
    assert (c4.price_on_demand, c4.price_spot) == (0.21, 0.09)  # the dearer zone's
    v8.write_text(v8.read_text(encoding="utf-8") + v7.read_text(encoding="utf-8")
                  .splitlines()[1] + "\n", encoding="utf-8")
    with pytest.raises(CatalogError, match="n2-standard-4 in us-central1"):
        file_texts({"gcp": v7, "gcp@v8": v8}, commits, "2026-11-26")


PRICING_YML = """\
---
about:
  generated: Thu Mar  6 03:53:56 2025
  timestamp: 1741233236
compute:
  instance:
    c4a-standard-8:
      cost:
        asia-east1:
          hour: 0.41591768
          hour_spot: 0.16618184
        us-central1:
          hour: 0.3592
          hour_spot: 0.14352
        us-east1:
          hour: 0.3592
      cpu: 8
      ram: 32
    c4a-standard-8-lssd:
      cost:
        us-central1:
          hour: 0.3592
      cpu: 8
      ram: 32
    m2-ultramem-208:
      cost:
        us-central1:
          hour: 42.111936
          hour_spot: 50.0
      cpu: 208
      ram: 5888
    n2-standard-4:
      cost:
        us-central1:
          hour: 0.5
      cpu: 4
      ram: 16
"""


def test_a_pricing_yml_prices_the_families_no_skypilot_file_lists(tmp_path: Path) -> None:
    """c4a and m2 are in no SkyPilot catalog version: a pricing.yml of
    google-cloud-pricing-cost-calculator prices them, dated by its own generation time and
    naming its commit; a family a SkyPilot file lists keeps that file's price, -lssd shapes
    (priced without their SSD) and regions that are not shipped are left out."""
    from orchestrator.catalog.pricing.shipped import file_texts, main

    header = ("InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,"
              "Region,AvailabilityZone,Price,SpotPrice")
    v7, yml = tmp_path / "v7.csv", tmp_path / "pricing.yml"
    v7.write_text(f"{header}\nn2-standard-4,4.0,16.0,,,,us-central1,us-central1-a,0.19,0.06\n",
                  encoding="utf-8")
    yml.write_text(PRICING_YML, encoding="utf-8")
    text = file_texts({"gcp": v7}, {"gcp": "6f65ab5"}, "2026-11-26",
                      pricing_yml=(yml, "0166a59ebba7c36f2cc8c931d9f258dcebc44776"))["gcp.csv"]
    (tmp_path / "gcp.csv").write_text(text, encoding="utf-8")
    rows = {(m.name, m.region): m for m in parse_catalog_file(tmp_path / "gcp.csv", "gcp")}
    c4a = rows[("c4a-standard-8", "us-central1")]
    assert (c4a.price_on_demand, c4a.price_spot, c4a.price_date) == (0.3592, 0.14352, "2025-03-06")
    assert c4a.arch == "arm64" and c4a.fetched_at == "2025-03-06T03:53:56Z"
    assert c4a.source_name == "google-cloud-pricing-cost-calculator@0166a59"
    assert rows[("c4a-standard-8", "asia-east1")].price_on_demand == 0.41591768
    assert {r for n, r in rows if n == "c4a-standard-8"} == {"us-central1", "asia-east1"}
    assert not any(n.endswith("-lssd") for n, _ in rows)
    m2 = rows[("m2-ultramem-208", "us-central1")]
    assert m2.price_spot is None and "spot none listed" in m2.price_source  # spot above list
    assert rows[("n2-standard-4", "us-central1")].price_on_demand == 0.19  # SkyPilot's
    yml.write_text("about: {generated: today}\n", encoding="utf-8")
    with pytest.raises(CatalogError, match=r"not a pricing\.yml: no about\.timestamp"):
        file_texts({"gcp": v7}, {"gcp": "6f65ab5"}, "2026-11-26", pricing_yml=(yml, "0166a59"))
    with pytest.raises(SystemExit, match="--pricing-yml goes with --skypilot-file"):
        main(["--pricing-yml", str(yml)])


def test_a_family_the_shipped_files_read_in_full_has_no_estimate_left() -> None:
    from orchestrator.catalog.pricing.shipped import READ_IN_FULL

    for provider, families in READ_IN_FULL.items():
        left = {m.name for m in load_catalog(provider)
                if m.family in families and not read_from_a_source(m)}
        assert not left, f"{provider}: {sorted(left)}"
        assert families <= {m.family for m in load_catalog(provider)}


def test_fitted_estimates_say_what_they_were_fitted_to_and_agree_with_it(tmp_path: Path) -> None:
    """Every family the shipped files import is read in full, so none of their rows is
    fitted; re-imported with some n2 sizes left out, each left-out size is fitted to the
    rest, says so, and lands on the price the source lists for it (GCP prices n2 per
    vCPU and GiB)."""
    from orchestrator.catalog.pricing.shipped import texts_from

    assert not [m.name for m in load_catalog() if "fitted to" in m.price_source]
    read = [m for m in load_catalog("gcp") if SKYPILOT_SOURCE.match(m.price_source)]
    left_out = {"n2-standard-8", "n2-highcpu-16", "n2-highmem-32"}
    text = texts_from({"gcp": [m for m in read if m.name not in left_out]}, {"gcp": ()})
    (tmp_path / "gcp.csv").write_text(text["gcp.csv"], encoding="utf-8")
    fitted = {(m.name, m.region): m for m in parse_catalog_file(tmp_path / "gcp.csv", "gcp")
              if "fitted to skypilot-catalog@6f65ab5 rows of n2 in " in m.price_source}
    source = {(m.name, m.region): m for m in read if m.name in left_out}
    assert set(fitted) == set(source)
    for key, m in fitted.items():
        assert m.price_on_demand == pytest.approx(source[key].price_on_demand, rel=0.01), key


def test_the_shipped_catalog_covers_every_family_of_the_issue_with_its_architecture() -> None:
    from orchestrator.catalog.pricing.families import AWS_FAMILIES, GCP_FAMILIES

    for provider, families in (("gcp", GCP_FAMILIES), ("aws", AWS_FAMILIES)):
        rows = load_catalog(provider)
        assert {m.family for m in rows} == set(families)
        for m in rows:
            assert m.arch == families[m.family], m.name
    assert lookup("t2a-standard-8").arch == "arm64"
    assert lookup("c4a-highcpu-16").arch == "arm64"
    assert lookup("c8g.2xlarge").arch == "arm64"
    assert lookup("c7a.2xlarge").arch == "x86_64"


def test_an_empty_arch_is_the_familys_and_a_wrong_one_is_refused(tmp_path: Path) -> None:
    rows = [{**GOOD_ROW, "instance_type": "t2a-standard-4", "family": "t2a", "arch": ""},
            {**GOOD_ROW, "arch": ""}]
    t2a, n2 = parse_catalog_file(write_csv(tmp_path / "gcp.csv", rows), "gcp")
    assert (t2a.arch, n2.arch) == ("arm64", "x86_64")
    bad = write_csv(tmp_path / "bad.csv", [{**GOOD_ROW, "arch": "sparc"}])
    with pytest.raises(CatalogError, match=r"bad\.csv:2: arch must be x86_64 or arm64"):
        parse_catalog_file(bad, "gcp")


def test_a_file_without_the_newer_columns_still_loads(tmp_path: Path) -> None:
    old = tuple(c for c in COLUMNS if c not in ("arch", "fetched_at"))
    path = write_csv(tmp_path / "gcp.csv", [{k: GOOD_ROW[k] for k in old}], columns=old)
    (machine,) = parse_catalog_file(path, "gcp")
    assert machine.arch == "x86_64" and machine.fetched_at == "" and not machine.fetched


def test_sweeps_use_the_freshest_price_per_machine_and_fall_back_to_the_shipped_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(catalog.CATALOG_ENV)
    monkeypatch.setenv(catalog.CACHE_ENV, str(tmp_path))
    # no refreshed file yet: the shipped row
    assert lookup("n2-highcpu-8") == shipped_row("n2-highcpu-8", "us-central1")
    user = catalog.user_catalog_dir()
    assert user == tmp_path / "catalog"
    user.mkdir()
    fresh = {**GOOD_ROW, "instance_type": "n2-highcpu-8", "vcpus": "8", "memory_gib": "8",
             "price_on_demand": "0.3", "price_spot": "0.09", "price_source": "fetched here",
             "price_date": "2099-01-01", "fetched_at": "2099-01-01T00:00:00Z"}
    stale = {**fresh, "instance_type": "n2-highcpu-16", "price_date": "2000-01-01"}
    write_csv(user / "gcp.csv", [fresh, stale])
    assert lookup("n2-highcpu-8").price_on_demand == 0.3
    assert lookup("n2-highcpu-8").fetched
    # older than the shipped price: the shipped row wins
    assert lookup("n2-highcpu-16") == shipped_row("n2-highcpu-16", "us-central1")
    # machines the refresh did not cover stay available, as the shipped file prices them
    assert lookup("c3-standard-8") == shipped_row("c3-standard-8", "us-central1")
    assert lookup("c6i.large").provider == "aws"  # no user aws file: shipped only


def test_merge_keeps_the_fallbacks_region_order_and_prefers_the_first_source_on_ties() -> None:
    a = parse_row_like(name="x-1", region="r2", day="2024-01-01", source="user")
    b = parse_row_like(name="x-1", region="r1", day="2024-01-01", source="user")
    e = parse_row_like(name="x-1", region="r3", day="2024-01-01", source="user")
    c = parse_row_like(name="x-1", region="r1", day="2024-01-01", source="shipped")
    d = parse_row_like(name="x-1", region="r2", day="2024-02-01", source="shipped")
    merged = catalog.merge_freshest([a, b, e], [c, d])
    assert [(m.region, m.price_source) for m in merged] == [
        ("r1", "user"), ("r2", "shipped"), ("r3", "user")]


def parse_row_like(*, name: str, region: str, day: str, source: str) -> catalog.MachineType:
    return catalog.MachineType(provider="gcp", name=name, family="x", vcpus=1, memory_gib=1,
                               region=region, price_on_demand=1.0, price_spot=None,
                               price_source=source, price_date=day)


def test_prices_are_stale_only_past_90_days_from_their_own_date() -> None:
    today = date.today()  # the clock's date, as the plan and the table use it
    for days, stale in ((0, False), (catalog.STALE_DAYS, False), (catalog.STALE_DAYS + 1, True)):
        day = (today - timedelta(days=days)).isoformat()
        row = parse_row_like(name="x-1", region="r1", day=day, source="skypilot-catalog@abc1234 "
                             "(highest of 2 zone(s))")
        assert (row.age_days(), row.stale()) == (days, stale), days
        assert row.source_name == "skypilot-catalog@abc1234"
    assert catalog.STALE_DAYS == 90
    shipped = lookup("c6i.large")
    assert shipped.source_name.startswith("skypilot-catalog@")
    assert not shipped.stale(date.fromisoformat(shipped.price_date))  # fresh on the day read


def test_the_shipped_files_can_be_regenerated_from_a_git_copy_of_skypilot_catalog(
    tmp_path: Path,
) -> None:
    from orchestrator.catalog.pricing import shipped
    from tests.test_pricing import git_catalog

    bare = git_catalog(tmp_path, {
        "gcp": ["n2-standard-2,,,2.0,8.0,,0.097118,0.0235,us-central1,us-central1-a",
                "n2-standard-2,,,2.0,8.0,,0.097118,0.0235,us-east1,us-east1-b",
                "n2-custom-9,,,9.0,8.0,,0.3,0.1,us-central1,us-central1-a"],
        "aws": ["c7i.metal-24xl,,,96.0,192.0,,4.284,1.9,us-east-1,use1-az1"],
    }, "2026-10-30T23:30:00-02:00")
    texts = shipped.skypilot_texts(bare)
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    gcp = {(m.name, m.region): m for m in parse_catalog_file(tmp_path / "gcp.csv", "gcp")}
    real = gcp["n2-standard-2", "us-central1"]
    assert real.price_source.startswith("skypilot-catalog@") and real.fetched
    assert (real.price_on_demand, real.price_date) == (0.097118, "2026-10-31")  # UTC date
    assert ("n2-standard-2", "us-east1") not in gcp  # only the shipped regions
    assert gcp["n2-custom-9", "us-central1"].vcpus == 9  # the source's shape, appended
    # a git copy holds every row: a size of a family it lists but not that size is not
    # sold; a family it does not list keeps its estimates
    assert ("n2-standard-4", "us-central1") not in gcp
    assert "offline estimate" in gcp["e2-standard-4", "us-central1"].price_source
    aws = parse_catalog_file(tmp_path / "aws.csv", "aws")
    assert aws[-1].name == "c7i.metal-24xl" and aws[-1].memory_gib == 192
    others = [r for r in shipped.aws_rows() if r["family"] != "c7i"]
    assert len(aws) == len(others) + 1
