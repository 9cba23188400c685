"""A user's own job: shipping the workdir, --setup, --command with the stdout protocol, --grid.

The user project here is real: a module, a data file and a requirements file
naming one small PyPI package (tabulate), installed by ``--setup`` with pip
from the package index; the module imports it, so a trial that runs proves
the code, the data and the dependency all arrived.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.engine import jobs
from tests.fixtures import sweeps
from tests.fixtures.in_process import Called, cloudprof
from workloads import protocol

# The cloud stand-ins' fixtures (tests/fixtures/sweeps.py), for this module.
cloud_sweep = sweeps.cloud_sweep
bootstrapped_workdir = sweeps.bootstrapped_workdir

REPO = Path(__file__).resolve().parents[1]
SETUP = "python -m pip install --quiet -r requirements.txt"
JOB = textwrap.dedent('''\
    """A user's job: reads its data, uses a package its requirements name, speaks the protocol."""
    import os
    import sys
    import time

    import tabulate


    def main() -> None:
        workers = int(sys.argv[1])
        print("cloudprof:unit row")
        print("cloudprof:phase load")
        rows = open(os.path.join("data", "rows.csv")).read().split()
        blob = bytearray(40_000_000)  # load holds 40 MB
        time.sleep(0.3)
        del blob
        print("cloudprof:phase fit")
        for _ in range(4):
            print(f"cloudprof:units {len(rows) * workers}")
            time.sleep(0.1)
        print(tabulate.tabulate([[len(rows), workers, os.environ["CLOUDPROF_TRIAL"]]]))


    if __name__ == "__main__":
        main()
