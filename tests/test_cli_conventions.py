"""The command line follows Click's conventions: choices listed and completed, plain metavars,
installable completion, help on a bare ``cloudprof`` with exit 2, JSON for scripts."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import cli
from orchestrator.errors import EXIT_USAGE
from orchestrator.providers import PROVIDERS
from workloads.cube_strategies import STRATEGIES

COMMANDS = ["sweep", "catalog", "report", "compare", "export", "recommend", "cleanup", "runs"]
# the console script installed beside this Python (in its venv), whatever $PATH holds:
# `make test` does not activate the venv
SCRIPT = str(Path(sys.executable).parent / "cloudprof")


def cloudprof(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=60,
                          env={**base, **(env or {})})


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)])
def test_help_shows_no_python_type_labels_and_no_braces_in_usage(command: list[str]) -> None:
    proc = cloudprof(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    for label in ("<bool>", "<list[", "<str>", "<int>", "<float>", "<path>", "<list"):
        assert label not in proc.stdout, (label, proc.stdout)
    usage = next(line for line in proc.stdout.splitlines() if "Usage:" in line)
    assert "{" not in usage and "}" not in usage, usage


def test_choices_are_listed_in_help_from_their_one_definition() -> None:
    text = cloudprof("sweep", "--help").stdout
    provider = next(line for line in text.splitlines() if "--provider" in line)
    assert all(name in provider for name in PROVIDERS), provider
    strategy = next(line for line in text.splitlines() if "--strategy" in line)
    assert all(name in strategy for name in STRATEGIES), strategy
    text = cloudprof("catalog", "--help").stdout
    assert re.search(r"--sort\s+<name\|vcpus\|memory\|price>", text), text


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ("cloudprof sweep --provider ", set(PROVIDERS)),
        ("cloudprof sweep --strategy ", set(STRATEGIES)),
        ("cloudprof catalog --sort ", {"name", "vcpus", "memory", "price"}),
        ("cloudprof sweep --workload mem", {"memory-steady", "memory-leak", "memory-spike",
                                            "memcopy"}),
        ("cloudprof sweep -m n2-highcpu-8", {"n2-highcpu-8", "n2-highcpu-80"}),
    ],
)
def test_the_shell_completes_choices_workloads_and_machine_types(
    words: str, expected: set[str]
) -> None:
    proc = cloudprof(env={"_CLOUDPROF_COMPLETE": "complete_bash", "COMP_WORDS": words,
                          "COMP_CWORD": str(len(words.split(" ")) - 1)})
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.split()) == expected


def test_shell_completion_installs_for_bash(tmp_path: Path) -> None:
    # Typer otherwise ignores "bash" and asks shellingham which shell is an ancestor of
    # this process: none where the tests run detached (nohup, a CI runner without a shell).
    proc = cloudprof("--install-completion", "bash", env={
        "HOME": str(tmp_path), "SHELL": "/bin/bash",
        "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert proc.returncode == 0, proc.stderr
    script = (tmp_path / ".bash_completions" / "cloudprof.sh").read_text()
    assert "_CLOUDPROF_COMPLETE" in script
    assert "cloudprof.sh" in (tmp_path / ".bashrc").read_text()


def test_cloudprof_alone_prints_help_and_exits_2() -> None:
    proc = cloudprof()
    assert proc.returncode == EXIT_USAGE
    assert "Usage: cloudprof" in proc.stdout and all(c in proc.stdout for c in COMMANDS)


def test_catalog_json_holds_the_same_rows_as_csv_at_full_precision(
    capsys: pytest.CaptureFixture[str],
) -> None:
    filters = ["--provider", "aws", "--max-vcpus", "8", "--sort", "price"]
    assert cli.main(["catalog", *filters, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert cli.main(["catalog", *filters, "--format", "csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert list(rows[0]) == list(table[0])  # the catalog files' column names
    key = ("instance_type", "region")
    assert [tuple(r[k] for k in key) for r in rows] == [tuple(r[k] for k in key) for r in table]
    assert [r["price_on_demand"] for r in rows] == [float(r["price_on_demand"]) for r in table]
    assert all(isinstance(r["vcpus"], int) and r["vcpus"] <= 8 for r in rows) and rows


def test_plan_prints_plan_and_estimate_then_stops_without_credentials_or_any_write(
    tmp_path: Path,
) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "LANG": "C.UTF-8",
           "CLOUDPROF_CACHE": str(tmp_path / "cache"), "COLUMNS": "200",
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    out = tmp_path / "runs"
    proc = subprocess.run(
        [SCRIPT, "sweep", "-m", "n2-highcpu-80", "--workers", "1,80", "--repeats", "2",
         "--plan", "--out", str(out)],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # no Google credentials here: none were asked for
    assert "VM 1/1 to create: gcp n2-highcpu-80" in proc.stdout
    assert "× 2 repeats" in proc.stdout and "predicted" in proc.stdout
    assert re.search(r"estimated cost \$\d+\.\d{2,} — estimates", proc.stdout), proc.stdout
    assert "Report" not in proc.stdout and "Results store" not in proc.stdout
    # nothing generated, nothing written: no run directory, no inputs cache, no bucket
    assert not out.exists() and not (tmp_path / "cache").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_plan_with_a_budget_below_the_estimate_shows_the_plan_and_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.errors import EXIT_BUDGET

    code = cli.main(["sweep", "-m", "n2-highcpu-80", "--plan", "--max-cost", "0.0001",
                     "--out", str(tmp_path / "runs")])
    out, err = capsys.readouterr()
    assert code == EXIT_BUDGET and "VM 1/1 to create" in out and "above --max-cost" in err
    assert not (tmp_path / "runs").exists()


def test_help_texts_keep_their_square_brackets() -> None:
    """Help is rendered as rich markup, where ``[ray]`` would be a tag and vanish."""
    text = cloudprof("sweep", "--help").stdout
    nodes = next(line for line in text.splitlines() if "--nodes" in line)
    assert "cloudprof[ray]" in nodes, nodes
    assert "[trial:]SIZE" in text
    assert "\\[" not in text  # escaped once, never shown escaped
