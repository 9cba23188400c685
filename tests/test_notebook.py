"""notebooks/analysis.ipynb executed as shipped, with cloudprof's own kernel, by nbclient.

The runs it reads come from real ``--dry-run`` sweeps of the cube workload through the
sweep engine, laid out as a user's checkout would hold them; its table is checked
against ``cloudprof report --json`` on the same run.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from rich.console import Console

from tests.fixtures.in_process import cloudprof

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "analysis.ipynb"
SMALL = {"frames": 8, "rows": 100, "cols": 100, "dim": 20}


def sweep(runs: Path, **spec: object) -> Path:
    """A real --dry-run sweep of the cube workload, as a user would run it."""
    from orchestrator.engine.sweep import run_sweep
    from orchestrator.spec.spec import SweepSpec

    full = SweepSpec(repeats=1, machines=["n2-highcpu-8"], duration_s=0.3, out=runs,
                     dry_run=True, **spec)  # type: ignore[arg-type]
    return run_sweep(full, console=Console(file=io.StringIO()))


def cloudprof_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the "cloudprof" kernel the notebook names, as the docs say (into a prefix
    of the test's own rather than the user's Jupyter folder)."""
    prefix = tmp_path / "jupyter"
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(prefix),
                    "--name", "cloudprof", "--display-name", "cloudprof"],
                   check=True, capture_output=True)
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))


def execute_as_shipped(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       then: str) -> nbformat.NotebookNode:
    """The notebook as committed, in ``repo``'s notebooks/, run by nbclient with the kernel
    it names; then one cell of ``then``, which reads the kernel's state after the run."""
    (repo / "notebooks").mkdir(parents=True)
    shutil.copy(NOTEBOOK, repo / "notebooks" / NOTEBOOK.name)
    cloudprof_kernel(tmp_path, monkeypatch)
    nb = nbformat.read(repo / "notebooks" / NOTEBOOK.name, as_version=4)
    assert nb.metadata.kernelspec.name == "cloudprof"
    nb.cells.append(nbformat.v4.new_code_cell(then))
    NotebookClient(nb, timeout=180,  # no kernel_name: the one the notebook names
                   resources={"metadata": {"path": str(repo / "notebooks")}}).execute()
    return nb


@pytest.mark.slow
def test_the_notebook_without_runs_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nb = execute_as_shipped(tmp_path / "fresh-clone", tmp_path, monkeypatch, "print(len(summary))")
    said = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert "no run under runs: run a sweep first" in said and said.endswith("0\n")


@pytest.mark.slow
def test_the_notebook_as_shipped_keeps_runs_apart_and_matches_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "checkout"  # laid out like a checkout: the shipped RUNS = "runs"
    job = tmp_path / "job"
    job.mkdir()  # a --command job whose grid point size=0 makes nothing: a zero rate
    (job / "job.py").write_text(
        "import os, sys\n"
        "print('cloudprof:units', int(sys.argv[1]) * int(os.environ['CLOUDPROF_WORKERS']))\n")
    grid = sweep(repo / "runs", workers=[1, 2], grid={"size": ["0", "5"]}, workdir=job,
                 command="python job.py {size}")
    numpy = sweep(repo / "runs" / "strategies", workers=[1],
                  workload_params={**SMALL, "strategy": "numpy"})
    nb = execute_as_shipped(repo, tmp_path, monkeypatch,
                            "print(summary.to_json(orient='records'))\n"
                            "print(throughput.to_json(indent=None))\n"
                            "print(peak.to_json(indent=None))\n"
                            "print(strategies.to_json(orient='index'))")
    shipped = len(nb.cells) - 1
    outputs = [o for cell in nb.cells[:shipped] if cell.cell_type == "code"
               for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs).splitlines()
    rows = json.loads(printed[0])
    done = cloudprof("report", "--json", str(grid), cwd=tmp_path)  # in this process
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    mine = {(r["machine"], r["workers"]): r["units_per_s"] for r in rows
            if r["run"] == report["run"]["id"]}
    assert mine == pytest.approx({(r["machine"], r["workers"]): r["units_per_s"]
                                  for r in report["results"]})
    assert {m for m, _ in mine} == {"n2-highcpu-8 · size=0", "n2-highcpu-8 · size=5"}
    assert [mine["n2-highcpu-8 · size=0", w] for w in (1, 2)] == [0, 0]
    series = {r["series"] for r in rows}
    assert len(series) == 3 and not any("fast" in s for s in series)  # no default label
    assert sum("strategy=numpy" in s and numpy.name in s for s in series) == 1

    shown = [o for o in outputs if "vega" in o.get("data", {}).get("text/html", "")]
    assert len(shown) == 2  # throughput and peak memory, drawn by Altair
    strategies = json.loads(printed[3])  # only the strategy a run set, beside the article's
    numpy_rate = max(r["units_per_s"] for r in rows if r["run"] == numpy.name)
    assert strategies["numpy"]["best_units_per_s"] == pytest.approx(numpy_rate)
    assert strategies["numpy"]["article_units_per_s"] == 76.26
    assert strategies["naive"]["best_units_per_s"] is None and "fast" not in strategies
    zero = sum(r["units_per_s"] <= 0 for r in rows)
    for chart, field, points in zip(map(json.loads, printed[1:3]), ("units_per_s", "peak_mib"),
                                    (len(rows) - zero, len(rows)), strict=True):
        values = [v for data in chart["datasets"].values() for v in data]
        assert len(values) == points and all(v[field] > 0 for v in values)  # none at zero
        assert (chart.get("layer") or [chart])[0]["encoding"]["y"]["scale"]["type"] == "log"
    said = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"{zero} point(s) without a positive units_per_s left out" in said
