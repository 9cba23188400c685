"""The sweep's wheel set (orchestrator.providers.wheelhouse): its key, tags and cache.

The platform and key tests are pure; the fetch tests run the real ``pip
download`` against this machine's package index, for a platform that is not
this machine's (arm64), with a small requirement set (psutil) to stay fast.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from orchestrator.providers.wheelhouse import (
    HostPlatform,
    SweepWheels,
    WheelSet,
    WheelsUnavailable,
    cache_key,
    cache_root,
    download_command,
    fetch,
)
from orchestrator.providers.wheels import WHEEL_DEPS, requirements

DEBIAN_X86 = HostPlatform("3.11", "x86_64", "2.36")
DEBIAN_ARM = HostPlatform("3.11", "aarch64", "2.36")
SMALL = ["psutil>=5.9"]


def test_a_host_probe_reads_as_its_platform() -> None:
    assert HostPlatform.parse("3.11 x86_64 glibc 2.36") == DEBIAN_X86
    assert HostPlatform.parse("3.12 arm64 glibc 2.39") == HostPlatform("3.12", "aarch64", "2.39")
    assert HostPlatform.parse("3.12 aarch64") == HostPlatform("3.12", "aarch64", None)  # musl
    assert HostPlatform.parse("Traceback (most recent call last):") is None
    assert HostPlatform.parse("") is None


def test_tags_follow_the_hosts_glibc_and_architecture() -> None:
    x86 = DEBIAN_X86.tags()
    assert x86[0] == "manylinux_2_36_x86_64" and "manylinux_2_28_x86_64" in x86
    assert {"manylinux2014_x86_64", "manylinux1_x86_64"} <= set(x86)
    assert "manylinux_2_37_x86_64" not in x86  # newer than the host's glibc
    arm = DEBIAN_ARM.tags()
    assert all(t.endswith("_aarch64") for t in arm) and "manylinux2014_aarch64" in arm
    assert "manylinux_2_16_aarch64" not in arm and "manylinux1_aarch64" not in arm
    assert HostPlatform("3.11", "aarch64", None).tags() == []  # musl: no manylinux wheel
    assert HostPlatform("3.11", "riscv64", "2.36").tags() == []
    assert DEBIAN_X86.abis() == ["cp311", "abi3", "none"]


def test_the_cache_key_names_requirements_python_and_platform() -> None:
    reqs = requirements()
    assert [r.split(">")[0].split("=")[0] for r in reqs] == list(WHEEL_DEPS)
    key = cache_key(reqs, DEBIAN_X86)
    assert key == cache_key(list(reversed(reqs)), DEBIAN_X86)  # a set, not a list
    others = {cache_key(reqs, DEBIAN_ARM), cache_key(reqs, HostPlatform("3.12", "x86_64", "2.36")),
              cache_key(reqs, HostPlatform("3.11", "x86_64", "2.31")), cache_key(SMALL, DEBIAN_X86)}
    assert key not in others and len(others) == 4


def test_the_download_asks_for_the_hosts_wheels_not_this_machines() -> None:
    argv = download_command(SMALL, DEBIAN_ARM, Path("d"))
    assert "--only-binary=:all:" in argv and argv[-1] == "psutil>=5.9"
    assert argv[argv.index("--python-version") + 1] == "3.11"
    assert argv[argv.index("--implementation") + 1] == "cp"
    platforms = [argv[i + 1] for i, a in enumerate(argv) if a == "--platform"]
    assert platforms == DEBIAN_ARM.tags()


def test_the_cache_lives_under_cloudprofs_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CLOUDPROF_CACHE", str(tmp_path))
    assert cache_root() == tmp_path / "wheels"


@pytest.fixture(scope="module")
def arm_cache(tmp_path_factory) -> tuple[Path, WheelSet]:
    """One real download of a small arm64 set, shared by the tests that read it."""
    root = tmp_path_factory.mktemp("wheels")
    return root, fetch(SMALL, DEBIAN_ARM, root)


def test_an_arm64_set_is_downloaded_once_then_read_from_the_cache(arm_cache, monkeypatch) -> None:
    root, first = arm_cache
    assert not first.cached and first.files and first.size > 0
    assert all(name.endswith(".whl") and "aarch64" in name for name in first.files)
    assert first.directory == root / cache_key(SMALL, DEBIAN_ARM)
    # The second fetch needs no index at all: pip pointed nowhere still finds it.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    again = fetch(SMALL, DEBIAN_ARM, root)
    assert again.cached and again.files == first.files
    assert not [p for p in root.iterdir() if ".tmp-" in p.name]


def test_a_platform_without_wheels_is_unavailable_and_leaves_nothing(tmp_path) -> None:
    with pytest.raises(WheelsUnavailable, match="no manylinux wheels"):
        fetch(SMALL, HostPlatform("3.11", "aarch64", None), tmp_path)
    with pytest.raises(WheelsUnavailable):  # pip finds no such wheel
        fetch(["psutil==0.0.1"], DEBIAN_X86, tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_a_sweep_fetches_each_set_once_for_all_its_hosts(arm_cache) -> None:
    root, first = arm_cache
    lines: list[str] = []
    wheels = SweepWheels(lines.append, 3600, "sweep", reqs=SMALL, root=root)
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(wheels.wheel_set(DEBIAN_ARM)))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == 4 and all(g is got[0] for g in got)
    assert isinstance(got[0], WheelSet) and got[0].files == first.files
    assert len(lines) == 1 and "psutil for cp311 aarch64 glibc 2.36" in lines[0], lines
    assert "from the cache" in lines[0]
    assert wheels.wheel_set(HostPlatform("3.11", "aarch64", None)) is None  # → the index
    assert "install from the package index" in lines[-1]


def test_an_ssh_host_gets_its_set_over_sftp_once(sshd, tmp_path, monkeypatch) -> None:
    """Over a real sshd: the host reports its platform, gets the set copied once, and a
    later sweep finds it complete there (nothing copied again)."""
    from orchestrator.providers.remote import SshTarget, open_ssh

    host_python = tmp_path / "python3"  # the host's python3 without site-packages: no numpy
    host_python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    host_python.chmod(0o755)
    monkeypatch.setenv("CLOUDPROF_SSH_WORKDIR", str(tmp_path / "host"))
    target = SshTarget(sshd.host, sshd.port, sshd.user, sshd.client_key, [sshd.host_public],
                       python=str(host_python))
    lines: list[str] = []
    seen = []
    for _sweep in range(2):
        wheels = SweepWheels(lines.append, 3600, "sweep", reqs=SMALL, root=tmp_path / "cache")
        ex = open_ssh(target, timeout=20)
        try:
            dest = wheels.source(None).deliver(ex, "unused.whl")
        finally:
            ex.close()
        assert dest is not None and dest.startswith(str(tmp_path / "host" / "wheelhouse"))
        copied = sorted(Path(dest).glob("*.whl"))
        (cached,) = (tmp_path / "cache").glob("*/wheels.json")  # this machine's one set
        assert [p.name for p in copied] == sorted(p.name for p in cached.parent.glob("*.whl"))
        assert copied and all("psutil" in p.name for p in copied)
        assert (Path(dest) / ".complete").exists()
        seen.append([p.stat().st_mtime_ns for p in copied])
    assert seen[0] == seen[1]  # the second sweep copied nothing
    assert "from the cache" in lines[-1] and "downloaded" in lines[0]
    assert sum("copied over SSH" in line for line in lines) == 1, lines
