"""The cloudprof command line: commands, one-line errors and exit codes, and a fast --help."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from orchestrator import cli
from orchestrator.errors import (
    EXIT_BUDGET,
    EXIT_CREDENTIALS,
    EXIT_INTERRUPTED,
    EXIT_MEMORY_GATE,
    EXIT_USAGE,
    BucketError,
    CloudprofError,
    MemoryGateError,
)
from tests.fixtures.in_process import cloudprof as in_process

REPO = Path(__file__).resolve().parent.parent
HEAVY = {
    "boto3",
    "botocore",
    "google",
    "pandas",
    "numpy",
    "matplotlib",
    "paramiko",
    "pyarrow",
    "moto",
}


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def cloudprof(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it: the one installed beside this
    Python (in its venv), whatever $PATH holds — `make test` does not activate the venv."""
    script = Path(sys.executable).parent / "cloudprof"
    assert script.is_file(), f"cloudprof is not installed for {sys.executable}: pip install -e ."
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
    )


def imported_modules(*args: str) -> tuple[set[str], str]:
    """Top-level modules imported by ``python -m orchestrator.cli ARGS`` (from -X importtime)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "100", "HOME": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "orchestrator.errors" in names and "typer" in names  # the parse found real lines
    return names, proc.stdout


# ---------------------------------------------------------------- fast start


@pytest.mark.parametrize(
    "args",
    [["--help"], ["sweep", "--help"], ["catalog", "--help"], ["catalog", "--provider", "gcp"],
     ["catalog", "refresh", "--help"]],
)
def test_help_and_catalog_import_no_heavy_library(args: list[str]) -> None:
    names, out = imported_modules(*args)
    heavy = {n for n in names if n.split(".")[0] in HEAVY}
    assert not heavy, f"cloudprof {' '.join(args)} imported {sorted(heavy)}"
    assert not {"orchestrator.engine.sweep", "orchestrator.results.report"} & names
    assert ("Usage: cloudprof" in out) if "--help" in args else ("n2-highcpu-80" in out)


def test_python_dash_m_orchestrator_runs_the_cli() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "cloudprof 0.1.0"


# ---------------------------------------------------------------- errors through the real script


@pytest.mark.parametrize(
    ("args", "expected", "via_script"),
    [
        (["sweep", "-m", "n2-highcpu-81"], "did you mean n2-highcpu-80", True),
        (["sweep", "-m", "n2-highcpu-80", "--workers", "1,0"], "must be 1 or more, got 0", True),
        (["sweep", "-m", "n2;rm -rf ~"], "invalid machine type 'n2;rm -rf ~'", True),
        (["sweep", "--machin", "x"], "No such option: --machin", True),
        (["sweep", "-m", "n2-highcpu-80", "--workers", "-4"], "must be 1 or more, got -4", False),
        (["sweep", "-m", "c6i.large", "--max-peak-memory", "lots"], "expected a size", False),
        (["sweep", "-m", "c6i.large", "--repeats", "x"], "Invalid value for '--repeats'", False),
        (["sweep", "-m", "c6i.large", "--bucket", "s3://a b"], "invalid bucket name", False),
        (["catalog", "--sort", "cost"], "'cost' is not one of 'name', 'vcpus', 'memory'", False),
        (["compare", "only-one-run"], "compare needs at least two runs", False),
        (["report"], "Missing argument", False),
    ],
)
def test_bad_input_is_one_line_without_traceback(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    expected: str,
    via_script: bool,
) -> None:
    """A few through the installed console script, the rest through ``main`` in-process."""
    out = tmp_path / "runs"
    argv = [*args, "--out", str(out)] if args[0] == "sweep" else args
    if via_script:
        proc = cloudprof(*argv)
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    else:
        code, stdout, stderr = run_main(argv, capsys)
    assert code == (BucketError.exit_code if "bucket" in expected else EXIT_USAGE), stderr
    assert not out.exists()  # a refused sweep leaves nothing behind
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert expected in lines[0]
    assert "Traceback" not in stderr + stdout


def test_max_cost_refuses_to_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "runs"
    argv = ["sweep", "-m", "m1-ultramem-160", "--dry-run", "--max-cost", "0.01", "--repeats", "1",
            "--out", str(out)]
    code, _, err = run_main(argv, capsys)
    assert code == EXIT_BUDGET
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: estimated cost $")
    assert "above --max-cost $0.01" in lines[0]
    assert not out.exists()


def test_a_plan_above_a_sane_cost_asks_for_max_cost_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real (not dry) sweep estimated above UNASKED_COST_USD stops before credentials are
    even looked for; --plan still shows it, and --max-cost above it lets it go on (to the
    credentials check, which this empty HOME fails)."""
    from orchestrator.engine.sweep import UNASKED_COST_USD

    monkeypatch.setenv("HOME", str(tmp_path))
    for key in [k for k in os.environ if k.startswith(("GOOGLE_", "CLOUDSDK_", "GCE_"))]:
        monkeypatch.delenv(key)
    out = tmp_path / "runs"
    argv = ["sweep", "-m", "m1-ultramem-160", "--workers", "1-160", "--duration", "1h",
            "--repeats", "5", "--project", "p", "--zone", "us-central1-a", "--out", str(out)]
    code, _, err = run_main(argv, capsys)
    assert code == EXIT_BUDGET, err
    (line,) = err.splitlines()
    estimate = float(line.split("estimated cost $", 1)[1].split(" ", 1)[0].replace(",", ""))
    assert estimate > UNASKED_COST_USD and "give --max-cost" in line, line
    assert not out.exists()
    code, printed, err = run_main([*argv, "--plan"], capsys)
    assert code == 0 and "estimated cost $" in printed, err
    code, _, err = run_main([*argv, "--max-cost", str(int(estimate) + 1)], capsys)
    assert code != EXIT_BUDGET and "--max-cost" not in err, err
    assert not out.exists()


