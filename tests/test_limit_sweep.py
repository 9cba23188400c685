"""--prove-limit and --find-limit: a sweep proves its memory request under a real cgroup limit."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from orchestrator.results import report
from orchestrator.results.limits import load_limits
from tests.fixtures.in_process import Called, cloudprof
from workloads import cgroup as cgroups

MIB = 2**20
# One process that holds 96 MiB for a moment: enough for a limit to matter, quick to run.
JOB = "import time\nblock = bytearray(96 << 20)\ntime.sleep(0.6)\n"


def _sweep(tmp_path: Path, *args: str) -> Called:
    """The sweep in this process: what it prints and returns is the command's own."""
    return cloudprof("sweep", "--machine", "n2-highcpu-2", "--dry-run", *args,
                     "--out", str(tmp_path / "runs"), cwd=tmp_path, columns=1000,
                     env={"CLOUDPROF_CACHE": str(tmp_path / "cache")})


@pytest.mark.parametrize("args, message", [
    (["--prove-limit"], "--prove-limit runs a --command job under a memory limit"),
    (["--find-limit", "--command", "true", "--adaptive"], "drop --adaptive"),
])
def test_a_limit_check_without_a_command_job_is_one_line(tmp_path, args, message):
    result = _sweep(tmp_path, *args)
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "runs").exists()


def test_find_limit_proves_the_request_and_bisects_the_smallest_limit(tmp_path):
    try:
        cgroups.TrialCgroup.create().remove()
    except cgroups.CgroupUnavailable as exc:
        pytest.skip(f"no writable memory cgroup: {exc}")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "hold.py").write_text(JOB)
    result = _sweep(tmp_path, "--workers", "1", "--repeats", "3", "--find-limit",
                    "--workdir", str(tmp_path / "job"), "--command", "python hold.py")
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    (run,) = list((tmp_path / "runs").iterdir())
    # the limit trials are kept apart: the tables hold the three measured repeats only
    trials = pq.read_table(run / "trials.parquet").to_pylist()
    assert len(trials) == 3 and {t["status"] for t in trials} == {"ok"}
    assert len(list((run / "summaries").glob("*.json"))) == 3
    records = load_limits(run)
    proof = [r for r in records if r["kind"] == "request"]
    assert len(proof) == 1 and proof[0]["ran_unchanged"] and proof[0]["oom_kills"] == 0
    request = proof[0]["request_bytes"]
    assert proof[0]["limit_bytes"] == request >= max(t["peak_rss_bytes"] for t in trials)
    ran = [r["limit_bytes"] for r in records if r["ran_unchanged"]]
    killed = [r["limit_bytes"] for r in records if r["oom_kills"]]
    # the bisection found both sides: killed below 96 MiB held, ran at the smallest found
    assert killed and max(killed) < min(ran) <= request
    assert min(ran) > 96 * MIB and max(killed) < request
    built = report.build_report(report.load_run(run))
    (table,) = [t for t in built.tables if t.title.startswith("Memory request, proven")]
    (row,) = table.rows
    assert row.cells[3] == "ran unchanged" and row.cells[-1] == str(len(records))
    assert "proven under a memory limit" in result.stdout
    assert "--find-limit adds up to 7 trial(s)" in " ".join(result.stdout.split())
    (limits,) = report.report_document(report.load_run(run))["memory_limits"]
    assert limits["proof"] == "ran unchanged" and limits["smallest_ran_bytes"] == min(ran)
    assert json.loads((run / "sweep.json").read_text())["spec"]["find_limit"] is True
