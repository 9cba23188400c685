"""Price refresh: GCP and AWS fetchers against local fakes behind the real clients,
the SkyPilot import, the user's catalog cache, and the `catalog refresh` command."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import date
from pathlib import Path

import pytest

from orchestrator import cli
from orchestrator.catalog import machines as catalog
from orchestrator.catalog.machines import load_catalog, lookup
from orchestrator.catalog.pricing import cache, refresh
from orchestrator.errors import CloudprofError
from tests.fixtures.fake_aws_pricing import FakeAwsPricing, product
from tests.fixtures.fake_billing import FakeBilling, family_skus, sku
from tests.fixtures.fake_gce import FakeGce
from tests.test_catalog import shipped_row


@pytest.fixture
def user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Sweeps read the user's cache (under tmp_path) and the shipped catalog, as for a user."""
    monkeypatch.delenv(catalog.CATALOG_ENV)
    monkeypatch.setenv(catalog.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "test-project")
    monkeypatch.setenv("COLUMNS", "200")  # the catalog table's rows read whole, one per line
    return tmp_path / "cache" / "catalog"


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- GCP

N2 = (0.031611, 0.004237)
N2_SPOT = (0.007650, 0.001025)
T2A = (0.0231, 0.00289)


def gcp_skus(billing: FakeBilling) -> None:
    billing.skus = [
        *family_skus("N2 Instance", "us-central1", *N2, spot=N2_SPOT),
        *family_skus("N2 Instance", "europe-west1", 0.0348, 0.00466),
        *family_skus("T2A Arm Instance", "us-central1", *T2A),
        *family_skus("E2 Instance", "us-central1", 0.021811, 0.002923),
        *family_skus("Compute optimized", "us-central1", 0.03398, 0.00455),
        # same resources, other prices: never taken for a predefined machine
        sku("N2 Custom Instance Core running in Americas", ["us-central1"], 9.0),
        sku("N2 Sole Tenancy Instance Core running in Americas", ["us-central1"], 9.0),
        sku("Commitment v1: N2 Cpu in Americas for 1 Year", ["us-central1"], 9.0,
            usage="Commit1Yr"),
    ]


