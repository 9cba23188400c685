"""Ground truth for a command's peak: the memory a container limit must allow.

Two jobs whose need is known by construction are measured by the runner, then run under
real memory cgroup limits (``--memory-limit``) to find the smallest limit each runs under
by bisection. The report's memory request from three measured repeats must be at least
that limit and at most 10 % above it; a file reader's headline must not be its page cache.
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
RESOLUTION = 0.01  # bisect the smallest limit to this share of it

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


def _smallest_limit(tmp: Path, argv: list[str], fails: int, runs: int,
                    before: Any = None) -> int:
    """Bisect between a limit the job is killed under and one it runs under."""
    assert not _runs_under(tmp, argv, fails, before), f"{fails / MIB:.0f} MiB was enough"
    assert _runs_under(tmp, argv, runs, before), f"{runs / MIB:.0f} MiB was not enough"
    while runs - fails > RESOLUTION * runs:
        mid = (fails + runs) // 2 // 4096 * 4096
        if _runs_under(tmp, argv, mid, before):
            runs = mid
        else:
            fails = mid
    return runs


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
    smallest = _smallest_limit(tmp_path, argv, fails=4 * hold * MIB, runs=req.request_bytes)
    assert smallest <= req.request_bytes <= (1 + WITHIN) * smallest, (
        f"request {req.request_bytes / MIB:.1f} MiB, smallest limit {smallest / MIB:.1f} MiB")
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
    smallest = _smallest_limit(tmp_path, argv, fails=hold * MIB, runs=req.request_bytes,
                               before=uncached)
    assert smallest <= req.request_bytes <= (1 + WITHIN) * smallest, (
        f"request {req.request_bytes / MIB:.1f} MiB, smallest limit {smallest / MIB:.1f} MiB")
