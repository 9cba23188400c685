"""notebooks/analysis.ipynb executed with nbclient on small inputs, its outputs checked.

The stores it reads come from real ``--dry-run`` sweeps of the cube workload
through the sweep engine, one per strategy, as a user would run them.
"""

from __future__ import annotations

import io
import json
import math
import shutil
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbclient import NotebookClient
from rich.console import Console

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "analysis.ipynb"
STRATEGIES = ["naive", "dataframes", "numpy", "threads", "fast"]
# Small, yet large enough that a cube's gather dominates the per-cube overhead, so the
# strategies separate (fast is ~2.5x numpy at this size, ~1.1x at dim 10).
SMALL = {"frames": 20, "rows": 100, "cols": 200, "dim": 60}


def strategy_sweep(runs: Path, strategy: str, workers: list[int]) -> Path:
    """A real --dry-run sweep of the cube workload with one strategy, as a user would run it."""
    from orchestrator.engine.sweep import run_sweep
    from orchestrator.spec.spec import SweepSpec

    spec = SweepSpec(
        repeats=1, machines=["n2-highcpu-8"],
        workers=workers,
        duration_s=0.5,
        workload_params={**SMALL, "strategy": strategy},
        out=runs,
        dry_run=True,
    )
    return run_sweep(spec, console=Console(file=io.StringIO()))


def run_notebook(tmp_path: Path, runs: Path, out: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert "parameters" in nb.cells[1].metadata.get("tags", [])
    nb.cells[1].source = (
        f"RUNS = {str(runs)!r}\n"
        "FRAMES, ROWS, COLS = 4, 40, 50\n"
        "SEED = 0\n"
        f"INPUT_CACHE = {str(tmp_path / 'cache')!r}\n"
        "READ_REPEATS = 2\n"
        f"OUT = {str(out)!r}\n"
    )
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    return nb


@pytest.mark.slow
def test_notebook_reproduces_the_articles_tables(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    stores = {}
    for strategy in STRATEGIES:
        # Like the article: the first three steps single-threaded, then threads.
        workers = [1, 2] if strategy in ("threads", "fast") else [1]
        stores[strategy] = strategy_sweep(runs, strategy, workers)
    out = tmp_path / "out"
    nb = run_notebook(tmp_path, runs, out)

    reads = pd.read_csv(out / "read_formats.csv", index_col="format")
    assert list(reads.index) == ["csv", "parquet"]
    assert (reads["files"] == 4).all() and (reads["seconds"] > 0).all()
    assert reads.loc["csv", "speedup_vs_csv"] == pytest.approx(1.0)

    strategies = pd.read_csv(out / "strategies.csv", index_col="strategy")
    assert list(strategies.index) == STRATEGIES  # one row per strategy, the article's order
    assert (strategies["best_units_per_s"] > 0).all()
    assert strategies.loc["fast", "best_units_per_s"] >= strategies.loc["numpy", "best_units_per_s"]
    assert strategies.loc["numpy", "best_units_per_s"] > strategies.loc["naive", "best_units_per_s"]
    assert strategies["speedup"].min() == pytest.approx(1.0)
    # the table's numbers are the stores' medians
    for strategy in STRATEGIES:
        trials = pd.read_parquet(stores[strategy] / "trials.parquet")
        assert strategies.loc[strategy, "best_units_per_s"] == pytest.approx(
            trials["units_per_s"].max()
        )

    figure = (out / "throughput_vs_workers.svg").read_text()
    assert figure.startswith("<svg") and "article: laptop, threads" in figure
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/svg+xml" in o.get("data", {}) for o in outputs)
    rendered = json.dumps([o.get("data", {}).get("text/plain", "") for o in outputs])
    assert "fast" in rendered and "naive" in rendered
    # the article's figures beside ours, in their own labelled columns
    assert strategies["article_units_per_s"].to_dict() == pytest.approx(
        {"naive": 0.15, "dataframes": 15.13, "numpy": 76.26, "threads": 355.5, "fast": math.nan},
        nan_ok=True,
    )
    assert reads.loc["csv", "article_seconds_per_file"] == pytest.approx(0.2087)
    assert reads.loc["parquet", "article_files_per_s"] == pytest.approx(100 / 6.57)


def run_as_shipped(
    repo: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> nbformat.NotebookNode:
    """The notebook exactly as committed, in a checkout laid out like this one, executed from
    notebooks/ (where ``jupyter nbconvert --execute`` and Jupyter run it)."""
    (repo / "notebooks").mkdir(parents=True, exist_ok=True)
    shutil.copy(NOTEBOOK, repo / "notebooks" / NOTEBOOK.name)
    monkeypatch.setenv("CLOUDPROF_CACHE", str(cache))  # the shipped INPUT_CACHE = None reads it
    nb = nbformat.read(repo / "notebooks" / NOTEBOOK.name, as_version=4)
    NotebookClient(
        nb, timeout=180, kernel_name="python3",
        resources={"metadata": {"path": str(repo / "notebooks")}},
    ).execute()  # fmt: skip
    return nb


def _outputs(nb: nbformat.NotebookNode) -> tuple[list, str]:
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = json.dumps(
        [o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in outputs]
    )
    return outputs, text


@pytest.fixture(scope="module")
def input_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")  # the shipped inputs, generated once for both tests


@pytest.mark.slow
def test_the_notebook_runs_as_shipped_and_finds_stores_at_any_depth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, input_cache: Path
) -> None:
    repo = tmp_path / "checkout"
    nested = repo / "runs" / "strategies"  # stores two levels below RUNS = "runs"
    for strategy, workers in (("numpy", [1]), ("fast", [1, 2])):
        strategy_sweep(nested, strategy, workers)
    nb = run_as_shipped(repo, monkeypatch, input_cache)
    outputs, text = _outputs(nb)
    assert "2 stores, 3 trials (3 ok)" in text
    assert any("image/svg+xml" in o.get("data", {}) for o in outputs)
    assert "article_units_per_s" in text and "355.5" in text


@pytest.mark.slow
def test_the_notebook_without_stores_shows_the_articles_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, input_cache: Path
) -> None:
    nb = run_as_shipped(tmp_path / "fresh-clone", monkeypatch, input_cache)
    outputs, text = _outputs(nb)
    assert "no results store under" in text and "0 stores" in text
    assert "76.26" in text and "2026.62" not in text  # the table has the article's rates
    assert any("image/svg+xml" in o.get("data", {}) for o in outputs)