def test_gcp_refresh_prices_each_machine_from_its_family_skus_across_every_page(
    fake_billing: FakeBilling, fake_gce: FakeGce, user_cache: Path
) -> None:
    gcp_skus(fake_billing)
    done = refresh.refresh("gcp")
    assert done.path == user_cache / "gcp.csv"
    # both APIs were read page by page through the real clients
    assert len(fake_billing.requests) == -(-len(fake_billing.skus) // fake_billing.page_size)
    assert any(q.get("pageToken") for q in fake_billing.requests)
    assert len(fake_gce.sent("GET", r"/aggregated/machineTypes$")) > 1

    today = date.today().isoformat()
    n2 = lookup("n2-highcpu-8", region="us-central1")
    assert n2.price_on_demand == pytest.approx(8 * N2[0] + 8 * N2[1])
    assert n2.price_spot == pytest.approx(8 * N2_SPOT[0] + 8 * N2_SPOT[1])
    assert n2.fetched and n2.price_date == today and n2.fetched_at.startswith(today)
    assert "Cloud Billing Catalog API services/6F81-5844-456A" in n2.price_source
    assert lookup("n2-highcpu-8").region == "us-central1"  # the default region stays
    assert done.rows[0].region == "us-central1"  # also for types only the refresh knows
    assert lookup("n2-standard-4", region="europe-west1").price_on_demand == pytest.approx(
        4 * 0.0348 + 16 * 0.00466)
    t2a = lookup("t2a-standard-4", region="us-central1")
    assert t2a.arch == "arm64" and t2a.price_spot is None  # no spot SKU: none, not a guess
    written = {(m.name, m.region) for m in catalog.parse_catalog_file(done.path, "gcp")}
    assert ("e2-micro", "us-central1") not in written  # shared-core
    assert not any(name.startswith("a2-") for name, _ in written)  # not a covered family


def test_a_missing_gcp_sku_leaves_the_family_out_and_says_so(
    fake_billing: FakeBilling, fake_gce: FakeGce, user_cache: Path
) -> None:
    gcp_skus(fake_billing)
    fake_billing.skus = [s for s in fake_billing.skus
                         if not s["description"].startswith("T2A Arm Instance Ram")]
    done = refresh.refresh("gcp")
    assert "t2a in us-central1" in done.missing and "m3 in us-central1" in done.missing
    assert not any(m.family == "t2a" for m in done.rows)
    fallback = lookup("t2a-standard-4", region="us-central1")  # the shipped price
    assert fallback == shipped_row("t2a-standard-4", "us-central1")


def test_a_gcp_api_error_is_one_line_and_writes_nothing(
    fake_billing: FakeBilling, fake_gce: FakeGce, user_cache: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake_billing.error = (403, "PERMISSION_DENIED",
                          "Cloud Billing API has not been used in project 12 before")
    code, out, err = run_main(["catalog", "refresh", "--provider", "gcp"], capsys)
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: gcp: permission denied for listing "
                                                   "Compute Engine SKUs")
    assert "has not been used" in err
    assert not (user_cache / "gcp.csv").exists()


# ---------------------------------------------------------------- AWS


def aws_data(fake: FakeAwsPricing) -> None:
    fake.types["us-east-1"] = {
        "c6i.large": (2, 4096, "x86_64"), "c6i.xlarge": (4, 8192, "x86_64"),
        "c7g.large": (2, 4096, "arm64"), "m7a.2xlarge": (8, 32768, "x86_64"),
        "t3.micro": (2, 1024, "x86_64"),
    }  # fmt: skip
    fake.products["us-east-1"] = [
        product("c6i.large", "us-east-1", 0.085), product("c6i.xlarge", "us-east-1", 0.17),
        product("c7g.large", "us-east-1", 0.0725), product("m7a.2xlarge", "us-east-1", 0.46368),
        product("t3.micro", "us-east-1", 0.0104),
    ]
    fake.spot["us-east-1"] = [
        ("c6i.large", "us-east-1a", 0.0300, "2026-11-22T10:00:00.000Z"),
        ("c6i.large", "us-east-1a", 0.0500, "2026-11-21T10:00:00.000Z"),  # older: not current
        ("c6i.large", "us-east-1b", 0.0350, "2026-11-22T09:00:00.000Z"),
        ("c7g.large", "us-east-1a", 0.0290, "2026-11-22T09:00:00.000Z"),
    ]


def test_aws_refresh_reads_every_page_and_keeps_each_zones_current_spot_price(
    fake_aws_pricing: FakeAwsPricing, user_cache: Path
) -> None:
    aws_data(fake_aws_pricing)
    done = refresh.refresh("aws", regions=["us-east-1"])
    calls = [name for name, _ in fake_aws_pricing.calls]
    assert calls.count("GetProducts") == 3  # 5 products, 2 per page
    assert calls.count("DescribeInstanceTypes") == 2  # 4 covered types, 2 per page
    assert calls.count("DescribeSpotPriceHistory") == 2
    get_products = next(body for name, body in fake_aws_pricing.calls if name == "GetProducts")
    filters = {f["Field"]: f["Value"] for f in get_products["Filters"]}
    assert filters == {"regionCode": "us-east-1", "operatingSystem": "Linux",
                       "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}

    c6i = lookup("c6i.large", region="us-east-1")
    assert c6i.fetched and c6i.price_on_demand == 0.085
    assert c6i.price_spot == 0.035  # highest current zone price, not the older 0.05
    assert "highest of 2 zone(s)" in c6i.price_source
    c7g = lookup("c7g.large", region="us-east-1")
    assert c7g.arch == "arm64" and c7g.price_spot == 0.029
    m7a = lookup("m7a.2xlarge", region="us-east-1")
    assert m7a.price_spot is None and m7a.memory_gib == 32
    assert {m.name for m in done.rows} == {"c6i.large", "c6i.xlarge", "c7g.large",
                                           "m7a.2xlarge"}  # t3 is not a covered family


def test_a_missing_aws_price_leaves_the_type_out_and_says_so(
    fake_aws_pricing: FakeAwsPricing, user_cache: Path
) -> None:
    aws_data(fake_aws_pricing)
    fake_aws_pricing.products["us-east-1"] = [
        p for p in fake_aws_pricing.products["us-east-1"] if '"c6i.xlarge"' not in p]
    done = refresh.refresh("aws", regions=["us-east-1"])
    assert done.missing == ["c6i.xlarge in us-east-1"]
    assert lookup("c6i.xlarge", region="us-east-1") == shipped_row(
        "c6i.xlarge", "us-east-1", "aws")  # the shipped price, not a refreshed one


def test_an_aws_api_error_is_one_line(
    fake_aws_pricing: FakeAwsPricing, user_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    aws_data(fake_aws_pricing)
    fake_aws_pricing.error = ("GetProducts", 400, "AccessDeniedException",
                              "User is not authorized to perform: pricing:GetProducts")
    code, out, err = run_main(["catalog", "refresh", "--provider", "aws", "--region",
                               "us-east-1"], capsys)
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and "reading the Price List for us-east-1" in err
    assert "pricing:GetProducts" in err
    assert not (user_cache / "aws.csv").exists()


# ---------------------------------------------------------------- SkyPilot

SKY_HEADER = ("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,"
              "Price,SpotPrice,Region,AvailabilityZone")


def sky_catalog(root: Path, version: str, provider: str, lines: list[str]) -> Path:
    path = root / version / provider / "vms.csv"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join([SKY_HEADER, *lines]) + "\n")
    return path


def test_skypilot_import_takes_the_newest_version_and_the_highest_zone_price(
    tmp_path: Path, user_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sky = tmp_path / "sky"
    sky_catalog(sky, "v5", "aws", ["c6i.large,,,2,4,,9.0,,us-east-1,us-east-1a"])
    vms = sky_catalog(sky, "v6", "aws", [
        "c6i.large,,,2.0,4.0,,0.085,0.031,us-east-1,us-east-1a",
        "c6i.large,,,2.0,4.0,,0.085,0.036,us-east-1,us-east-1b",
        "c7g.xlarge,,,4.0,8.0,,0.145,,us-west-2,us-west-2a",
        "p3.2xlarge,V100,1,8,61,,3.06,0.9,us-east-1,us-east-1a",  # accelerator: skipped
        "t3.micro,,,2,1,,0.0104,0.003,us-east-1,us-east-1a",  # not a covered family
    ])
    code, out, err = run_main(["catalog", "refresh", "--provider", "aws", "--from", "skypilot",
                               str(sky)], capsys)
    assert code == 0, err
    assert f"aws: 2 prices in 2 region(s) written to {user_cache / 'aws.csv'}" in out
    c6i = lookup("c6i.large", region="us-east-1")
    assert (c6i.price_on_demand, c6i.price_spot) == (0.085, 0.036)
    assert str(vms) in c6i.price_source and c6i.fetched
    assert lookup("c7g.xlarge", region="us-west-2").arch == "arm64"


def test_a_file_that_is_not_a_skypilot_catalog_is_one_line(
    tmp_path: Path, user_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "vms.csv"
    bad.write_text("name,price\nc6i.large,0.085\n")
    code, _, err = run_main(["catalog", "refresh", "--provider", "aws", "--from", "skypilot",
                             str(bad)], capsys)
    assert code != 0
    assert err == (f"error: {bad}:1: not a SkyPilot vms.csv: missing column(s) InstanceType, "
                   "vCPUs, MemoryGiB, Price, SpotPrice, Region\n")
    code, _, err = run_main(["catalog", "refresh", "--provider", "gcp", "--from", "skypilot",
                             str(tmp_path / "nowhere")], capsys)
    assert code != 0 and err.startswith("error: no SkyPilot catalog for gcp under ")


# ---------------------------------------------------------------- the user's cache


def test_a_catalog_file_the_user_edited_is_not_overwritten_without_force(
    tmp_path: Path, user_cache: Path
) -> None:
    rows = [lookup("c6i.large")]
    path = cache.write_catalog("aws", rows, "test")
    meta = json.loads(cache.meta_path(path).read_text())
    assert meta["source"] == "test" and meta["rows"] == 1
    assert not cache.edited(path)
    cache.write_catalog("aws", rows, "test")  # unchanged since written: replaced quietly
    path.write_text(path.read_text().replace("c6i.large", "c6i.large", 1) + "\n")
    assert cache.edited(path)
    with pytest.raises(cache.EditedCatalogError, match="was edited since cloudprof wrote it"):
        cache.write_catalog("aws", rows, "test")
    edited_text = path.read_text()
    cache.write_catalog("aws", rows, "test", force=True)
    kept = [p for p in os.listdir(user_cache) if p.startswith("aws.csv.edited-")]
    assert len(kept) == 1 and (user_cache / kept[0]).read_text() == edited_text
    assert not cache.edited(path)


def test_a_refresh_never_writes_rows_the_reader_would_refuse(user_cache: Path) -> None:
    bad = catalog.MachineType(provider="aws", name="c6i.large", family="c6i", vcpus=2,
                              memory_gib=4, region="us-east-1", price_on_demand=0.08,
                              price_spot=0.5, price_source="x", price_date="2026-01-01")
    with pytest.raises(CloudprofError, match=r"price_spot 0\.5 is above price_on_demand"):
        cache.write_catalog("aws", [bad], "test")
    assert not (user_cache / "aws.csv").exists()
    assert load_catalog("aws")  # the shipped fallback still loads


def test_gcp_sku_descriptions_match_with_or_without_the_vendor_word() -> None:
    from google.cloud import billing_v1

    from orchestrator.catalog.pricing.gcp import rates_from_skus
    from tests.fixtures.fake_billing import family_skus

    skus = [billing_v1.Sku.from_json(json.dumps(s), ignore_unknown_fields=True)
            for s in [*family_skus("N2D AMD Instance", "us-east1", 0.0275, 0.0037),
                      *family_skus("C4A Instance", "us-east1", 0.031, 0.0034),
                      *family_skus("N2 Instance", "us-east1", 0.0316, 0.0042)]]
    rates = rates_from_skus(skus)
    assert rates[("n2d", "us-east1")].core == pytest.approx(0.0275)
    assert rates[("c4a", "us-east1")].ram == pytest.approx(0.0034)
    assert rates[("n2", "us-east1")].core == pytest.approx(0.0316)  # N2 is not N2D
    assert set(rates) == {("n2d", "us-east1"), ("c4a", "us-east1"), ("n2", "us-east1")}


def test_refreshing_both_clouds_writes_the_one_that_works_and_fails_for_the_other(
    fake_billing: FakeBilling, fake_gce: FakeGce, fake_aws_pricing: FakeAwsPricing,
    user_cache: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    fake_billing.error = (503, "UNAVAILABLE", "The service is currently unavailable.")
    aws_data(fake_aws_pricing)
    code, out, err = run_main(["catalog", "refresh", "--region", "us-east-1"], capsys)
    assert code != 0
    assert err.splitlines()[0].startswith("error: gcp: ")
    assert "aws: 4 prices in 1 region(s) written to" in out
    assert (user_cache / "aws.csv").exists() and not (user_cache / "gcp.csv").exists()


def test_a_gcp_refresh_can_be_limited_to_regions(
    fake_billing: FakeBilling, fake_gce: FakeGce, user_cache: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    gcp_skus(fake_billing)
    code, out, err = run_main(["catalog", "refresh", "--provider", "gcp", "--region",
                               "europe-west1"], capsys)
    assert code == 0, err
    rows = catalog.parse_catalog_file(user_cache / "gcp.csv", "gcp")
    assert rows and {m.region for m in rows} == {"europe-west1"}
    # n2-highcpu-2/8/80 and n2-standard-4: no other family has SKUs in europe-west1
    assert "gcp: 4 prices in 1 region(s)" in out
    assert "no price found for" in err and "t2a in europe-west1" in err


def git_catalog(root: Path, lines_by_provider: dict[str, list[str]], when: str) -> Path:
    """A bare git copy of a skypilot-catalog-shaped repository, committed at ``when``."""
    work = root / "work"
    for provider, lines in lines_by_provider.items():
        sky_catalog(work / "catalogs", "v7", provider, lines)
    env = {**os.environ, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when,
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "prices"]):
        subprocess.run(["git", "-C", str(work), *argv], check=True, env=env)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(root / "bare.git")],
                   check=True)
    return root / "bare.git"


def test_a_git_copy_of_skypilot_catalog_dates_each_price_by_its_commit(
    tmp_path: Path, user_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = git_catalog(tmp_path, {"aws": [
        "c7i.large,,,2.0,4.0,,0.08925,0.0321,us-east-2,use2-az1",
        "c7i.large,,,2.0,4.0,,0.08925,0.0402,us-east-2,use2-az2",
    ]}, "2026-11-02T10:00:00+00:00")
    commit = subprocess.run(["git", f"--git-dir={bare}", "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    code, out, err = run_main(["catalog", "refresh", "--provider", "aws", "--from", "skypilot",
                               str(bare)], capsys)
    assert code == 0, err
    c7i = lookup("c7i.large", region="us-east-2")
    assert c7i.price_source.startswith(f"skypilot-catalog@{commit[:7]} (highest of 2 zone(s)")
    assert (c7i.price_date, c7i.fetched_at) == ("2026-11-02", "2026-11-02T10:00:00Z")
    assert (c7i.price_on_demand, c7i.price_spot) == (0.08925, 0.0402)
    code, out, _ = run_main(["catalog", "--family", "c7i", "--region", "us-east-2"], capsys)
    line = next(x for x in out.splitlines() if " c7i.large " in f" {x} ")
    age = (date.today() - date(2026, 11, 2)).days
    assert f"skypilot-catalog@{commit[:7]} [" in line and f"2026-11-02 ({age} d" in line
    # the checkout it was cloned from reads the same: the file is clean at that commit
    code, out, err = run_main(["catalog", "refresh", "--provider", "aws", "--from", "skypilot",
                               str(tmp_path / "work")], capsys)
    assert code == 0, err
    assert f"(skypilot-catalog@{commit[:7]}, 2026-11-02)" in out
    assert lookup("c7i.large", region="us-east-2").price_date == "2026-11-02"


def test_a_refresh_merges_by_region_and_machine_into_the_users_file(
    tmp_path: Path, user_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = sky_catalog(tmp_path / "a", "v7", "aws", [
        "c6i.large,,,2.0,4.0,,0.085,0.03,us-east-1,use1-az1",
        "c6i.large,,,2.0,4.0,,0.085,0.03,us-west-2,usw2-az1",
        "m6i.large,,,2.0,8.0,,0.096,0.04,us-east-1,use1-az1",
    ])
    second = sky_catalog(tmp_path / "b", "v7", "aws", [
        "c6i.large,,,2.0,4.0,,0.09,0.05,us-east-1,use1-az1",
    ])
    for vms in (first, second):
        code, out, err = run_main(["catalog", "refresh", "--provider", "aws", "--from",
                                   "skypilot", str(vms)], capsys)
        assert code == 0, err
    assert "; 2 kept from earlier refreshes" in out
    mine = {(m.name, m.region): m for m in catalog.parse_catalog_file(user_cache / "aws.csv",
                                                                     "aws")}
    assert set(mine) == {("c6i.large", "us-east-1"), ("c6i.large", "us-west-2"),
                         ("m6i.large", "us-east-1")}
    assert mine["c6i.large", "us-east-1"].price_on_demand == 0.09  # replaced
    assert str(second) in mine["c6i.large", "us-east-1"].price_source
    assert str(first) in mine["c6i.large", "us-west-2"].price_source  # kept
