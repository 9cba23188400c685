"""Issue 5's fault tests: signals at each phase, a dying sshd, SIGKILL + resume, secrets.

Every cloud test drives the real ``cloudprof sweep`` process against moto (aws)
or the fake Compute Engine with the GCS emulator (gcp), with a loopback sshd as
the VM (``tests/fixtures/sweeps.py``). The phase a signal lands in is chosen by
watching the cloud, the files the "VM" received and its processes, not by
sleeping.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.errors import EXIT_INTERRUPTED
from tests.fixtures import sweeps
from tests.fixtures.sweeps import CloudSweep, processes_with, wait_for

# The fixtures of tests/fixtures/sweeps.py, for this module.
cloud_sweep = sweeps.cloud_sweep
bootstrapped_workdir = sweeps.bootstrapped_workdir

PRIVATE_KEY_RE = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S)


def _trials(run_dir: Path) -> pd.DataFrame:
    path = run_dir / "trials.parquet"
    return pd.read_parquet(path) if path.is_file() else pd.DataFrame(columns=["trial_id",
                                                                              "status"])


def _assert_torn_down(sweep: CloudSweep, run_dir: Path) -> None:
    """Nothing of the sweep is left: cloud resources, the key pair, processes on the VM."""
    assert sweep.live() == []  # instances, key pairs, security groups, firewall rules
    assert not (run_dir / "keys").exists()  # the per-sweep SSH key pair is gone too
    wait_for("the VM's processes of the sweep to end",
             lambda: not [p for p in processes_with(str(sweep.workdir))
                          if "workloads" in p or "pip" in p], timeout=15)


# ---------------------------------------------------------------- signals at each phase


def _reach(sweep: CloudSweep, phase: str, proc: subprocess.Popen) -> None:
    if phase == "provisioning":  # the VM exists, its sshd is not up yet
        wait_for("the VM to be created", sweep.live_instances, proc)
    elif phase == "bootstrap":  # the wheel is on the VM and the venv is being built
        wait_for("the bootstrap", lambda: list(sweep.workdir.glob("wheels/*.whl")), proc)
    else:  # one trial recorded and the next one running
        wait_for("a finished trial and a running one",
                 lambda: sweep.trials_done() >= 1 and sweep.runners(), proc)


@pytest.mark.slow
@pytest.mark.parametrize(("cloud_sweep", "phase", "sig"), [
    ("aws", "provisioning", signal.SIGINT),
    ("aws", "bootstrap", signal.SIGTERM),
    ("aws", "trial", signal.SIGINT),
    ("gcp", "provisioning", signal.SIGTERM),
    ("gcp", "bootstrap", signal.SIGINT),
    ("gcp", "trial", signal.SIGTERM),
], indirect=["cloud_sweep"], ids=lambda v: v.name if isinstance(v, signal.Signals) else None)
def test_signal_at_each_phase_tears_everything_down_and_keeps_finished_trials(
    cloud_sweep: CloudSweep, tmp_path: Path, phase: str, sig: signal.Signals,
) -> None:
    sweep = cloud_sweep
    if phase == "provisioning":
        sweep.sshd.stop()  # the VM is still booting: SSH refused
    if phase == "bootstrap":  # a fresh VM: the venv has to be built
        sweep.workdir = tmp_path / "fresh-vm"
        sweep.env["CLOUDPROF_SSH_WORKDIR"] = str(sweep.workdir)
    proc = sweep.start(sweep.argv("1,2,3", "1.5"))
    _reach(sweep, phase, proc)
    done_before = sweep.trials_done()
    proc.send_signal(sig)
    out, err = sweep.finish(proc)

    assert proc.returncode == EXIT_INTERRUPTED, (out[-2000:], err[-2000:])
    assert "Traceback" not in out + err
    assert "tearing down" in out and "--resume" in err
    run_dir = sweep.run_dir()
    assert run_dir is not None
    _assert_torn_down(sweep, run_dir)
    assert json.loads((run_dir / "sweep.json").read_text())["status"] == "interrupted"
    trials = _trials(run_dir)
    ok = trials[trials["status"] == "ok"]
    assert len(ok) >= done_before  # every trial finished before the signal is in the store
    if phase == "trial":
        assert done_before >= 1 and len(ok) >= 1
    else:  # the signal really landed before any trial ran
        assert len(trials) == 0 and sweep.instances_created() == 1


# ---------------------------------------------------------------- the VM's sshd dies


@pytest.mark.slow
@pytest.mark.parametrize("cloud_sweep", ["aws", "gcp"], indirect=True)
def test_sshd_killed_during_a_trial_is_retried_and_the_vm_still_torn_down(
    cloud_sweep: CloudSweep,
) -> None:
    sweep = cloud_sweep
    proc = sweep.start(sweep.argv("1", "3"))
    wait_for("the trial to run", sweep.runners, proc)
    sweep.sshd.stop()  # the daemon and every session die, the VM stays
    wait_for("the engine to notice and retry",
             lambda: "retrying on the same machine" in (sweep.tmp / "sweep.out").read_text(),
             proc, timeout=60)
    sweep.sshd.start()  # the host's sshd is back
    out, err = sweep.finish(proc)

    assert "Traceback" not in out + err
    run_dir = sweep.run_dir()
    assert run_dir is not None
    trials = _trials(run_dir)
    assert len(trials) == 1
    row = trials.iloc[0]
    if row["status"] == "ok":  # retried (or its result collected) on the same VM
        assert proc.returncode == 0, err[-2000:]
        assert row["units"] > 0
    else:  # recorded as failed, with why
        assert row["status"] == "failed" and "connection" in str(row["error"])
    assert "connection lost" in out
    assert sweep.instances_created() == 1  # the same VM, not a new one
    _assert_torn_down(sweep, run_dir)


# ---------------------------------------------------------------- SIGKILL, then resume


@pytest.mark.slow
@pytest.mark.parametrize("cloud_sweep", ["aws", "gcp"], indirect=True)
def test_sigkill_then_resume_runs_each_missing_trial_once_and_no_trial_twice(
    cloud_sweep: CloudSweep,
) -> None:
    sweep = cloud_sweep
    before = set(sweep.workdir.glob("trials/*"))
    proc = sweep.start(sweep.argv("1,2,3", "1"))
    wait_for("a finished trial and a running one",
             lambda: sweep.trials_done() >= 1 and sweep.runners(), proc)
    proc.kill()  # the laptop dies: no teardown at all
    proc.wait(30)
    run_dir = sweep.run_dir()
    assert run_dir is not None
    done = set(_trials(run_dir).query("status == 'ok'")["trial_id"])
    assert done and len(sweep.live_instances()) == 1  # the VM outlived the sweep

    code, out, err = sweep.run([sys.executable, "-m", "orchestrator", "sweep", "--resume",
                                str(run_dir)], log="resume")
    assert code == 0, (out[-2000:], err[-2000:])
    assert f"{len(done)} trial(s) already done" in out
    trials = _trials(run_dir)
    assert sorted(trials["workers"]) == [1, 2, 3] and set(trials["status"]) == {"ok"}
    assert sweep.instances_created() == 1  # reattached to the VM, not a second one
    _assert_torn_down(sweep, run_dir)
    ran = [p.name for p in set(sweep.workdir.glob("trials/*")) - before]
    for trial_id in trials["trial_id"]:
        attempts = [name for name in ran if name.startswith(f"{trial_id}-")]
        # a trial done before the kill never runs again; the one in flight ran twice at most
        assert len(attempts) == (1 if trial_id in done else len(attempts)) and attempts
        assert len(attempts) <= 2
