"""The optimality gap's bound: a plain copy of one unit's bytes, timed on the host that ran the
trials (workloads/bound.py), and the cube measured against it."""

from __future__ import annotations

import json
from pathlib import Path

from workloads.bound import CACHE_FILE, bound_at, host_bound, measure


def test_the_copy_bound_is_a_roofline_of_one_thread_up_to_all_cores():
    found = measure(64 * 64 * 8 * 8, cores=2)
    one, every = found["units_per_s_1"], found["units_per_s_all"]
    assert one > 0 and every > 0 and found["threads_all"] == 2
    assert bound_at(found, 1) == one
    assert bound_at(found, 2) == min(2 * one, max(every, one))
    assert bound_at(found, 64) == bound_at(found, 2)  # past the cores: memory-bound
    big = measure(64 * 64 * 8 * 8 * 16, cores=1)  # 16 x the bytes: fewer copies per second
    assert big["units_per_s_1"] < one


def test_the_bound_is_measured_once_per_host_and_unit_size(tmp_path):
    first = host_bound(100_000, tmp_path)
    again = host_bound(100_000, tmp_path)
    assert first["cached"] is False and again["cached"] is True
    assert again["units_per_s_1"] == first["units_per_s_1"]
    other = host_bound(200_000, tmp_path)
    assert other["cached"] is False
    assert len(json.loads((tmp_path / CACHE_FILE).read_text())) == 2


def test_a_cube_trial_carries_its_bound_and_stays_below_it(tmp_path):
    import os
    import subprocess
    import sys

    from workloads import protocol
    from workloads.protocol import TrialRequest

    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "trial"
    # frames larger than the last-level cache together (8 x 1000 x 1000 float64: 61 MiB),
    # as the bound's source is: with 8 frames of 200 x 200 (2.4 MiB) the cube gathered from
    # cache and beat a copy from memory whenever a busy neighbour slowed the memory down
    request = TrialRequest(workload="cube", workers=1, duration_s=1.0, out=str(out), quiet=True,
                           params={"frames": "8", "dim": "64", "rows": "1000", "cols": "1000",
                                   "cache": str(tmp_path / "inputs")})
    env = {**os.environ, "PYTHONPATH": str(repo), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "workloads.run", *request.argv()], env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / protocol.SUMMARY_FILE).read_text())
    bound = summary["bound"]
    assert bound["bytes_per_unit"] == 8 * 64 * 64 * 8
    assert bound["units_per_s"] == bound_at(bound, 1)
    # gathering random columns from 8 frames cannot beat copying the same bytes in a row
    assert 0 < summary["units_per_s"] <= bound["units_per_s"] * 1.1


def test_the_answer_card_names_the_gap_to_the_copy_bound_and_to_linear_scaling(tmp_path):
    from tests.fixtures.in_process import cloudprof

    # in this process: what the card prints and the report's JSON are the command's own
    result = cloudprof("sweep", "--no-report", "--repeats", "1", "--machine", "n2-highcpu-2",
                       "--dry-run", "--workers", "1,2", "--frames", "8", "--dim", "48",
                       "--rows", "100", "--cols", "100", "--duration", "0.5",
                       "--out", str(tmp_path / "runs"), cwd=tmp_path,
                       env={"CLOUDPROF_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "│ Gap " in result.stdout  # the card's line, whatever the terminal's width
    (run,) = list((tmp_path / "runs").iterdir())
    report = cloudprof("report", str(run), "--json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    doc = json.loads(report.stdout)
    (card,) = doc["answer"]
    assert card["bound_units_per_s"] > 0 and card["linear_share"] > 0
    assert card["units_per_s"] <= card["bound_units_per_s"] * 1.1
    assert card["lines"]["gap"].startswith(f"{card['units_per_s'] / card['bound_units_per_s']:.0%}")
