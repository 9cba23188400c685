"""Finding the runner's own memory cgroup from /proc/self/cgroup and /proc/self/mountinfo."""

from __future__ import annotations

from pathlib import Path

import pytest

from workloads.cgroup import CgroupUnavailable, TrialCgroup, own_memory_cgroup

V1_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_a_hybrid_host_uses_the_v1_memory_hierarchy(tmp_path: Path) -> None:
    mounts = V1_MOUNTS.replace("/sys/fs/cgroup/memory", str(tmp_path))
    (tmp_path / "job" / "a").mkdir(parents=True)
    cgroup = "4:memory:/job/a\n0::/\n"
    assert own_memory_cgroup(cgroup, mounts) == ("cgroup-v1", tmp_path / "job" / "a")


def test_a_container_mount_root_is_taken_off_the_path(tmp_path: Path) -> None:
    # a container sees its own cgroup mounted at the hierarchy's /docker/abc
    mounts = f"35 31 0:32 /docker/abc {tmp_path} rw - cgroup cgroup rw,memory\n"
    (tmp_path / "sub").mkdir()
    cgroup = "4:memory:/docker/abc/sub\n"
    assert own_memory_cgroup(cgroup, mounts) == ("cgroup-v1", tmp_path / "sub")


def test_a_v2_host_needs_the_memory_controller(tmp_path: Path) -> None:
    mounts = f"41 31 0:38 / {tmp_path} rw - cgroup2 cgroup2 rw\n"
    (tmp_path / "user.slice").mkdir()
    (tmp_path / "cgroup.controllers").write_text("cpu io pids\n")
    with pytest.raises(CgroupUnavailable, match="memory controller"):
        own_memory_cgroup("0::/user.slice\n", mounts)
    (tmp_path / "cgroup.controllers").write_text("cpu memory io pids\n")
    assert own_memory_cgroup("0::/user.slice\n", mounts) == ("cgroup-v2",
                                                             tmp_path / "user.slice")


def test_no_cgroup_when_told_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDPROF_NO_CGROUP", "1")
    with pytest.raises(CgroupUnavailable, match="CLOUDPROF_NO_CGROUP is set"):
        TrialCgroup.create()
