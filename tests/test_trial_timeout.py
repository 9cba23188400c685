"""Bounded trials: every trial has a time limit, a stuck one shows it live and is failed
with one line when the limit fires; the sweep goes on with the next trial."""

from __future__ import annotations

import io
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.engine import timeouts
from orchestrator.engine.progress import STALL_S, RunningTrial, SweepProgress
from orchestrator.plan.planner import TrialPlan
from orchestrator.spec.spec import SweepSpec
from tests.fixtures import sweeps
from tests.fixtures.in_process import Called, cloudprof
from workloads.protocol import TrialRequest


def dry_run_sweep(tmp_path: Path, *args: str) -> Called:
    """``cloudprof sweep --dry-run`` of one n2-highcpu-2 worker and one repeat, in this
    process (tests/fixtures/in_process.py), from ``tmp_path`` into ``tmp_path/runs`` with
    its own cache, without the report's files (nothing here reads them); ``args`` add to
    or override it."""
    return cloudprof("sweep", "--no-report", "--repeats", "1", "--machine", "n2-highcpu-2",
                     "--dry-run", "--workers", "1", *args, "--out", str(tmp_path / "runs"),
                     cwd=tmp_path, env={"CLOUDPROF_CACHE": str(tmp_path / "cache")})


def _trial(workers: int, grid: dict[str, str] | None = None, profiled: bool = False,
           command: bool = False) -> TrialPlan:
    request = (TrialRequest(command=("python", "job.py"), job=True, workers=workers) if command
               else TrialRequest(workload="cube", workers=workers))
    return TrialPlan(trial_id=f"m-w{workers}", machine="m", workers=workers, repeat=0,
                     request=request, grid=grid or {}, profiled=profiled)


def test_a_trial_of_known_length_gets_a_multiple_of_it_plus_a_floor():
    spec = SweepSpec(machines=["m"], duration_s=3.0, warmup_s=2.0)
    limits = timeouts.TrialTimeouts(spec)
    assert limits.limit(_trial(4)) == timeouts.MULTIPLE * 5.0 + timeouts.FLOOR_S
    assert limits.limit(_trial(4, profiled=True)) == (timeouts.MULTIPLE * 5.0
                                                      + timeouts.PROFILED_FLOOR_S)
    job = SweepSpec(machines=["m"], command="python job.py", stop_after_s=30.0)
    assert timeouts.TrialTimeouts(job).limit(_trial(1, command=True)) == (
        timeouts.MULTIPLE * 30.0 + timeouts.FLOOR_S)


def test_the_trial_timeout_option_applies_to_every_trial():
    spec = SweepSpec(machines=["m"], command="python job.py", trial_timeout_s=42.0)
    limits = timeouts.TrialTimeouts(spec)
    assert limits.limit(_trial(1, command=True)) == 42.0
    limits.finished(_trial(1, command=True), 500.0)
    assert limits.limit(_trial(1, command=True)) == 42.0


def test_a_fixed_work_job_is_bounded_by_its_slowest_finished_trial_scaled_by_workers():
    spec = SweepSpec(machines=["m"], command="python job.py")
    limits = timeouts.TrialTimeouts(spec)
    small, large = {"rows": "10"}, {"rows": "1000"}
    assert limits.limit(_trial(1, small, command=True)) == timeouts.FIRST_FIXED_WORK_S
    limits.finished(_trial(2, small, command=True), 10.0)
    # one worker may take twice as long as two did; four need not be faster than two did
    assert limits.limit(_trial(1, small, command=True)) == (timeouts.MULTIPLE * 20.0
                                                            + timeouts.FLOOR_S)
    assert limits.limit(_trial(4, small, command=True)) == (timeouts.MULTIPLE * 10.0
                                                            + timeouts.FLOOR_S)
    # another grid point is other work: nothing measured for it yet
    assert limits.limit(_trial(2, large, command=True)) == timeouts.FIRST_FIXED_WORK_S
    limits.finished(_trial(2, large, command=True, profiled=True), 1.0)  # a profiler's time
    assert limits.limit(_trial(2, large, command=True)) == timeouts.FIRST_FIXED_WORK_S


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_running_trial_shows_its_time_against_its_limit_and_when_it_stalls():
    clock = Clock()
    running = RunningTrial("w=4 r0", 132.0, expects_units=True, clock=clock)
    clock.now += 5
    running.saw(100)
    assert running.text() == ("w=4 r0 5s of 132s", None)
    clock.now += STALL_S + 2  # lines go on, units do not
    running.saw(100)
    assert running.text() == ("w=4 r0 17s of 132s", f"no progress for {STALL_S + 2:.0f}s")
    clock.now += STALL_S + 5  # no line at all
    assert running.text()[1] == f"no output for {STALL_S + 5:.0f}s"


def test_a_fixed_work_job_is_not_called_stalled_for_reporting_no_units():
    clock = Clock()
    running = RunningTrial("w=1 r0", 3600.0, expects_units=False, clock=clock)
    for _ in range(30):
        clock.now += 1
        running.saw(0)
    assert running.text() == ("w=1 r0 30s of 3,600s", None)


def test_the_live_display_renders_the_running_trial_column():
    out = io.StringIO()
    console = Console(file=out, width=160, force_terminal=True, color_system=None)
    with SweepProgress(console) as progress:
        progress.add_machine("vm", "n2-highcpu-2", 2)
        progress.trial_started("vm", _trial(4), 3.0, 132.0)
        progress.line("vm", "progress t=1.0 units=0 units_per_s=0.00 rss_bytes=1000")
        assert progress._progress is not None
        progress._progress.refresh()
    assert re.search(r"w=4 r0 \d+s of 132s", out.getvalue()) and "0.0 units/s" in out.getvalue()


