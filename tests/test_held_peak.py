"""Ground truth for a command's peak: the memory a container limit must allow.

Two jobs whose need is known by construction are measured by the runner, then run under
real memory cgroup limits (``--memory-limit``): the report's memory request from three
measured repeats must be at least the smallest limit each runs under and at most 10 % above
it (it runs under the request, and is killed 10 % below it); a file reader's headline must
not be its page cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.results.report.memory import memory_request
from workloads import cgroup as cgroups
from workloads import protocol

MIB = 2**20
REPEATS = 3
WITHIN = 0.10  # the request may be this much above the smallest limit that works

# A parent and three children, each importing numpy and holding HOLD MiB, all at once.
TREE_JOB = """
import subprocess, sys, time
import numpy as np
hold = int(sys.argv[1]) * 2**20
if sys.argv[2:] == ["child"]:
    block = np.ones(hold, dtype=np.uint8)
    print("ready", flush=True)
    sys.stdin.read()  # until the parent lets go
    sys.exit(0)
kids = [subprocess.Popen([sys.executable, __file__, sys.argv[1], "child"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True) for _ in range(3)]
block = np.ones(hold, dtype=np.uint8)
for kid in kids:
    assert kid.stdout.readline().strip() == "ready"
time.sleep(1.5)  # all four hold their blocks now: several samples and a slow tick see it
for kid in kids:
    kid.stdin.close()
sys.exit(max(kid.wait() for kid in kids))
"""

# Holds HOLD MiB and streams a file twice its size through read(): page cache, not its own.
READER_JOB = """
import sys, time
import numpy as np
block = np.ones(int(sys.argv[2]) * 2**20, dtype=np.uint8)
with open(sys.argv[1], "rb", buffering=0) as f:
    while f.read(2**20):
        pass
time.sleep(1.0)
"""


def _cgroups_writable() -> str | None:
    try:
        cgroups.TrialCgroup.create().remove()
    except cgroups.CgroupUnavailable as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_cgroups_writable() is not None,
                                reason=f"no writable memory cgroup: {_cgroups_writable()}")


def _trial(out: Path, argv: list[str], limit: int | None = None,
           env: dict[str, str] | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "workloads.run", "--quiet", "--out", str(out)]
    if limit is not None:
        cmd += ["--memory-limit", str(limit)]
    subprocess.run([*cmd, "--command", "--", sys.executable, *argv], check=False,
                   capture_output=True, timeout=120, env={**os.environ, **(env or {})})
    return json.loads((out / protocol.SUMMARY_FILE).read_text())


def _runs_under(tmp: Path, argv: list[str], limit: int, before: Any = None) -> bool:
    if before is not None:
        before()
    summary = _trial(tmp / f"limit-{limit}", argv, limit)
    assert summary["memory_limit"]["limit_bytes"] == limit
    ran = summary["memory_limit"]["ran_unchanged"]
    # an OOM kill, and nothing else, is what makes a run under a limit fail here
    assert ran == (summary["status"] == "ok"), summary["error"]
    assert ran == (summary["memory_limit"]["oom_kills"] == 0), summary["memory_limit"]
    return bool(ran)


def _request_is_within(tmp: Path, argv: list[str], request: int,
                        before: Any = None) -> None:
    """The job runs under ``request`` and is killed under ``request / (1 + WITHIN)``: the
    smallest limit it runs under lies in between, so ``request`` is at least that limit and
    at most WITHIN above it. (Two runs say what a bisection to that limit would, more
    exactly: the bisected limit could itself be above the true one by its resolution.)"""
    below = -int(-request / (1 + WITHIN) // 4096) * 4096  # whole pages, not below it
    assert _runs_under(tmp, argv, request, before), (
        f"the request, {request / MIB:.1f} MiB, was not enough")
    assert not _runs_under(tmp, argv, below, before), (
        f"{below / MIB:.1f} MiB was enough: the request, {request / MIB:.1f} MiB, is more "
        f"than {WITHIN:.0%} above the smallest limit")


def _measured(tmp: Path, argv: list[str], before: Any = None) -> list[dict[str, Any]]:
    out = []
    for r in range(REPEATS):
        if before is not None:
            before()
        summary = _trial(tmp / f"repeat-{r}", argv)
        assert summary["status"] == "ok", summary["error"]
        assert summary["peak_rss_source"] in ("held", "held_cgroup", "vmhwm", "ru_maxrss")
        out.append(summary)
    return out


@pytest.mark.slow
def test_a_numpy_tree_gets_a_request_within_10_percent_above_the_smallest_limit(
    tmp_path: Path,
) -> None:
    hold = 128
    job = tmp_path / "tree.py"
    job.write_text(TREE_JOB)
    argv = [str(job), str(hold)]
    runs = _measured(tmp_path, argv)
    peaks = [s["peak_rss_bytes"] for s in runs]
    # four processes hold their blocks at once, each with an interpreter and numpy besides
    assert min(peaks) > 4 * hold * MIB
    for s in runs:  # the libraries the four map are counted once, not once per process
        basis = s["peak_basis"]
        assert basis["file_once_bytes"] < basis["file_sum_bytes"]
        assert s["peak_rss_sampled_bytes"] > s["peak_rss_bytes"]
    req = memory_request(peaks)
    assert req is not None and not req.default
    assert not _runs_under(tmp_path, argv, 4 * hold * MIB), "the blocks alone were enough"
    _request_is_within(tmp_path, argv, req.request_bytes)
    # without a cgroup (anonymous memory summed per process) the figure is the same
    alone = _trial(tmp_path / "no-cgroup", argv, env={cgroups.DISABLE_ENV: "1"})
    assert alone["peak_basis"]["anon_from"] == "statm sum"
    assert abs(alone["peak_rss_bytes"] - max(peaks)) < 0.03 * max(peaks)


@pytest.mark.slow
def test_a_file_readers_headline_is_what_it_holds_not_its_page_cache(tmp_path: Path) -> None:
    hold, size = 320, 640
    data = tmp_path / "big.bin"
    block = os.urandom(MIB)
    with open(data, "wb") as f:
        for _ in range(size):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())

    def uncached() -> None:  # each run reads it from disk: its cgroup is charged the cache
        fd = os.open(data, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    job = tmp_path / "reader.py"
    job.write_text(READER_JOB)
    argv = [str(job), str(data), str(hold)]
    runs = _measured(tmp_path, argv, uncached)
    for s in runs:
        assert hold * MIB < s["peak_rss_bytes"] < (hold + 64) * MIB
        # the cgroup was charged the file's page cache: the old headline, 2.5x too high
        assert s["peak_usage_with_cache_bytes"] > (hold + size // 2) * MIB
        assert "cgroup usage with page cache" in s["peak_bases_note"]
    req = memory_request([s["peak_rss_bytes"] for s in runs])
    assert req is not None
    assert not _runs_under(tmp_path, argv, hold * MIB, uncached), "its block alone was enough"
    _request_is_within(tmp_path, argv, req.request_bytes, before=uncached)
