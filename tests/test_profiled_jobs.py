"""A profiled trial is the same trial with a profiler attached: for a user's own ``--command``
job too (its arguments, grid values, workdir), named by its own functions, and failing like any
other trial when it fails.

The sweeps here are real ``--dry-run`` sweeps on this machine, with real py-spy and memray
(the [dev] extra installs both); the trial's request is checked against the runner's own
parser.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from tests.fixtures.in_process import Called, cloudprof
from workloads import protocol
from workloads.protocol import TrialRequest

REPO = Path(__file__).resolve().parents[1]

# A user's script as they write it: its own argparse options, one function that burns CPU,
# one that holds memory, and it fails when asked to (for the failure test).
TRAIN = textwrap.dedent('''\
    import argparse
    import os
    import sys
    import time


    def build_rows(rows):
        data = []
        for _ in range(rows):
            data.append(bytearray(4096))
        return data


    def fit_model(rows):
        total = 0
        deadline = time.perf_counter() + 0.8
        while time.perf_counter() < deadline:
            total += sum(i * i for i in range(rows))
        return total


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--rows", type=int, required=True)
        parser.add_argument("--fail-when-profiled", action="store_true")
        args = parser.parse_args()
        if args.fail_when_profiled and "-prof-" in os.environ["CLOUDPROF_TRIAL"]:
            print("profiled run refused", file=sys.stderr)
            sys.exit(4)
        data = build_rows(args.rows * 4)
        print(fit_model(args.rows), len(data))


    if __name__ == "__main__":
        main()
''')


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_text(TRAIN)
    return root





def dry_run_sweep(tmp_path: Path, *args: str) -> Called:
    """``cloudprof sweep --dry-run`` of one n2-highcpu-2 worker and one repeat from
    ``tmp_path`` into ``tmp_path/runs``, in this process (its imports are paid once)."""
    return cloudprof("sweep", "--repeats", "1", "--machine", "n2-highcpu-2", "--dry-run",
                     "--workers", "1", *args, "--out", str(tmp_path / "runs"), cwd=tmp_path,
                     env={"CLOUDPROF_CACHE": str(tmp_path / "cache")})


def _report_json(run: Path) -> dict:
    done = cloudprof("report", "--json", str(run), cwd=run)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _records(run: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text())
            for p in (run / "profiles").glob("*/record.json")}


# ------------------------------------------------------------------ the request


def test_a_request_becomes_the_runners_argv_and_back():
    from workloads.run import _split_command, parser

    request = TrialRequest(
        command=("python", "train.py", "--rows", "{rows}", "--profile", "x"), job=True,
        vars={"trial": "m-rows10-w2-prof-memory", "repeat": "0", "rows": "10"}, workers=2,
        duration_s=12.5, sample_hz=20.0, memory_budget_bytes=2**30, profile="memory",
        chdir="/srv/job", params={"inputs": "/srv/in"}, put="/srv/put.json", out="/srv/t1")
    argv = request.argv()
    assert TrialRequest.from_argv(argv) == request
    own, command = _split_command(argv)
    assert command == list(request.command)  # the user's words, and nothing of the runner's
    args = parser().parse_args(own)  # the runner reads every option it is given
    assert (args.profile, args.workers, args.duration, args.sample_hz) == ("memory", 2, 12.5, 20)
    assert args.var == ["trial=m-rows10-w2-prof-memory", "repeat=0", "rows=10"]
    assert str(args.chdir) == "/srv/job" and args.memory_budget == 2**30

    workload = TrialRequest(workload="cube", params={"frames": "4"}, workers=3,
                            duration_s=1 / 3, warmup_s=2.0, ray_nodes=2,
                            ray_address="10.0.0.1:6379", ray_node_params={1: {"inputs": "/a"}},
                            ray_node_chdirs={0: "/j0", 1: "/j1"}, profile="gil", out="/o")
    assert TrialRequest.from_argv(workload.argv()) == workload  # 1/3 survives, unrounded
    assert TrialRequest.from_dict(json.loads(json.dumps(workload.to_dict()))) == workload
    parser().parse_args(workload.argv())
    with pytest.raises(ValueError, match="not a runner option"):
        TrialRequest.from_argv(["--workers", "1", "--bogus"])


def test_a_plan_keeps_requests_in_sweep_json_and_reads_the_older_argument_lists(tmp_path):
    from orchestrator.catalog.machines import lookup
    from orchestrator.plan.planner import Plan, make_plan
    from orchestrator.spec.spec import SweepSpec

    spec = SweepSpec(machines=["n2-highcpu-2"], workers=[1, 2], repeats=1, dry_run=True,
                     command="python train.py --rows {rows}", grid={"rows": ["10", "20"]},
                     profile="cpu")
    plan = make_plan(spec, "s1", [lookup("n2-highcpu-2")])
    trials = plan.vms[0].trials
    profiled = [t for t in trials if t.profiled]
    assert len(profiled) == 4  # every worker count at every grid point
    for t in profiled:  # the same trial as its unprofiled twin, the profiler attached
        twin = next(p for p in trials if not p.profiled and p.workers == t.workers
                    and p.grid == t.grid)
        assert t.request == replace(twin.request, profile="cpu",
                                    vars={**twin.request.vars, "trial": t.trial_id})
        argv = t.request.argv()
        assert argv[argv.index("--") + 1:] == ["python", "train.py", "--rows", "{rows}"]
        assert argv[argv.index("--profile") + 1] == "cpu" and f"rows={t.grid['rows']}" in argv
    stored = json.loads(json.dumps(plan.to_dict()))
    assert Plan.from_dict(stored).vms[0].trials == trials
    # a sweep.json written before requests were stored: its argument lists are read back,
    # the --profile they put after a --command's -- included
    for trial in stored["vms"][0]["trials"]:
        request = TrialRequest.from_dict(trial.pop("request"))
        argv = replace(request, profile=None).argv()
        trial["runner_args"] = argv + (["--profile", "cpu"] if request.profile else [])
    assert Plan.from_dict(stored).vms[0].trials == trials


# ------------------------------------------------------------------ sweeps


@pytest.mark.parametrize(("kind", "function"), [("cpu", "fit_model"), ("memory", "build_rows")])
def test_a_command_job_with_a_grid_is_profiled_and_named_by_its_own_functions(
        project, tmp_path, kind, function):
    result = dry_run_sweep(tmp_path, "--workdir", str(project), "--command",
                    "python train.py --rows {rows}", "--grid", "rows=300,600", "--profile", kind)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    (run,) = list((tmp_path / "runs").iterdir())
    records = _records(run)
    assert sorted(records) == [f"n2-highcpu-2-rows{r}-w1-prof-{kind}" for r in (300, 600)]
    for record in records.values():
        assert record["status"] == "ok", record["error"]
        prof = record["profile"]
        assert prof["status"] == "ok", prof
        if kind == "cpu":
            assert prof["own_functions"][0]["function"].startswith(function)
            assert prof["own_functions"][0]["site"].startswith("train.py:")
        else:
            own = [s for s in prof["top_sites"] if s["own"]]
            assert own and own[0]["caller"] == function, prof["top_sites"]
            # build_rows holds rows * 4 pages of 4 KiB at the peak
            rows = int(json.loads(record["grid"])["rows"])
            assert own[0]["bytes"] >= rows * 4 * 4096
            assert prof["heap"]["top_types"]  # what is on it: tests/test_heap.py
    report = (run / "report.md").read_text()
    assert function in report.replace("\\", "") and "your code" in report and "Slowdown" in report
    if kind == "memory":
        assert "On the heap at the peak" in report
    assert len(re.findall(r"\| [+-]\d+% \|", report)) == 2  # each profiled trial's slowdown
    doc = _report_json(run)
    assert doc["trials"] == {"total": 4, "ok": 4, "not_ok": 0} and doc["failed_trials"] == []
    from orchestrator.results.runs import list_runs

    (listed,) = list_runs(tmp_path / "runs")  # `cloudprof runs`: every planned trial ok
    assert (listed.trials_ok, listed.trials_planned, listed.trials_failed) == (4, 4, 0)


def test_a_profiled_trial_that_fails_fails_the_sweep_and_is_listed(project, tmp_path):
    result = dry_run_sweep(tmp_path, "--workdir", str(project), "--command",
                    "python train.py --rows {rows} --fail-when-profiled", "--grid", "rows=200",
                    "--profile", "cpu")
    assert result.returncode == 6, result.stderr[-3000:]  # a partial sweep, as with any failure
    assert "1 trial(s) not ok" in result.stderr
    (run,) = list((tmp_path / "runs").iterdir())
    assert json.loads((run / "sweep.json").read_text())["status"] == "partial"
    doc = _report_json(run)
    assert doc["trials"] == {"total": 2, "ok": 1, "not_ok": 1}
    (failed,) = doc["failed_trials"]
    assert failed["trial_id"] == "n2-highcpu-2-rows200-w1-prof-cpu" and failed["profiled"]
    assert failed["status"] == "failed" and "exited with code 4" in failed["error"]
    report = (run / "report.md").read_text()
    assert "2 trials: 1 ok, 1 not ok (1 profiled)" in report
    assert "n2-highcpu-2-rows200-w1-prof-cpu" in report.split("Trials that did not finish ok")[1]
    from orchestrator.results.runs import list_runs

    (listed,) = list_runs(tmp_path / "runs")  # `cloudprof runs`: 1 of 2 planned ok, 1 failed
    assert (listed.trials_ok, listed.trials_planned, listed.trials_failed) == (1, 2, 1)


def test_the_runner_hands_the_users_program_only_its_own_arguments(tmp_path):
    """The runner end of the request: --profile before the --, the job's words after it."""
    script = tmp_path / "argv.py"
    script.write_text("import sys, time\nprint(sys.argv[1:])\ntime.sleep(0.3)\n")
    out = tmp_path / "trial"
    request = TrialRequest(command=(sys.executable, str(script), "--rows", "{rows}"), job=True,
                           vars={"trial": "t-prof-cpu", "repeat": "0", "rows": "7"},
                           profile="cpu", out=str(out), quiet=True)
    done = subprocess.run([sys.executable, "-m", "workloads.run", *request.argv()],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / protocol.SUMMARY_FILE).read_text())
    assert summary["profiled"] is True and summary["status"] == "ok"
    assert "['--rows', '7']" in (out / "output.log").read_text()


