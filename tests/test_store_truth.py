"""The store is the truth: one trial per id, a damaged or foreign trials table is never
taken for a store, never overwritten, and never costs the bucket's copy of a result."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator import cli
from orchestrator.errors import EXIT_USAGE, ResultsWriteError
from orchestrator.plan.planner import trial_id_clash
from orchestrator.results.store import RunStore, TrialsUnreadableError
from tests.fixtures.sweeps import runner_processes
from tests.test_store import record


def dry(workers: str = "1", duration: str = "0.5") -> list[str]:
    """A small dry-run sweep's arguments."""
    return ["sweep", "--dry-run", "--machine", "n2-highcpu-8", "--workers", workers,
            "--repeats", "1", "--duration", duration, "--frames", "4", "--rows", "40",
            "--cols", "40", "--dim", "8"]


def _one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------- one trial per id


@pytest.mark.parametrize(("grid", "nodes", "clash"), [
    ({"x": ["a b", "a-b"]}, [1], ("x='a b'", "x='a-b'")),
    ({"x": ["A", "a"]}, [1], None),  # ids keep case: two files, two rows
    ({"x": ["1", "2"], "y": ["a/b", "a?b"]}, [1], ("x='1' y='a/b'", "x='1' y='a?b'")),
    ({"x": ["1-n2", "1"]}, [1, 2], ("x='1-n2' at --nodes 1", "x='1' at --nodes 2")),
    ({"x": ["a.b", "a_b", "a-b", "ab"]}, [1], None),
    ({"x": ["1", "11"], "y": ["1", "11"]}, [1], None),
])
def test_grid_points_that_slug_to_one_trial_id_are_found(
    grid: dict[str, list[str]], nodes: list[int], clash: tuple[str, str] | None,
) -> None:
    found = trial_id_clash(grid, nodes)
    assert (found[:2] if found else None) == clash


def test_a_grid_whose_values_share_a_trial_id_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """``x=a b,a-b`` used to run both, record one and exit 0."""
    out = tmp_path / "runs"
    code = cli.main([*dry(), "--grid", "x=a b,a-b", "--out", str(out)])
    _, err = capsys.readouterr()
    line = _one_error(err)
    assert code == EXIT_USAGE and "x='a b' and x='a-b'" in line and "same trial id" in line
    assert not out.exists()


# ---------------------------------------------------------------- a damaged table


def test_a_table_that_no_longer_reads_back_is_left_as_it_is(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run", {"sweep_id": "s", "spec": {}, "plan": {}})
    record(store, 1, 10.0)
    damaged = b"not a parquet file\n"
    store.trials_path.write_bytes(damaged)
    with pytest.raises(TrialsUnreadableError) as info:
        record(store, 2, 20.0)
    assert info.value.errno == errno.EIO and info.value.filename == str(store.trials_path)
    assert store.trials_path.read_bytes() == damaged  # never replaced by a table of one row
    assert not store.timeseries_path("n2-highcpu-8-w2-r0").exists()


def test_a_store_says_whether_its_table_reads_back(tmp_path: Path) -> None:
    """What the sweep's end asks before it empties the bucket of the results."""
    store = RunStore.create(tmp_path / "run", {"sweep_id": "s", "spec": {}, "plan": {}})
    record(store, 1, 10.0)
    assert store.reads_back()
    store.trials_path.write_bytes(store.trials_path.read_bytes()[:100])
    assert not store.reads_back()
    pq.write_table(pa.table({"id": [1]}), store.trials_path)
    assert not store.reads_back()


def test_an_error_that_escapes_every_status_write_still_settles_sweep_json(
    tmp_path: Path,
) -> None:
    store = RunStore.create(tmp_path / "run", {"sweep_id": "s", "spec": {}, "plan": {}})
    for exc, status in ((ValueError("a bug"), "failed"), (KeyboardInterrupt(), "interrupted")):
        store.set_status("running")
        with pytest.raises(type(exc)), store.running():
            raise exc
        assert store.read_sweep()["status"] == status
    store.set_status("done")
    with pytest.raises(ValueError), store.running():  # a status already written stands
        raise ValueError("after the end")
    assert store.read_sweep()["status"] == "done"





@pytest.mark.slow
def test_a_table_damaged_mid_sweep_stops_the_sweep_and_keeps_every_result(
    tmp_path: Path,
) -> None:
    """Someone overwrites trials.parquet while the second trial runs: the sweep stops with
    one line saying where the results are, the file is not replaced, the bucket keeps the
    trial it could not record, sweep.json says failed."""
    out, bucket = tmp_path / "runs", tmp_path / "bucket"
    argv = [sys.executable, "-m", "orchestrator", *dry("1,2,3", "1.5"), "--out", str(out),
            "--bucket", str(bucket)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "CLOUDPROF_CACHE": str(tmp_path / "cache")})
    damaged = b"written by something else\n"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            tables = list(out.glob("*/trials.parquet"))
            parts = list(out.glob("*/trials.parts/*.json"))  # the first trial, recorded
            if tables and len(parts) == 1 and runner_processes(str(out)):
                tables[0].write_bytes(damaged)
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        else:
            pytest.fail("no trial finished in time")
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    line = _one_error(err)
    assert proc.returncode == ResultsWriteError.exit_code
    (run_dir,) = out.iterdir()
    sweep = json.loads((run_dir / "sweep.json").read_text())
    results = bucket / "results" / sweep["sweep_id"]
    assert "trials.parquet no longer reads back" in line and str(results) in line
    assert f"cloudprof sweep --resume {run_dir}" in line
    assert (run_dir / "trials.parquet").read_bytes() == damaged
    assert sweep["status"] == "failed"
    kept = {p.name for p in results.iterdir() if (p / "summary.json").is_file()}
    assert {"n2-highcpu-8-w1-r0", "n2-highcpu-8-w2-r0"} <= kept  # both results, in the bucket
    assert not runner_processes(str(out))


# ---------------------------------------------------------------- a foreign file


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real dry-run sweep's store, copied by each test that spoils it."""
    out = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CLOUDPROF_CACHE", str(out / "cache"))
        assert cli.main([*dry(), "--out", str(out / "runs")]) == 0
    (run_dir,) = (out / "runs").iterdir()
    return run_dir


@pytest.mark.parametrize("rows", [0, 2])
@pytest.mark.parametrize("command", ["resume", "report"])
def test_a_foreign_parquet_file_is_refused_as_a_store(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: int,
    command: str,
) -> None:
    """A Parquet file that is not cloudprof's (here: one with a status column, as many
    tables have) in place of a run's table: one line, nothing run, the file untouched."""
    run_dir = Path(shutil.copytree(finished_run, tmp_path / "run"))
    table = run_dir / "trials.parquet"
    pq.write_table(pa.table({"id": list(range(rows)), "status": ["ok"] * rows},
                            schema=pa.schema([("id", pa.int64()), ("status", pa.string())])),
                   table)
    before = table.read_bytes()
    tree = sorted(p for p in run_dir.rglob("*") if p.name != ".lock")
    capsys.readouterr()
    argv = ["sweep", "--resume", str(run_dir)] if command == "resume" else ["report", str(run_dir)]
    code = cli.main(argv)
    _, err = capsys.readouterr()
    line = _one_error(err)
    assert code == EXIT_USAGE and "is not a cloudprof trials table" in line
    assert "trial_id" in line
    assert table.read_bytes() == before
    assert json.loads((run_dir / "sweep.json").read_text())["status"] == "done"
    assert sorted(p for p in run_dir.rglob("*") if p.name != ".lock") == tree  # nothing ran
