"""The report's memory view: the whole-lifetime peak, its phases, and a memory request."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.results import report
from orchestrator.results.report.memory import (
    DEFAULT_MARGIN,
    MARGIN_SIGMAS,
    MIN_MARGIN,
    ROUND_SHARE,
    memory_request,
    memory_rows,
    round_step,
)
from tests.test_report import write_store

MIB = 2**20


@pytest.mark.parametrize(
    "peaks",
    [[600 * MIB], [600 * MIB, 640 * MIB, 700 * MIB], [500 * MIB, 500 * MIB + 4096],
     [1000 * MIB, 990 * MIB]],
)
def test_a_request_is_the_peak_plus_a_margin_from_the_spread_rounded_up(peaks: list[int]) -> None:
    req = memory_request(peaks)
    assert req is not None and req.peak_bytes == max(peaks)
    if len(peaks) == 1:
        assert req.default and req.margin_bytes == pytest.approx(DEFAULT_MARGIN * max(peaks))
        assert "default" in req.method
    else:
        expected = max(MARGIN_SIGMAS * statistics.stdev(peaks), MIN_MARGIN * max(peaks))
        assert not req.default and req.margin_bytes == pytest.approx(expected)
    step = round_step(req.peak_bytes + req.margin_bytes)
    assert req.request_bytes % step == 0 and step % MIB == 0
    assert req.peak_bytes + req.margin_bytes <= req.request_bytes
    # rounding adds less than one step, and a step is at most ROUND_SHARE of the request
    assert req.request_bytes < req.peak_bytes + req.margin_bytes + step
    assert step <= ROUND_SHARE * (req.peak_bytes + req.margin_bytes)


def test_a_wider_spread_asks_for_more() -> None:
    tight = memory_request([600 * MIB, 602 * MIB, 604 * MIB])
    wide = memory_request([500 * MIB, 550 * MIB, 604 * MIB])
    assert tight is not None and wide is not None
    assert wide.request_bytes > tight.request_bytes and "3σ" in wide.method


def test_no_peak_measured_asks_for_nothing() -> None:
    assert memory_request([]) is None and memory_request([float("nan"), None]) is None


def test_the_report_shows_the_load_peak_as_the_headline_and_a_labelled_default_margin(
    tmp_path: Path,
) -> None:
    trials = [
        {"machine": "n2-highcpu-8", "workers": 1, "units_per_s": 10.0, "repeat": r,
         "peak_rss_bytes": (620 + r) * MIB, "peak_rss_before_trial_bytes": (620 + r) * MIB,
         "peak_rss_trial_bytes": 230 * MIB, "peak_phase": "load", "peak_rss_source": "ru_maxrss"}
        for r in range(3)
    ] + [
        {"machine": "n2-highcpu-8", "workers": 2, "units_per_s": 19.0,
         "peak_rss_bytes": 300 * MIB, "peak_rss_before_trial_bytes": 200 * MIB,
         "peak_rss_trial_bytes": 300 * MIB, "peak_phase": "trial",
         "peak_rss_source": "vmhwm"},
        {"machine": "n2-highcpu-8", "workers": 2, "units_per_s": 1.0, "status": "failed",
         "peak_rss_bytes": 900 * MIB},  # a failed repeat does not count
    ]
    run_dir = write_store(tmp_path / "run", trials)
    rows = {r["workers"]: r for r in memory_rows(report.load_run(run_dir).trials)}
    assert rows[1]["peak_rss_bytes"] == 622 * MIB and rows[1]["peak_phase"] == "load"
    assert rows[1]["trial_peak_bytes"] == 230 * MIB and rows[1]["repeats"] == 3
    assert not rows[1]["margin_is_default"] and rows[1]["request_bytes"] >= 622 * MIB
    assert rows[2]["peak_rss_bytes"] == 300 * MIB and rows[2]["margin_is_default"]
    built = report.build_report(report.load_run(run_dir))
    (table,) = [t for t in built.tables if t.title.startswith("Memory per machine")]
    cells = {row.cells[1]: row.cells for row in table.rows}
    assert cells["1"][3] == "622 MiB" and cells["1"][4] == "load"
    assert "(default margin)" in cells["2"][-1] and "(default margin)" not in cells["1"][-1]
    assert any("default 20%" in note for note in table.notes)


SPIKY = """
import time
base = bytearray(16 << 20)
print("cloudprof:unit tick", flush=True)
for i in range(30):
    if i == 12:
        spike = bytearray(160 << 20)  # 0.3 s far above the rest
    if i == 15:
        del spike
    print("cloudprof:units 1", flush=True)
    time.sleep(0.1)
"""


def _job_sweep(tmp_path: Path, name: str, text: str, *args: str) -> Path:
    """A one-trial dry-run sweep of the job ``text`` (file ``name`` in its workdir)."""
    (tmp_path / "job").mkdir(exist_ok=True)
    (tmp_path / "job" / name).write_text(text)
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "CLOUDPROF_CACHE": str(tmp_path / "cache"),
           "COLUMNS": "1000"}
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "sweep", "--no-report", "--machine", "n2-highcpu-2",
         "--dry-run", "--workers", "1", "--repeats", "1", "--workdir", str(tmp_path / "job"),
         "--command", " ".join(["python", name, *args]), "--out", str(tmp_path / "runs")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    (run,) = list((tmp_path / "runs").iterdir())
    return run


def test_a_jobs_spike_reaches_the_report(tmp_path: Path) -> None:
    run = _job_sweep(tmp_path, "spiky.py", SPIKY)
    (row,) = memory_rows(report.load_run(run).trials)
    (spike,) = row["spikes"]
    assert spike["rss_bytes"] > 160 * MIB and 1.0 < spike["t"] < 3.0
    kept = json.loads(next((run / "summaries").glob("*.json")).read_text())
    assert kept["spikes"] == row["spikes"]
    built = report.build_report(report.load_run(run))
    (table,) = [t for t in built.tables if t.title.startswith("Memory per machine")]
    cell = table.rows[0].cells[-2]
    assert cell.startswith("1: ") and cell.endswith(f"at {spike['t']:.1f} s")


READER = """
import sys
hold = bytearray(16 << 20)
with open(sys.argv[1], "rb", buffering=0) as f:
    while f.read(1 << 20):
        pass
"""


def test_a_readers_page_cache_is_named_beside_its_peak_not_in_it(tmp_path: Path) -> None:
    from workloads import cgroup as cgroups

    try:
        cgroups.TrialCgroup.create().remove()
    except cgroups.CgroupUnavailable as exc:
        pytest.skip(f"no writable memory cgroup: {exc}")
    data = tmp_path / "data.bin"  # not in the workdir: the trial is the first to read it
    with open(data, "wb") as f:
        for _ in range(200):
            f.write(os.urandom(MIB))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    run = _job_sweep(tmp_path, "reader.py", READER, str(data))
    (row,) = memory_rows(report.load_run(run).trials)
    assert row["peak_rss_bytes"] < 100 * MIB
    (other,) = [b for b in row["other_bases"] if b.startswith("cgroup usage with page cache")]
    built = report.build_report(report.load_run(run))
    (table,) = [t for t in built.tables if t.title.startswith("Memory per machine")]
    assert any(other in note and "counts files it read" in note for note in table.notes)