@pytest.mark.slow
def test_config_errors_and_unwritable_out_through_the_real_script(tmp_path: Path) -> None:
    bad = tmp_path / "sweep.toml"
    bad.write_text('machines = ["n2-highcpu-80"]\nworkers = 1,2\n')
    proc = cloudprof("sweep", "--config", str(bad))
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr.count("\n") == 1 and "invalid TOML" in proc.stderr
    assert "line 2" in proc.stderr

    bad.write_text('machines = ["n2-highcpu-80"]\nrepeat = 2\n')
    proc = cloudprof("sweep", "--config", str(bad))
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr == f"error: {bad}: unknown key 'repeat'; did you mean 'repeats'?\n"

    a_file = tmp_path / "plain-file"
    a_file.write_text("")
    proc = cloudprof("sweep", "-m", "n2-highcpu-80", "--dry-run", "--out", str(a_file / "runs"))
    assert proc.returncode == EXIT_USAGE
    assert (
        proc.stderr.startswith("error: --out: output directory") and "Traceback" not in proc.stderr
    )

    proc = cloudprof("report", str(tmp_path / "no-such-run"))
    assert proc.returncode == EXIT_USAGE and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: ")


# ---------------------------------------------------------------- catalog command


def catalog_csv(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, str]]:
    code, out, err = run_main(["catalog", "--format", "csv", *args], capsys)
    assert code == 0, err
    return list(csv.DictReader(io.StringIO(out)))


