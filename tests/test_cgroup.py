"""Finding the runner's own memory cgroup from /proc/self/cgroup and /proc/self/mountinfo."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workloads.cgroup import (
    CgroupUnavailable,
    PeakWindow,
    TrialCgroup,
    node_cgroup_name,
    own_memory_cgroup,
)

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


def _real_cgroup(name: str) -> TrialCgroup:
    try:
        return TrialCgroup.create(name)
    except CgroupUnavailable as exc:
        pytest.skip(f"no memory cgroup here: {exc}")


def _in(cgroup: TrialCgroup, mib: int) -> None:
    """A child in ``cgroup`` that touches ``mib`` MiB, waited for."""
    code = f"b = bytearray({mib} * 2**20); b[::4096] = b'x' * len(b[::4096])"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   preexec_fn=cgroup.join_in_child)


def test_a_peak_window_reset_at_a_trials_start_forgets_the_earlier_peak() -> None:
    cgroup = _real_cgroup(f"cloudprof-node-window-{os.getpid()}")
    window = PeakWindow(cgroup.version, cgroup.path)
    try:
        _in(cgroup, 200)
        before = window.read()
        assert before is not None and before >= 200 * 2**20
        assert window.reset() == "trial"
        _in(cgroup, 50)
        after = window.read()
        assert after is not None and 50 * 2**20 <= after < 150 * 2**20
    finally:
        window.close()
        assert cgroup.remove() is None
    assert not cgroup.path.exists()


FAKE_RAY = """\
import subprocess, sys
daemon = '''
import os, pathlib, sys, time
memory = [ln for ln in open("/proc/self/cgroup") if ":memory:" in ln or ln.startswith("0::")]
note = os.environ.get("CLOUDPROF_NODE_CGROUP_NOTE", "")
pathlib.Path(sys.argv[1]).write_text(memory[0].strip() + "\\\\n" + note)
time.sleep(120)
'''
subprocess.Popen([sys.executable, "-c", daemon, sys.argv[1]], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("fake ray started")
"""


def _start_fake_node(tmp_path: Path, env: dict[str, str]) -> tuple[str, Path, str]:
    """``ray_trial start`` node 1 with a fake ``ray`` that leaves a daemon behind (as ray
    start does); the temp dir, the file where the daemon wrote its cgroup and the output."""
    temp_dir = tmp_path / "cpray-fake"
    fake, seen = tmp_path / "fake_ray.py", tmp_path / "daemon-cgroup.txt"
    fake.write_text(FAKE_RAY)
    proc = subprocess.run([sys.executable, "-m", "workloads.ray_trial", "start", str(temp_dir),
                           "1", sys.executable, str(fake), str(seen)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    deadline = time.monotonic() + 20
    while not (seen.exists() and "\n" in seen.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return str(temp_dir), seen, proc.stdout


def _stop(temp_dir: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workloads.ray_trial", "stop", temp_dir],
                          capture_output=True, text=True, timeout=60, env=env)


def test_a_node_and_its_daemons_live_in_its_cgroup_until_stop_kills_them_and_removes_it(
        tmp_path: Path) -> None:
    _real_cgroup(f"cloudprof-node-probe-{os.getpid()}").remove()  # skips where none
    env = {k: v for k, v in os.environ.items() if k != "CLOUDPROF_NO_CGROUP"}
    temp_dir, seen, out = _start_fake_node(tmp_path, env)
    try:
        line = seen.read_text().splitlines()[0]
        assert line.endswith("/" + node_cgroup_name(temp_dir, 1)), line
        assert "note:" not in out
        cgroup = Path(Path(temp_dir, "cloudprof-node-1.cgroup").read_text())
        pids = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
        assert len(pids) == 1  # the daemon, outliving `start`; its command line does not
        #                       name the temp dir: only its cgroup ties it to the node
    finally:
        stopped = _stop(temp_dir, env)
    assert stopped.returncode == 0, stopped.stderr
    assert not cgroup.exists() and not Path(temp_dir).exists()
    assert not Path(f"/proc/{pids[0]}").exists() or \
        Path(f"/proc/{pids[0]}/stat").read_text().split()[2] == "Z"


def test_with_cgroups_off_a_node_starts_anyway_and_says_its_peaks_are_sampled(
        tmp_path: Path) -> None:
    env = {**os.environ, "CLOUDPROF_NO_CGROUP": "1"}
    temp_dir, seen, out = _start_fake_node(tmp_path, env)
    try:
        line, note = seen.read_text().splitlines()
        assert "cloudprof-node-" not in line
        assert note == "CLOUDPROF_NO_CGROUP is set"  # what the node's actors report
        # first: a failed start's last line stays Ray's own error, the one the engine shows
        assert out.strip().splitlines()[0] == (
            "note: node 1 has no memory cgroup (CLOUDPROF_NO_CGROUP is set): its peaks are "
            "sampled")
    finally:
        import psutil

        for proc in psutil.process_iter(["cmdline"]):  # the daemon: no cgroup to empty
            if str(seen) in " ".join(proc.info["cmdline"] or []) and proc.pid != os.getpid():
                proc.kill()
        _stop(temp_dir, env)