''')


@pytest.fixture
def user_project(tmp_path: Path) -> Path:
    """A project directory as a user has it, with things that must not be shipped."""
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    (root / "userjob.py").write_text(JOB)
    (root / "data" / "rows.csv").write_text("a b c d e\n")
    (root / "requirements.txt").write_text("tabulate\n")
    (root / ".gitignore").write_text("scratch/\n*.log\n")
    (root / ".cloudprofignore").write_text("notes.txt\n")
    (root / "scratch").mkdir()
    (root / "scratch" / "big.bin").write_bytes(b"x" * 1000)
    (root / "debug.log").write_text("noise\n")
    (root / "notes.txt").write_text("private\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return root


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLOUDPROF_CACHE": str(tmp_path / "cache"),
           "COLUMNS": "1000"}
    env.update(extra)
    return env


def _sweep(tmp_path: Path, *args: str,
           env: dict[str, str | None] | None = None) -> Called:
    """``cloudprof sweep`` in this process (see tests/fixtures/in_process.py), with ``env``
    added to the environment (a None value takes a variable out)."""
    argv = ["sweep", "--repeats", "1", *args, "--out", str(tmp_path / "runs")]
    return cloudprof(*argv, cwd=tmp_path, columns=1000,
                     env={"CLOUDPROF_CACHE": str(tmp_path / "cache"), **(env or {})})


def _ssh_env(workdir: Path) -> dict[str, str | None]:
    """A user's SSH host: its workdir, and none of the tests' loopback redirections."""
    return {"CLOUDPROF_SSH_WORKDIR": str(workdir), "CLOUDPROF_SSH_ENDPOINT": None,
            "CLOUDPROF_SSH_KEY": None, "CLOUDPROF_SSH_HOST_KEY": None}


def _one_error(result: Called) -> str:
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return errors[0]


def _runner(tmp_path: Path, *args: str, command: list[str],
            timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "trial"
    proc = subprocess.run([sys.executable, "-m", "workloads.run", "--out", str(out),
                           "--command", "--job", *args, "--", *command],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=timeout)
    return proc, json.loads((out / protocol.SUMMARY_FILE).read_text())


# ------------------------------------------------------------------ packing


def test_packing_honours_gitignore_and_cloudprofignore_and_is_named_by_its_content(
        user_project, tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDPROF_CACHE", str(tmp_path / "cache"))
    shipped = [rel for rel, _, _ in jobs.list_files(user_project)]
    assert shipped == [".cloudprofignore", ".gitignore", "data/rows.csv", "requirements.txt",
                       "userjob.py"]
    first = jobs.pack_workdir(user_project)
    import tarfile

    with tarfile.open(first.path) as tar:
        assert sorted(tar.getnames()) == shipped
    assert jobs.pack_workdir(user_project).hash == first.hash  # same content, same name
    (user_project / "debug.log").write_text("ignored, so no new hash\n")
    assert jobs.pack_workdir(user_project).hash == first.hash
    (user_project / "data" / "rows.csv").write_text("a b\n")
    assert jobs.pack_workdir(user_project).hash != first.hash


def test_a_workdir_above_the_limit_is_refused_naming_its_largest_files_and_leaves_nothing(
        user_project, tmp_path):
    (user_project / "data" / "huge.parquet").write_bytes(b"\0" * 300_000)
    result = _sweep(tmp_path, "--machine", "n2-highcpu-2", "--dry-run", "--workdir",
                    str(user_project), "--command", "python userjob.py {workers}",
                    env={"CLOUDPROF_MAX_WORKDIR": "100K"})
    assert result.returncode == 2
    line = _one_error(result)
    assert "above the 100 KiB limit" in line and "data/huge.parquet (293 KiB)" in line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("args, message", [
    (["--command", "python userjob.py {wrkers}"], "unknown placeholder {wrkers}"),
    (["--command", "python userjob.py {rows}", "--grid", "cols=1,2"],
     "unknown placeholder {rows}"),
    (["--command", "python 'userjob.py"], "cannot split"),
    (["--setup", "true"], "--setup runs in the job's copy: give --workdir too"),
    (["--command", "true", "--grid", "workers=1,2"], "built-in placeholder"),
])
def test_bad_job_options_are_one_line_before_anything_starts(tmp_path, args, message):
    result = _sweep(tmp_path, "--machine", "n2-highcpu-2", "--dry-run", *args)
    assert result.returncode == 2
    assert message in _one_error(result)
    assert not (tmp_path / "runs").exists()


def test_placeholders_are_filled_per_word_without_a_shell_and_quoted_with_one():
    from workloads.job import expand

    values = {"workers": "4", "trial": "a b", "repeat": "0"}
    assert expand(["echo", "{trial}", "w={workers}"], values, shell=False) == \
        ["echo", "a b", "w=4"]
    assert expand(["echo {trial} > out-{{x}}"], values, shell=True) == \
        ["sh", "-c", "echo 'a b' > out-{x}"]


# ------------------------------------------------------------------ the runner and the protocol


def test_a_job_reports_units_phases_and_its_output_is_kept(user_project, tmp_path):
    def setup() -> str:
        done = subprocess.run([sys.executable, "-m", "workloads.job", "setup",
                               str(user_project), SETUP], env=_env(tmp_path),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert setup() == "ran" and setup() == "reused"  # pip ran once, into the copy's site dir
    assert list((user_project / ".cloudprof-site").glob("tabulate*"))
    proc, s = _runner(tmp_path, "--workers", "2", "--var", "trial=t1", "--chdir",
                      str(user_project), command=["python", "userjob.py", "{workers}"])
    assert proc.returncode == 0, proc.stderr
    assert s["schema"] == protocol.SCHEMA and s["status"] == "ok"
    assert s["unit"] == "row" and s["units"] == 4 * 5 * 2 and s["job_kind"] == "throughput"
    assert s["units_per_s"] == pytest.approx(s["units"] / s["seconds"])
    assert [p["name"] for p in s["phases"]] == ["load", "fit"]
    load, fit = s["phases"]
    assert load["peak_rss_bytes"] > fit["peak_rss_bytes"] + 30e6  # the 40 MB lived in load
    # the phases share the headline's basis (what the tree holds): none above it, and the
    # phase that holds the peak within 10 % of it
    assert 0.9 * s["peak_rss_bytes"] <= load["peak_rss_bytes"] <= s["peak_rss_bytes"]
    assert fit["wall_s"] >= 0.35 and load["wall_s"] > 0
    log = (tmp_path / "trial" / "output.log").read_text()
    assert "t1" in log and "cloudprof:" not in log  # protocol lines are read, not logged


def test_a_job_without_units_is_one_complete_run(tmp_path):
    proc, s = _runner(tmp_path, command=["python", "-c", "import time; time.sleep(0.5)"])
    assert proc.returncode == 0 and s["status"] == "ok"
    assert s["job_kind"] == "fixed_work" and s["units"] == 0 and s["seconds"] >= 0.5
    assert s["command"]["stopped_by"] is None


def test_a_unit_line_that_is_not_a_number_fails_the_trial_with_one_line(tmp_path):
    proc, s = _runner(tmp_path, command=["sh", "-c",
                                         "echo 'cloudprof:units lots'; sleep 30"])
    assert proc.returncode == protocol.EXIT_FAILED
    assert s["status"] == "failed" and "'cloudprof:units lots'" in s["error"]
    assert "non-negative number" in s["error"] and s["seconds"] < 20  # stopped, not waited
    assert _one_error(proc) == f"error: {s['error']}"


def test_a_command_that_does_not_exist_is_one_line(tmp_path):
    proc, s = _runner(tmp_path, command=["no-such-command-xyz", "{workers}"])
    assert proc.returncode == protocol.EXIT_USAGE
    assert "cannot start 'no-such-command-xyz'" in _one_error(proc)
    assert s["status"] == "failed"


def test_a_command_exiting_non_zero_mid_trial_fails_it_and_keeps_what_it_did(tmp_path):
    proc, s = _runner(tmp_path, command=["sh", "-c",
                                         "echo 'cloudprof:units 3'; echo oops >&2; exit 7"])
    assert proc.returncode == protocol.EXIT_FAILED
    assert s["status"] == "failed" and "command exited with code 7" in s["error"]
    assert s["units"] == 3
    assert "oops" in (tmp_path / "trial" / "output.log").read_text()


def test_duration_stops_an_endless_job_that_ignores_sigterm(tmp_path):
    proc, s = _runner(tmp_path, "--duration", "1", command=[
        "sh", "-c", "trap '' TERM; while true; do echo 'cloudprof:units 1'; sleep 0.1; done"],
        timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert s["status"] == "ok" and s["command"]["stopped_by"] == "duration"
    assert 1 <= s["seconds"] < 1 + 3.0 + 2  # SIGTERM ignored: SIGKILL after the grace
    assert s["units"] >= 5


# ------------------------------------------------------------------ sweeps on the stand-ins


def _trials(run: Path):
    import pandas as pd

    return pd.read_parquet(run / "trials.parquet")


def _check_job_run(run: Path, n_trials: int) -> None:
    trials = _trials(run)
    assert len(trials) == n_trials and set(trials["status"]) == {"ok"}, trials["error"].tolist()
    assert set(trials["unit"]) == {"row"} and set(trials["job_kind"]) == {"throughput"}
    for _, row in trials.iterrows():
        assert row["units"] == 4 * 5 * row["workers"]
        assert row["units_per_s"] > 0 and row["peak_rss_bytes"] > 40e6
        assert [p["name"] for p in json.loads(row["phases"])] == ["load", "fit"]
        log = (run / "logs" / f"{row['trial_id']}.log").read_text()
        assert row["trial_id"] in log  # tabulate ran: the dependency arrived
        # each trial's summary.json is kept, from a cloud VM as from this machine
        kept = json.loads((run / "summaries" / f"{row['trial_id']}.json").read_text())
        assert kept["peak_rss_bytes"] == row["peak_rss_bytes"] and kept["phases"]


@pytest.mark.slow
def test_a_user_project_sweeps_on_local_with_setup_once_per_host_and_a_grid(
        user_project, tmp_path):
    result = _sweep(tmp_path, "--machine", "n2-highcpu-2", "--machine", "c6i.large",
                    "--provider", "local", "--dry-run", "--workers", "1,2",
                    "--workdir", str(user_project), "--setup", SETUP,
                    "--command", "python userjob.py {workers} {size}", "--grid", "size=s,m")
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-3000:]
    (run,) = list((tmp_path / "runs").iterdir())
    _check_job_run(run, 2 * 2 * 2)
    trials = _trials(run)
    assert sorted(set(trials["grid"])) == ['{"size": "m"}', '{"size": "s"}']
    sweep = json.loads((run / "sweep.json").read_text())
    # both dry-run machines are this host: the second finds the first's setup in its cache
    assert sorted(vm["setup"] for vm in sweep["vms"].values()) == ["ran", "reused"]
    for name, vm in sweep["vms"].items():
        assert SETUP in (run / "setup" / f"{name}.log").read_text()  # its output is kept
        copy = Path(vm["job"]["dir"])
        assert list((copy / ".cloudprof-site").glob("tabulate*"))  # and it installed there
        assert (copy / "data" / "rows.csv").is_file() and not (copy / "notes.txt").exists()
    report = (run / "report.md").read_text()
    assert "size=m" in report and "Phases" in report and "Grid: size" in report


def test_a_workload_class_is_imported_from_the_workdir(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "mywork.py").write_text(textwrap.dedent('''\
        import time
        from workloads.base import Workload

        class Sleepy(Workload):
            unit = "nap"

            def prepare(self):
                pass

            def run(self, workers, stop, counter):
                while not stop.is_set():
                    time.sleep(0.01)
                    counter.add(workers)
    '''))
    result = _sweep(tmp_path, "--machine", "n2-highcpu-2", "--dry-run", "--workers", "1",
                    "--duration", "1", "--workdir", str(root), "--workload", "mywork:Sleepy")
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    (run,) = list((tmp_path / "runs").iterdir())
    trials = _trials(run)
    assert list(trials["unit"]) == ["nap"] and trials["units"].iloc[0] > 10


def test_a_failing_setup_fails_its_machine_with_the_commands_last_lines(user_project,
                                                                         tmp_path):
    result = _sweep(tmp_path, "--machine", "n2-highcpu-2", "--dry-run", "--workers", "1",
                    "--workdir", str(user_project),
                    "--setup", "echo resolving; echo 'No matching distribution' >&2; exit 3",
                    "--command", "python userjob.py {workers}")
    assert result.returncode == 6
    line = _one_error(result)
    assert "--setup failed" in line and "No matching distribution" in line
    (run,) = list((tmp_path / "runs").iterdir())
    sweep = json.loads((run / "sweep.json").read_text())
    assert sweep["machines"]["n2-highcpu-2"]["status"] == "failed"
    assert not (run / "trials.parquet").exists() or _trials(run).empty
    assert not (run / ".incoming").exists()


@pytest.mark.slow
def test_a_user_project_on_an_ssh_host_reuses_its_setup_when_nothing_changed(
        sshd, user_project, tmp_path, tmp_path_factory):
    from tests.fixtures.workloads_env import seed_workloads_env
    from tests.test_ssh_provider import _loopback_hosts

    hosts = _loopback_hosts(tmp_path, sshd, python=sys.executable)
    seed_workloads_env(tmp_path / "host-workdir", tmp_path_factory)  # the job's setup is tested
    env = _ssh_env(tmp_path / "host-workdir")
    args = ["--provider", "ssh", "--hosts", str(hosts), "--machine", "box", "--workers", "1,2",
            "--workdir", str(user_project), "--setup", SETUP,
            "--command", "python userjob.py {workers}"]
    states = []
    for _ in range(2):
        result = _sweep(tmp_path, *args, env=env)
        assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
        run = max((tmp_path / "runs").iterdir())
        _check_job_run(run, 2)
        (vm,) = json.loads((run / "sweep.json").read_text())["vms"].values()
        states.append((vm["job"]["copy"], vm["setup"]))
    assert states == [("unpacked", "ran"), ("reused", "reused")]


@pytest.mark.slow
@pytest.mark.parametrize("cloud_sweep", ["aws", "gcp"], indirect=True)
def test_a_user_project_sweeps_on_a_cloud_through_its_bucket(cloud_sweep, user_project):
    sweep = cloud_sweep
    argv = ["sweep", "--repeats", "1", "--provider", sweep.provider,
            "--machine", sweeps.MACHINE[sweep.provider], "--workers", "1,2",
            "--bucket", sweep.bucket, "--out", str(sweep.out),
            "--workdir", str(user_project), "--setup", SETUP,
            "--command", "python userjob.py {workers}"]
    if sweep.provider == "gcp":
        argv += ["--project", "proj", "--zone", "us-central1-a"]
    sweep.env["CLOUDPROF_CACHE"] = str(sweep.tmp / "cache")
    # The "VM"'s workdir is shared by the session (one venv): the other cloud's test may
    # have set this very job up there already, as a reused SSH host would have.
    done_before = list(sweep.workdir.glob("jobs/*/.cloudprof-setup-*.ok"))
    # in this process, in the environment the fixture made for a sweep's own
    env: dict[str, str | None] = {k: v for k, v in sweep.env.items() if os.environ.get(k) != v}
    env.update((k, None) for k in os.environ if k not in sweep.env)
    result = cloudprof(*argv, cwd=sweep.tmp, env=env, columns=1000)
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    run = sweep.run_dir()
    _check_job_run(run, 2)
    (vm,) = json.loads((run / "sweep.json").read_text())["vms"].values()
    assert vm["setup"] == ("reused" if done_before else "ran")
    assert list(sweep.workdir.glob("jobs/*/.cloudprof-site/tabulate*"))
    assert sweep.live() == []  # the VM and what was made for it are gone
    # the archive's signed URL lives as long as the sweep's VMs may, not a fixed 6 h
    from urllib.parse import parse_qs, urlsplit

    from orchestrator.engine.sweep import EXPIRY_MARGIN_S

    (planned,) = json.loads((run / "sweep.json").read_text())["plan"]["vms"]
    expected = int(planned["estimate"]["total_s"] * 1.5 + EXPIRY_MARGIN_S)
    (entry,) = json.loads((sweep.workdir / "manifests" / f"job-{vm['job']['hash']}.json")
                          .read_text())
    field = "X-Amz-Expires" if sweep.provider == "aws" else "X-Goog-Expires"
    assert int(parse_qs(urlsplit(entry["url"]).query)[field][0]) == expected < 6 * 3600


@pytest.mark.slow
def test_an_ssh_host_keeps_no_signed_url_manifest_after_the_sweep(
        sshd, moto_env, user_project, tmp_path, tmp_path_factory):
    """The job, the inputs and the results go through the bucket by signed URLs in
    manifests on the host; a host that outlives the sweep keeps none of them."""
    import boto3

    from tests.fixtures.workloads_env import seed_workloads_env
    from tests.test_ssh_provider import _loopback_hosts

    boto3.client("s3").create_bucket(Bucket="cp-manifests")
    hosts = _loopback_hosts(tmp_path, sshd, python=sys.executable)
    workdir = tmp_path / "host-workdir"
    seed_workloads_env(workdir, tmp_path_factory)
    env = _ssh_env(workdir)
    result = _sweep(tmp_path, "--provider", "ssh", "--hosts", str(hosts), "--machine", "box",
                    "--workers", "1", "--bucket", "s3://cp-manifests",
                    "--workdir", str(user_project), "--setup", SETUP,
                    "--command", "python userjob.py {workers}", env=env)
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    _check_job_run(max((tmp_path / "runs").iterdir()), 1)
    keys = boto3.client("s3").list_objects_v2(Bucket="cp-manifests").get("Contents", [])
    assert any(k["Key"].endswith("workdir.tar.gz") for k in keys), keys  # fetched by signed URL
    assert (workdir / "manifests").is_dir()  # where they were written
    assert list((workdir / "manifests").iterdir()) == []


def test_a_grid_multiplies_the_trials_and_reaches_a_workload_as_parameters():
    from orchestrator.catalog.machines import lookup
    from orchestrator.plan.planner import make_plan
    from orchestrator.spec.spec import SweepSpec

    spec = SweepSpec(machines=["n2-highcpu-2"], workers=[1, 2], repeats=2, workload="mine:Job",
                     grid={"rows": ["10", "20"], "mode": ["a", "b", "c"]}, dry_run=True)
    (vm,) = make_plan(spec, "s1", [lookup("n2-highcpu-2")]).vms
    assert len(vm.trials) == 2 * 3 * 2 * 2
    assert len({t.trial_id for t in vm.trials}) == len(vm.trials)
    trial = next(t for t in vm.trials if t.grid == {"rows": "20", "mode": "b"} and t.workers == 2)
    assert trial.trial_id == "n2-highcpu-2-rows20-modeb-w2-r0"
    assert trial.request.params == {"mode": "b", "rows": "20"}
    args = trial.request.argv()
    assert args[args.index("rows=20") - 1:args.index("rows=20") + 1] == ["--param", "rows=20"]
    assert "mode=b" in args and "--command" not in args


def test_a_sweep_records_each_bad_job_as_a_failed_trial_with_one_line_and_leaves_no_process(
        tmp_path):
    root = tmp_path / "bad"
    root.mkdir()
    (root / "bad.py").write_text(textwrap.dedent('''\
        import sys
        import time

        print("cloudprof:units 2", flush=True)
        if sys.argv[1] == "unit":
            print("cloudprof:units many", flush=True)
            time.sleep(60)  # the runner stops it at once
        print("giving up", file=sys.stderr, flush=True)
        sys.exit(5)
    '''))
    result = _sweep(tmp_path, "--machine", "n2-highcpu-2", "--dry-run", "--workers", "1",
                    "--workdir", str(root), "--command", "python bad.py {case}",
                    "--grid", "case=unit,exit")
    assert result.returncode == 6
    assert "sweep finished with failures (2 trial(s) not ok)" in _one_error(result)
    (run,) = list((tmp_path / "runs").iterdir())
    errors = dict(zip(_trials(run)["grid"], _trials(run)["error"], strict=True))
    assert "'cloudprof:units many'" in errors['{"case": "unit"}']
    assert errors['{"case": "exit"}'].startswith("command exited with code 5 after")
    assert all("\n" not in e for e in errors.values())
    assert "giving up" in (run / "logs" / "n2-highcpu-2-caseexit-w1-r0.log").read_text()
    assert not sweeps.processes_with(str(run))