def test_catalog_filters_and_sorts(capsys: pytest.CaptureFixture[str]) -> None:
    rows = catalog_csv(capsys, "--provider", "gcp", "--family", "n2-highcpu", "--min-vcpus", "32",
                       "--region", "us-central1", "--sort", "vcpus")  # fmt: skip
    assert [r["instance_type"] for r in rows] == [
        "n2-highcpu-32", "n2-highcpu-48", "n2-highcpu-64", "n2-highcpu-80", "n2-highcpu-96",
    ]  # fmt: skip
    assert all(r["price_source"] and r["price_date"] for r in rows)

    rows = catalog_csv(capsys, "--provider", "aws", "--max-vcpus", "4", "--sort", "price")
    prices = [float(r["price_on_demand"]) for r in rows]
    assert rows and prices == sorted(prices)
    assert {r["provider"] for r in rows} == {"aws"} and max(int(r["vcpus"]) for r in rows) <= 4

    rows = catalog_csv(capsys, "--max-price", "0.05", "--spot", "--sort", "price")
    spot = [float(r["price_spot"]) for r in rows]
    assert rows and spot == sorted(spot) and max(spot) <= 0.05
    assert any(float(r["price_on_demand"]) > 0.05 for r in rows)  # on-demand is not the filter

    rows = catalog_csv(capsys, "--sort", "memory", "--family", "m1")
    assert [r["instance_type"] for r in rows][-1] == "m1-ultramem-160"


@pytest.mark.parametrize("columns", ["80", "200"])
def test_catalog_table(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                       columns: str) -> None:
    monkeypatch.setenv("COLUMNS", columns)  # machine names whole on a narrow terminal too
    code, out, _ = run_main(["catalog", "--family", "c2", "--region", "us-central1"], capsys)
    assert code == 0
    assert "c2-standard-60" in out and "c2-standard-4" in out and "n2-" not in out
    from orchestrator.catalog.machines import lookup

    shipped = lookup("c2-standard-4", region="us-central1")  # its source and date, as columns
    assert "[1]" in out and shipped.source_name in out and f"price date {shipped.price_date}" in out
    code, _, err = run_main(["catalog", "--min-vcpus", "500"], capsys)
    assert code == 0 and "no machine type matches" in err


def test_a_broken_catalog_file_is_one_line_naming_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.catalog.machines import CATALOG_ENV, catalog_dir

    for name in ("gcp.csv", "aws.csv"):
        (tmp_path / name).write_text((catalog_dir() / name).read_text())
    gcp = tmp_path / "gcp.csv"
    lines = gcp.read_text().splitlines()
    cells = lines[4].split(",")
    cells[7] = "free"  # price_on_demand
    lines[4] = ",".join(cells)
    gcp.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv(CATALOG_ENV, str(tmp_path))
    code, out, err = run_main(["catalog"], capsys)
    assert code == 1 and out == ""
    assert err == f"error: {gcp}:5: price_on_demand must be a number, got 'free'\n"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--provider", "ssh"], "'ssh' is not one of 'gcp', 'aws'"),
        (["--family", "n2-highcpo"], "'n2-highcpo' is not in the catalog; did you mean n2-highcpu"),
        (["--region", "us-central"], "did you mean us-central1"),
        (["--min-vcpus", "8", "--max-vcpus", "4"], "--min-vcpus 8 is above --max-vcpus 4"),
        (["--min-vcpus", "0"], "--min-vcpus: must be 1 or more"),
        (["--max-price", "-1"], "--max-price: must be positive"),
        (["--format", "xml"], "'xml' is not one of 'table', 'csv'"),
        (["--format", "csv", "--json"], "--json and --format csv are two outputs"),
    ],
)
def test_catalog_errors(capsys: pytest.CaptureFixture[str], args: list[str], expected: str) -> None:
    code, out, err = run_main(["catalog", *args], capsys)
    assert code == EXIT_USAGE and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and expected in err


# ---------------------------------------------------------------- wiring to the other parts


@pytest.fixture
def fake_module(monkeypatch: pytest.MonkeyPatch):
    """Install a stand-in for one of cloudprof's own lazily imported modules.

    This checks the CLI's wiring (arguments passed, errors mapped to exit codes),
    not the engine behind it, which has its own tests.
    """

    def install(name: str, **attrs: Any) -> None:
        module = types.ModuleType(name)
        for key, value in attrs.items():
            setattr(module, key, value)
        monkeypatch.setitem(sys.modules, name, module)

    return install


