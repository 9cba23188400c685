"""Shared fixtures: the real local stand-ins live in tests/fixtures/, one module each.

Every test runs hermetically: in an empty working directory of its own (cloudprof's
defaults such as ``runs/`` are relative to it), with ``$HOME`` and the XDG
directories in a temporary directory (nothing is read from the user's ``~/.ssh``,
``~/.aws``, ``~/.config/gcloud`` or ``~/.cache``), and with cloudprof's inputs cache
in a temporary directory shared by the session (generated inputs are reused
between tests, never taken from an earlier run). A fixture or test that sets any of
these itself still wins: it runs after the session's settings.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.fixtures.sshd",
    "tests.fixtures.moto_server",
    "tests.fixtures.gcs_emulator",
    "tests.fixtures.fake_gce",
    "tests.fixtures.fake_billing",
    "tests.fixtures.fake_aws_pricing",
    "tests.fixtures.box",
]


@pytest.fixture(scope="session", autouse=True)
def hermetic_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A temporary $HOME, XDG directories, CLOUDPROF_CACHE and report bundle for the session."""
    root = tmp_path_factory.mktemp("hermetic")
    with pytest.MonkeyPatch.context() as mp:
        for name, sub in (("HOME", "home"), ("XDG_CACHE_HOME", "home/.cache"),
                          ("XDG_CONFIG_HOME", "home/.config"),
                          ("XDG_DATA_HOME", "home/.local/share"),
                          ("CLOUDPROF_CACHE", "cloudprof-cache"),
                          # one Vega bundle (1.6 s of CPU to make) for every report of the
                          # session, whatever cache a test gives its commands
                          ("CLOUDPROF_REPORT_BUNDLE_DIR", "report-bundle")):
            (root / sub).mkdir(parents=True, exist_ok=True)
            mp.setenv(name, str(root / sub))
        yield root


@pytest.fixture(autouse=True)
def empty_working_directory(tmp_path_factory: pytest.TempPathFactory,
                            monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test starts in an empty directory of its own, never in the checkout."""
    cwd = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(cwd)
    return cwd


@pytest.fixture(autouse=True)
def _shipped_catalog_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests read the shipped catalog, never a catalog the user refreshed into ~/.cache."""
    from orchestrator.catalog.machines import CATALOG_ENV, shipped_dir

    monkeypatch.setenv(CATALOG_ENV, str(shipped_dir()))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests marked slow (and the box tests) first; the box tests last instead
    while their images are still to be built.

    With ``-n 3`` the workers take tests in this order; a minutes-long test
    picked up last would leave a core idle while it finishes alone. On a machine
    without the box images (a fresh CI machine) the first box test would wait minutes
    on debootstrap: they are built in the background from the start
    (:func:`pytest_collection_finish`) and the box tests come last. The sort is stable
    and the images cannot appear between the workers' collections, so every worker
    computes the same order.
    """
    from tests.fixtures import box

    box_last = not box.images_built()

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("box") is not None:
            return 2 if box_last else 0
        return 0 if item.get_closest_marker("slow") is not None else 1

    items.sort(key=rank)


_IMAGE_BUILD: list[subprocess.Popen[bytes]] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the box images while the other tests run, when a box test is
    selected and they are not built yet."""
    from tests.fixtures import box

    if any(item.get_closest_marker("box") for item in session.items):
        started = box.build_images_in_background()
        if started is not None:
            _IMAGE_BUILD.append(started)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The background build ends with the session (the box tests waited for it)."""
    for proc in _IMAGE_BUILD:
        proc.wait()
