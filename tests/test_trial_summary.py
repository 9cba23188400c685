"""summary.json, the data plane's answer, is a typed record (workloads.protocol.TrialSummary):
every key a real trial writes is declared there, and the keys every summary has are there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workloads import protocol
from workloads.protocol import SUMMARY_KEYS, TrialRequest, TrialSummary

REPO = Path(__file__).resolve().parents[1]


def _summary(request: TrialRequest) -> dict:
    done = subprocess.run([sys.executable, "-m", "workloads.run", *request.argv()],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads((Path(request.out or "") / protocol.SUMMARY_FILE).read_text())


@pytest.mark.parametrize("kind", ["workload", "command", "job"])
def test_every_key_a_trial_writes_is_declared(tmp_path, kind):
    out = str(tmp_path / "trial")
    if kind == "workload":
        request = TrialRequest(workload="cube", workers=1, duration_s=0.5, out=out, quiet=True,
                               params={"frames": "4", "dim": "16", "rows": "40", "cols": "40",
                                       "cache": str(tmp_path / "inputs")})
    else:
        script = tmp_path / "job.py"
        script.write_text("print('cloudprof:units 5')\n" if kind == "job" else "x = 1\n")
        request = TrialRequest(command=(sys.executable, str(script)), job=kind == "job",
                               vars={"trial": "t", "repeat": "0"}, out=out, quiet=True)
    summary = _summary(request)
    declared = set(TrialSummary.__annotations__)
    assert set(summary) <= declared, sorted(set(summary) - declared)
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary["schema"] == protocol.SCHEMA and summary["status"] == "ok"


def test_sweep_json_vm_records_hold_only_declared_fields(tmp_path):
    from orchestrator.results.records import VM_FIELDS, check_vm_fields
    from tests.fixtures.sweeps import dry_run_sweep

    with pytest.raises(ValueError, match="not fields of a VmRecord"):
        check_vm_fields({"state": "ready", "colour": "blue"})
    result = dry_run_sweep(tmp_path, "--frames", "4", "--dim", "16", "--rows", "40",
                           "--cols", "40", "--workers", "1", "--repeats", "1",
                           "--duration", "0.3")
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = list((tmp_path / "runs").iterdir())
    vms = json.loads((run / "sweep.json").read_text())["vms"]
    assert vms and all(set(vm) <= VM_FIELDS for vm in vms.values())
    assert all("id" in vm and "state" in vm for vm in vms.values())