def test_cleanup_passes_its_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_module: Any
) -> None:
    calls: list[tuple[Any, ...]] = []
    fake_module(
        "orchestrator.engine.cleanup",
        cleanup=lambda provider, older_than_s, sweep_id, yes, console, **_: (
            calls.append((provider, older_than_s, sweep_id, yes)) or 0
        ),
    )
    run = tmp_path / "runs" / "some-dir"
    run.mkdir(parents=True)
    (run / "sweep.json").write_text(json.dumps({"sweep_id": "sw-20260101-abc"}))
    assert run_main(["cleanup"], capsys)[0] == 0
    assert run_main(["cleanup", "--provider", "aws", "--older-than", "2h", "--yes"], capsys)[0] == 0
    assert run_main(["cleanup", "--sweep", str(run)], capsys)[0] == 0
    assert run_main(["cleanup", "--sweep", "sw-x1"], capsys)[0] == 0
    assert calls == [
        (None, None, None, False),
        ("aws", 7200.0, None, True),
        (None, None, "sw-20260101-abc", False),
        (None, None, "sw-x1", False),
    ]
    for args, expected in (
        (["--provider", "local"], "'local' is not one of 'gcp', 'aws'"),
        (["--older-than", "soon"], "--older-than: expected a duration"),
        (["--sweep", "x;reboot"], "invalid sweep id"),
    ):
        code, _, err = run_main(["cleanup", *args], capsys)
        assert code == EXIT_USAGE and err.count("\n") == 1 and expected in err
    assert len(calls) == 4


def test_a_missing_part_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(CloudprofError, match=r"cleanup is not available .*orchestrator\.nope"):
        cli._lazy("orchestrator.nope", "cleanup")


def test_sweep_maps_engine_errors_and_ctrl_c_to_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_module: Any
) -> None:
    seen: list[Any] = []

    def gate(spec: Any, *, resume: Path | None = None, console: Any = None,
             plan_only: bool = False) -> Path:
        seen.append((spec, resume))
        raise MemoryGateError("trial n2-highcpu-80-w2-r0 peaked at 3.1 GiB,\n above 2.0 GiB")

    fake_module("orchestrator.engine.sweep", run_sweep=gate)
    argv = ["sweep", "-m", "n2-highcpu-80", "--dry-run", "--max-peak-memory", "2G",
            "--out", str(tmp_path)]  # fmt: skip
    code, _, err = run_main(argv, capsys)
    assert code == EXIT_MEMORY_GATE
    assert err == "error: trial n2-highcpu-80-w2-r0 peaked at 3.1 GiB, above 2.0 GiB\n"
    spec, resume = seen[0]
    assert spec.max_peak_memory == 2 * 1024**3 and spec.dry_run and resume is None

    def interrupted(spec: Any, *, resume: Path | None = None, console: Any = None,
                    plan_only: bool = False) -> Path:
        raise KeyboardInterrupt

    fake_module("orchestrator.engine.sweep", run_sweep=interrupted)
    code, _, err = run_main(argv, capsys)
    assert code == EXIT_INTERRUPTED and err == "error: interrupted\n"


def test_resume_uses_the_recorded_spec_and_refuses_stray_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_module: Any
) -> None:
    from orchestrator.spec.spec import SweepSpec

    seen: list[Any] = []
    fake_module(
        "orchestrator.engine.sweep",
        run_sweep=lambda spec, *, resume=None, console=None, plan_only=False: (
            seen.append((spec, resume)) or resume
        ),
    )
    run = tmp_path / "run1"
    run.mkdir()
    recorded = SweepSpec(machines=["c6i.large"], workers=[1, 2], provider="aws", out=tmp_path)
    (run / "sweep.json").write_text(json.dumps({"spec": recorded.to_dict()}))
    code, _, err = run_main(["sweep", "--resume", str(run)], capsys)
    assert code == 0, err
    assert seen == [(recorded, run)]
    code, _, err = run_main(["sweep", "--resume", str(run), "--workers", "4", "-m", "x"], capsys)
    assert code == EXIT_USAGE
    assert err == "error: --resume takes the spec from RUN/sweep.json; drop --machine, --workers\n"
    code, _, err = run_main(["sweep", "--resume", str(tmp_path / "nope")], capsys)
    assert code == EXIT_USAGE and "is not a run directory" in err


