"""`cloudprof export`: specs built from what a sweep measured, checked against the systems'
own schemas and against the store they came from.

One real dry-run sweep of a small command job gives the store most tests read; stores
written through the store layout (``tests.test_report.write_store``) give the odd cases
(a leak, a chosen machine).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator import cli
from orchestrator.results import export, report
from orchestrator.results.report.memory import memory_rows
from tests.test_report import write_store

MIB = 2**20
REPO = Path(__file__).resolve().parents[1]

# Holds 24 MiB per worker and reports `workers` units per tick: more workers, more units/s,
# so the best count is the largest and its peak the highest.
JOB = """
import sys, time
workers = int(sys.argv[1])
hold = bytearray(24 * workers << 20)
for i in range(0, len(hold), 4096):
    hold[i] = 1
print("cloudprof:unit tick", flush=True)
for _ in range(15):
    print(f"cloudprof:units {workers}", flush=True)
    time.sleep(0.05)
"""


def _cloudprof(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLOUDPROF_CACHE": str(cwd / "cache"),
           "COLUMNS": "1000"}
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real dry-run sweep of JOB at 1 and 2 workers, two repeats each."""
    root = tmp_path_factory.mktemp("export")
    (root / "job").mkdir()
    (root / "job" / "hold.py").write_text(JOB)
    done = _cloudprof("sweep", "--machine", "n2-highcpu-2", "--dry-run", "--workers", "1,2",
                      "--repeats", "2", "--workdir", str(root / "job"),
                      "--command", "python hold.py {workers}", "--out", str(root / "runs"),
                      cwd=root)
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    (run,) = list((root / "runs").iterdir())
    return run


def _export(run: Path, *args: str) -> str:
    result = _cloudprof("export", str(run), *args, cwd=run.parent.parent)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _best_row(run: Path) -> dict:
    """The best worker count's memory row, by the store's own units/s."""
    trials = report.load_run(run).trials
    trials = trials[trials["status"] == "ok"]
    rates: dict[int, list[float]] = {}
    for r in trials.to_dict("records"):
        rates.setdefault(int(r["workers"]), []).append(float(r["units_per_s"]))
    best = max(rates, key=lambda w: sorted(rates[w])[len(rates[w]) // 2])
    (row,) = [r for r in memory_rows(trials) if r["workers"] == best]
    return row


def test_the_k8s_job_is_valid_and_asks_for_what_the_trials_measured(swept: Path) -> None:
    import kubernetes_validate

    text = _export(swept, "--format", "k8s")
    manifest = yaml.safe_load(text)
    kubernetes_validate.validate(manifest, "1.30.0", strict=True)  # raises on a bad manifest
    row = _best_row(swept)
    assert row["workers"] == 2  # JOB's throughput grows with its workers
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    resources = container["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"] == "2"
    memory = resources["requests"]["memory"]
    assert memory.endswith("Mi") and memory == resources["limits"]["memory"]
    asked = int(memory.removesuffix("Mi")) * MIB
    assert asked >= row["peak_rss_bytes"] and asked == row["request_bytes"]
    assert row["peak_rss_bytes"] > 2 * 24 * MIB  # the peak is the job's own, measured
    assert container["command"] == ["python", "hold.py", "2"]
    assert container["image"] == export.PLACEHOLDER_IMAGE
    trials = report.load_run(swept).trials
    ids = sorted(trials.loc[(trials["status"] == "ok") & (trials["workers"] == 2), "trial_id"])
    notes = manifest["metadata"]["annotations"]
    assert notes["cloudprof.dev/trials"].split(",") == ids and len(ids) == 2
    assert notes["cloudprof.dev/run"] == swept.name
    assert ", ".join(ids) in text.splitlines()[1]  # the comment says it too


def test_ray_options_and_the_dask_line_carry_the_same_figures(swept: Path) -> None:
    row = _best_row(swept)
    doc = json.loads(_export(swept, "--format", "ray"))
    assert doc["options"] == {"num_cpus": 2, "memory": row["request_bytes"]}
    assert doc["source"]["run"] == swept.name and len(doc["source"]["trials"]) == 2
    assert doc["source"]["peak_rss_bytes"] >= row["peak_rss_bytes"]
    comment, line = _export(swept, "--format", "dask").strip().splitlines()
    argv = shlex.split(line)
    assert argv[:2] == ["dask", "worker"]
    assert argv[argv.index("--nthreads") + 1] == "2"
    limit = int(argv[argv.index("--memory-limit") + 1])
    assert limit == row["request_bytes"] >= row["peak_rss_bytes"]
    assert all(t in comment for t in doc["source"]["trials"])


def test_a_chosen_count_is_exported_and_a_missing_one_is_one_line(swept: Path) -> None:
    doc = json.loads(_export(swept, "--format", "ray", "--workers", "1"))
    (row,) = [r for r in memory_rows(report.load_run(swept).trials) if r["workers"] == 1]
    assert doc["options"] == {"num_cpus": 1, "memory": row["request_bytes"]}
    bad = _cloudprof("export", str(swept), "--format", "ray", "--workers", "8",
                     cwd=swept.parent.parent)
    assert bad.returncode != 0 and bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1 and "measured 1, 2" in bad.stderr


def _two_machines(run_dir: Path, leak_on: str | None = None) -> Path:
    trials = []
    for machine, rate, peak in (("n2-highcpu-8", 100.0, 900 * MIB),
                                ("c3-highcpu-8", 150.0, 700 * MIB)):
        for repeat in range(2):
            trials.append({"machine": machine, "workers": 4, "repeat": repeat,
                           "units_per_s": rate + repeat, "peak_rss_bytes": peak + repeat * MIB,
                           "leak_verdict": "leak" if machine == leak_on else "ok",
                           "leak_slope_mb_per_s": 3.5 if machine == leak_on else None})
    sweep = {"sweep_id": run_dir.name,
             "spec": {"command": "python train.py --jobs {workers} && echo done",
                      "shell": True, "workdir": "job"}}
    return write_store(run_dir, trials, sweep=sweep, timeseries=False)


def test_the_best_machine_is_the_default_and_another_can_be_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import kubernetes_validate

    run = _two_machines(tmp_path / "two")
    assert cli.main(["export", str(run), "--format", "k8s"]) == 0
    manifest = yaml.safe_load(capsys.readouterr().out)
    kubernetes_validate.validate(manifest, "1.30.0", strict=True)
    assert manifest["metadata"]["annotations"]["cloudprof.dev/machine"] == "c3-highcpu-8"
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["sh", "-c", "python train.py --jobs 4 && echo done"]
    assert cli.main(["export", str(run), "--format", "ray", "--machine", "n2-highcpu-8"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"]["machine"] == "n2-highcpu-8"
    assert doc["options"]["memory"] >= 901 * MIB


def test_a_leaking_configuration_gets_no_memory_limit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _two_machines(tmp_path / "leaky", leak_on="c3-highcpu-8")
    assert cli.main(["export", str(run), "--format", "k8s"]) != 0
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert "leaks" in captured.err and "3.5 MB/s" in captured.err
    # the machine that does not leak still exports
    assert cli.main(["export", str(run), "--format", "dask", "--machine", "n2-highcpu-8"]) == 0


def test_memory_quantities_never_round_down() -> None:
    assert export.quantity(512 * MIB) == "512Mi"
    assert export.quantity(512 * MIB + 1) == str(512 * MIB + 1)