BATCH = textwrap.dedent('''\
    import multiprocessing
    import sys


    def score(n):
        total = 0
        for i in range(n):
            total += i * i % 7
        block = bytearray(3_000_000)  # each worker process holds 3 MB here at its peak
        return total + len(block)


    if __name__ == "__main__":
        with multiprocessing.get_context("fork").Pool(int(sys.argv[1])) as pool:
            print(sum(pool.map(score, [1_500_000] * 6)))  # ~2 s: py-spy attaches under load
''')


@pytest.mark.parametrize("kind", ["cpu", "memory"])
def test_a_process_tree_job_is_profiled_in_its_worker_processes(tmp_path, kind):
    (tmp_path / "batch.py").write_text(BATCH)
    out = tmp_path / "trial"
    request = TrialRequest(command=("python", "batch.py", "{workers}"), job=True, workers=2,
                           vars={"trial": f"t-prof-{kind}", "repeat": "0"}, profile=kind,
                           chdir=str(tmp_path), out=str(out), quiet=True)
    done = subprocess.run([sys.executable, "-m", "workloads.run", *request.argv()],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    prof = json.loads((out / protocol.SUMMARY_FILE).read_text())["profile"]
    assert prof["status"] == "ok", prof
    if kind == "cpu":  # py-spy follows the pool's workers
        assert "score" in [f["function"] for f in prof["own_functions"][:2]], prof
    else:  # memray follows the forks: each worker's capture, at its own peak
        assert len(prof["processes"]) >= 2, prof
        top = prof["top_sites"][0]
        assert (top["function"], top["site"], top["own"]) == ("score", "batch.py:9", True)
        assert top["bytes"] >= 2 * 3_000_000
