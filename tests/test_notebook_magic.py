"""``%%cloudprof sweep ...`` in a real Jupyter kernel (nbclient): the cell becomes a job."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]


def _execute(tmp_path: Path, cells: list[str]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=240, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return nb


@pytest.mark.slow
def test_a_cell_magic_profiles_the_cell_and_returns_its_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDPROF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    runs = tmp_path / "runs"
    nb = _execute(tmp_path, [
        "%load_ext orchestrator.notebook",
        "%%cloudprof sweep --machine n2-highcpu-8 --workers 1,2 --repeats 1 --dry-run "
        f"--out {runs}\n"
        "import os\n"
        "print('cloudprof:phase work')\n"
        "print('cloudprof:units', 10 * int(os.environ['CLOUDPROF_WORKERS']))\n",
        "run = _\nprint('RUN', run)",
        "%%cloudprof sweep --machine n2-highcpu-8 --command 'python x.py'\npass\n",
    ])
    outputs = [cell.outputs for cell in nb.cells]
    assert not [o for cell in outputs for o in cell if o.output_type == "error"]
    (run,) = list(runs.iterdir())
    # while it ran: a line per trial as it ended, before the table
    streamed = "".join(o.get("text", "") for o in outputs[1] if o.output_type == "stream")
    assert "running; each trial is listed as it ends" in streamed
    assert "✓ n2-highcpu-8-w1-r0: " in streamed and "✓ n2-highcpu-8-w2-r0: " in streamed
    kinds = [o.output_type for o in outputs[1]]
    assert kinds.index("display_data") > max(i for i, k in enumerate(kinds) if k == "stream")
    shown = [o for o in outputs[1] if o.output_type == "display_data"]
    assert shown and "text/html" in shown[0]["data"]  # the summary table, inline
    assert "n2-highcpu-8" in shown[0]["data"]["text/plain"]
    assert any(str(run) in o.get("text", "") for o in outputs[2])  # the cell's value
    import pandas as pd

    trials = pd.read_parquet(run / "trials.parquet")
    assert sorted(trials["units"]) == [10, 20] and set(trials["status"]) == {"ok"}
    assert {p["name"] for ps in trials["phases"] for p in json.loads(ps)} == {"work"}
    refused = "".join(o.get("text", "") for o in outputs[3])
    assert refused.count("error:") == 1 and "--command is set by the magic" in refused
