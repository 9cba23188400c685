"""Shared fixtures: the real local stand-ins live in tests/fixtures/, one module each."""

pytest_plugins = [
    "tests.fixtures.sshd",
    "tests.fixtures.moto_server",
    "tests.fixtures.gcs_emulator",
    "tests.fixtures.fake_gce",
    "tests.fixtures.fake_billing",
    "tests.fixtures.fake_aws_pricing",
]


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _shipped_catalog_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests read the shipped catalog, never a catalog the user refreshed into ~/.cache."""
    from orchestrator.spec.catalog import CATALOG_ENV, shipped_dir

    monkeypatch.setenv(CATALOG_ENV, str(shipped_dir()))