def test_a_job_that_counts_no_units_shows_its_time_not_zero_units_per_second():
    out = io.StringIO()
    console = Console(file=out, width=160, force_terminal=True, color_system=None)
    with SweepProgress(console) as progress:
        progress.add_machine("vm", "n2-highcpu-2", 2)
        progress.trial_started("vm", _trial(1, command=True), 3.0, 3600.0)
        progress.line("vm", "progress t=1.0 units=0 units_per_s=0.00 rss_bytes=1000")
        assert progress._progress is not None
        progress._progress.refresh()
        progress.trial_started("vm", _trial(2, command=True), 3.0, 3600.0)
        progress.line("vm", "progress t=1.0 units=5 units_per_s=5.00 rss_bytes=1000")
        progress._progress.refresh()
    text = out.getvalue()
    assert re.search(r"w=1 r0 \d+s of 3,600s", text) and "0.0 units/s" not in text
    assert "5.0 units/s" in text  # one that does count them shows its rate


HANG = textwrap.dedent('''\
    import sys
    import time

    if sys.argv[1] == "stuck":
        time.sleep(600)  # a job that never ends
    print("done")
''')





@pytest.mark.slow
def test_a_stuck_trial_is_failed_at_its_limit_with_one_line_and_the_sweep_goes_on(tmp_path):
    root = tmp_path / "job"
    root.mkdir()
    (root / "hang.py").write_text(HANG)
    # long enough for the quick case's interpreters to start on a loaded host
    (root / "sweep.toml").write_text('trial_timeout = "8s"\n')
    result = dry_run_sweep(tmp_path, "--config", str(root / "sweep.toml"), "--workdir", str(root),
                           "--command", "python hang.py {case}", "--grid", "case=stuck,quick")
    assert result.returncode == 6, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "failed: timed out after 8 s (--trial-timeout)" in result.stdout
    (run,) = list((tmp_path / "runs").iterdir())
    import pyarrow.parquet as pq

    rows = {json.loads(r["grid"])["case"]: r for r in pq.read_table(run / "trials.parquet")
            .to_pylist()}
    assert rows["stuck"]["status"] == "failed"
    assert rows["stuck"]["error"] == "timed out after 8 s (--trial-timeout)"
    assert rows["quick"]["status"] == "ok"
    assert not sweeps.processes_with(str(run))  # the stuck job's process is gone too
    assert json.loads((run / "sweep.json").read_text())["spec"]["trial_timeout_s"] == 8.0


def test_a_bad_trial_timeout_is_one_line_before_anything_runs(tmp_path):
    result = dry_run_sweep(tmp_path, "--trial-timeout", "soon")
    assert result.returncode == 2
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: --trial-timeout: expected a duration such as 5, 30s, 2m or 1h, "
                      "got 'soon'"]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_a_stuck_trial_on_an_ssh_host_is_failed_at_its_limit_and_the_machine_goes_on(
        sshd, tmp_path, tmp_path_factory):
    """Over SSH the limit stops the remote process group; the trial fails, not the machine."""
    from tests.fixtures.workloads_env import seed_workloads_env
    from tests.test_ssh_provider import _loopback_hosts

    root = tmp_path / "job"
    root.mkdir()
    (root / "hang.py").write_text(HANG)
    hosts = _loopback_hosts(tmp_path, sshd, python=sys.executable)
    host_workdir = tmp_path / "host-workdir"
    seed_workloads_env(host_workdir, tmp_path_factory)
    env = {"CLOUDPROF_SSH_WORKDIR": str(host_workdir), "CLOUDPROF_SSH_ENDPOINT": None,
           "CLOUDPROF_SSH_KEY": None, "CLOUDPROF_SSH_HOST_KEY": None}
    result = cloudprof(
        "sweep", "--no-report", "--repeats", "1", "--provider", "ssh", "--hosts", str(hosts),
        "--machine", "box", "--workers", "1", "--workdir", str(root),
        "--command", "python hang.py {case}", "--grid", "case=stuck,quick",
        "--trial-timeout", "8", "--out", str(tmp_path / "runs"),  # quick on a loaded host
        cwd=tmp_path, env={"CLOUDPROF_CACHE": str(tmp_path / "cache"), **env})
    assert result.returncode == 6, result.stderr[-2000:] + result.stdout[-2000:]
    (run,) = list((tmp_path / "runs").iterdir())
    import pyarrow.parquet as pq

    rows = {json.loads(r["grid"])["case"]: r for r in pq.read_table(run / "trials.parquet")
            .to_pylist()}
    assert (rows["stuck"]["status"], rows["stuck"]["error"]) == (
        "failed", "timed out after 8 s (--trial-timeout)")
    assert rows["quick"]["status"] == "ok"
    assert not sweeps.processes_with("hang.py stuck")


def test_the_plan_says_how_long_a_trial_may_run(tmp_path):
    result = cloudprof("sweep", "--machine", "n2-highcpu-2", "--dry-run", "--plan",
                       "--duration", "5", "--warmup", "2", cwd=tmp_path,
                       env={"CLOUDPROF_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    limit = timeouts.MULTIPLE * 7 + timeouts.FLOOR_S
    assert f"Time limit: a trial is failed after {limit:.0f} s" in result.stdout