def test_version_and_bare_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main(["--version"], capsys)[:2] == (0, "cloudprof 0.1.0\n")
    code, out, _ = run_main([], capsys)  # no command is a usage error, with the help to fix it
    assert code == EXIT_USAGE and "catalog" in out and "cleanup" in out and "runs" in out


# ---------------------------------------------------------------- the real pipeline


@pytest.mark.parametrize(
    ("machine", "expected"),
    [("n2-highcpu-2", "no Google Cloud credentials"), ("c6i.large", "no AWS credentials")],
)
def test_without_credentials_the_error_says_how_and_mentions_dry_run(
    tmp_path: Path, machine: str, expected: str
) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    out = tmp_path / "runs"
    proc = cloudprof("sweep", "-m", machine, "--workers", "1", "--out", str(out), env=env)
    assert proc.returncode == EXIT_CREDENTIALS, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0]
    assert "--dry-run" in lines[0]
    assert not out.exists()  # a refused sweep leaves nothing behind


@pytest.mark.slow
def test_dry_run_sweep_then_report_compare_resume_and_the_memory_gate(tmp_path: Path) -> None:
    import pandas as pd

    tiny = ["--frames", "4", "--rows", "40", "--cols", "50", "--dim", "10", "--duration", "1",
            "--repeats", "1"]
    out = tmp_path / "runs"
    # in this process (what a command says and returns); the console script's report below
    proc = in_process("sweep", "-m", "n2-highcpu-80", "--dry-run", *tiny, "--workers", "1,2",
                      "--out", str(out), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run1,) = out.iterdir()
    trials = pd.read_parquet(run1 / "trials.parquet")
    assert sorted(trials["workers"]) == [1, 2] and set(trials["status"]) == {"ok"}
    assert set(trials["machine"]) == {"n2-highcpu-80"} and (trials["units"] > 0).all()
    sweep = json.loads((run1 / "sweep.json").read_text())
    assert sweep["spec"]["workload_params"] == {"frames": 4, "rows": 40, "cols": 50, "dim": 10}
    assert "dry run" in proc.stdout and (run1 / "report.html").is_file()

    # the memory gate: a limit no trial can stay under fails the sweep with exit 3
    proc = in_process("sweep", "-m", "n2-highcpu-80", "--dry-run", *tiny, "--workers", "1",
                      "--max-peak-memory", "1M", "--out", str(out), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == EXIT_MEMORY_GATE, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("error: memory gate")
        and "Traceback" not in proc.stdout
    )
    (run2,) = set(out.iterdir()) - {run1}
    assert len(pd.read_parquet(run2 / "trials.parquet")) == 1  # recorded before the gate failed

    piped = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # pytest sets it to 80
    proc = cloudprof("report", str(run1), env=piped, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # piped, the table still has one line per row: the header is not wrapped mid-word
    assert any(re.search(r"machine\s+workers\s", line) for line in proc.stdout.splitlines()), \
        proc.stdout
    assert f"wrote {run1 / 'report.html'}" in proc.stdout.replace("\n", "")

    proc = in_process("compare", str(run1), str(run2), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert run1.name in proc.stdout and run2.name in proc.stdout

    proc = in_process("sweep", "--resume", str(run1), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "2 trial(s) already done" in proc.stdout
    assert len(pd.read_parquet(run1 / "trials.parquet")) == 2  # nothing ran twice


def test_no_report_prints_the_summary_and_leaves_the_files_to_the_report_command(
        tmp_path: Path) -> None:
    tiny = ["--frames", "4", "--rows", "40", "--cols", "50", "--dim", "10", "--duration", "0.5",
            "--repeats", "1", "--workers", "1"]
    out = tmp_path / "runs"
    proc = in_process("sweep", "-m", "n2-highcpu-80", "--dry-run", *tiny, "--no-report",
                      "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = out.iterdir()
    assert "Best by throughput" in proc.stdout  # the summary and the answer, as ever
    assert f"--no-report: `cloudprof report {run}` writes" in " ".join(proc.stdout.split())
    assert not [p.name for p in run.iterdir() if p.name.startswith(("report.", "plots"))]
    proc = in_process("report", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / "report.html").is_file() and (run / "report.md").is_file()
    assert list((run / "plots").glob("*.svg"))


def _imports_pandas(argv: list[str], cwd: Path) -> tuple[bool, subprocess.CompletedProcess[str]]:
    """Run ``cloudprof ARGV`` through the console entry point in a fresh interpreter and say
    whether pandas was imported by the time it returned."""
    probe = ("import sys; from orchestrator import cli; "
             f"sys.argv = ['cloudprof', *{argv!r}]; code = cli.main(); "
             "sys.stderr.write(f'\\npandas={\"pandas\" in sys.modules} code={code}')")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=240, cwd=cwd)
    found = re.search(r"pandas=(True|False) code=(\d+)", proc.stderr)
    assert found and found.group(2) == "0", proc.stderr[-3000:]
    return found.group(1) == "True", proc


def test_runs_never_imports_pandas(tmp_path: Path) -> None:
    """pandas' import (0.5-0.7 s) is paid where a report is made (its tables are pandas
    frames, its figures Altair charts of them), not by ``runs``, which lists what the
    store keeps."""
    out = tmp_path / "runs"
    tiny = ["--frames", "4", "--rows", "40", "--cols", "50", "--dim", "10", "--duration", "0.5",
            "--repeats", "1", "--workers", "1,2"]
    # the run they read, made in this process: what the sweep imports is not checked here
    proc = in_process("sweep", "-m", "n2-highcpu-80", "--dry-run", *tiny, "--out", str(out),
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = out.iterdir()
    assert "Best by throughput" in proc.stdout and (run / "report.html").is_file()
    _, proc = _imports_pandas(["report", "--json", str(run)], tmp_path)
    assert json.loads(proc.stdout)["trials"]["ok"] == 2
    loaded, proc = _imports_pandas(["runs", "--out", str(out)], tmp_path)
    assert not loaded and run.name in proc.stdout


def test_the_console_script_freezes_its_objects_before_exit_and_an_in_process_call_does_not(
        tmp_path: Path) -> None:
    """At exit a command that loaded pandas and the report leaves ~10^5 objects for the
    interpreter's last collections (0.1-0.4 s of a sweep's wall): the entry point moves them
    into the permanent generation first. ``main(argv)`` (tests, a notebook) must not."""
    probe = ("import gc, sys; from orchestrator import cli; "
             "sys.argv = ['cloudprof', 'catalog', '--min-vcpus', '64', '--json']; "
             "code = cli.main(); "
             "sys.stderr.write(f'frozen={gc.get_freeze_count()} code={code}')")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    frozen, code = re.search(r"frozen=(\d+) code=(\d+)", proc.stderr).groups()  # type: ignore[union-attr]
    assert code == "0" and int(frozen) > 10_000, proc.stderr[-2000:]
    assert json.loads(proc.stdout)  # the command's own output is whole
    import gc

    before = gc.get_freeze_count()
    assert cli.main(["catalog", "--min-vcpus", "64", "--json"]) == 0
    assert gc.get_freeze_count() == before


def test_catalog_price_sources_are_printed_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A source is the catalog file's text, not markup: ``[internal]`` stays."""
    import csv

    from orchestrator.catalog.machines import CATALOG_ENV, catalog_dir

    for name in ("gcp.csv", "aws.csv"):
        with (catalog_dir() / name).open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        for row in rows:
            row["price_source"] = f"[internal] {name} list"
        with (tmp_path / name).open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    monkeypatch.setenv(CATALOG_ENV, str(tmp_path))
    code, out, err = run_main(["catalog", "--family", "c2", "--region", "us-central1"], capsys)
    assert code == 0, err
    assert "[1] [internal] gcp.csv list; price date" in out, out
