"""The examples in examples/ run, at a small size, exactly as README shows them (--config)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.in_process import cloudprof

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def _run_example(tmp_path: Path, name: str, *overrides: str, report: bool = False) -> Path:
    """The example's sweep as README shows it, through cloudprof's entry point in this
    process (what it prints and returns is the same; the imports are paid once). The
    report's files are written only for a test that reads them (``report``)."""
    out = tmp_path / "runs"
    result = cloudprof("sweep", "--config", str(EXAMPLES / name / "sweep.toml"), "--dry-run",
                       "--repeats", "1", *overrides, *([] if report else ["--no-report"]),
                       "--out", str(out), cwd=tmp_path,
                       env={"CLOUDPROF_CACHE": str(tmp_path / "cache")}, columns=1000)
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-3000:]
    (run,) = list(out.iterdir())
    return run


def _trials(run: Path):
    import pandas as pd

    return pd.read_parquet(run / "trials.parquet")


@pytest.mark.slow
def test_the_scalene_example_reports_each_phase_for_each_grid_point(tmp_path):
    run = _run_example(tmp_path, "scalene_regression", "--workers", "1",
                       "--grid", "rows=3000", "--grid", "features=8",
                       "--grid", "model=linear,mlp", report=True)
    trials = _trials(run)
    assert set(trials["status"]) == {"ok"} and set(trials["job_kind"]) == {"fixed_work"}
    assert set(trials["leak_verdict"]) == {"inconclusive"}  # one run grows as it works
    assert sorted(json.loads(g)["model"] for g in trials["grid"]) == ["linear", "mlp"]
    for text in trials["phases"]:
        phases = json.loads(text)
        assert [p["name"] for p in phases] == ["import", "load", "fit", "predict", "save",
                                               "exit"]
        assert all(p["peak_rss_bytes"] for p in phases)
    sweep = json.loads((run / "sweep.json").read_text())
    (vm,) = sweep["vms"].values()
    assert vm["setup"] == "ran"
    setup_log = (run / "setup" / f"{next(iter(sweep['vms']))}.log").read_text()
    assert "Collecting" not in setup_log  # scikit-learn is importable here: pip was not run
    report = (run / "report.md").read_text()
    assert "Fixed-work job" in report and "model=mlp" in report and "predict" in report


@pytest.mark.slow
def test_the_leak_example_is_flagged_and_its_fix_is_not(tmp_path):
    run = _run_example(tmp_path, "leak", "--duration", "4", report=True)
    trials = _trials(run)
    verdict = {json.loads(g)["variant"]: v for g, v in zip(trials["grid"],
                                                           trials["leak_verdict"], strict=True)}
    assert verdict["leaky"] == "leak" and verdict["fixed"] != "leak"
    assert set(trials["unit"]) == {"batch"}
    # a leaking job gets no plain memory request: its growth rate and the peak it reached
    report = (run / "report.md").read_text()
    assert "none (leak): grows" in report and "MB/s, reached" in report


@pytest.mark.slow
def test_the_cube_script_example_counts_cubes_through_the_protocol(tmp_path):
    run = _run_example(tmp_path, "cube_script", "--workers", "1", "--duration", "4",
                       "--command", "python cube_job.py --frames 4 --rows 100 --cols 100 "
                       "--dim 10")
    (row,) = _trials(run).to_dict("records")
    assert row["status"] == "ok" and row["unit"] == "cube" and row["units"] > 0
    cubes = [p for p in json.loads(row["phases"]) if p["name"] == "cubes"]
    assert cubes and cubes[0]["units"] == row["units"] and cubes[0]["units_per_s"] > 0


@pytest.mark.slow
def test_the_batch_pool_example_measures_a_process_tree_for_each_grid_point(tmp_path):
    run = _run_example(tmp_path, "batch_pool", "--workers", "2",
                       "--grid", "records=100000", "--grid", "batch=300,1500")
    trials = _trials(run)
    assert set(trials["status"]) == {"ok"}, trials["error"].tolist()
    assert len(trials) == 2 and set(trials["job_kind"]) == {"fixed_work"}
    assert sorted({json.loads(g)["batch"] for g in trials["grid"]}) == ["1500", "300"]
    for text in trials["phases"]:
        assert [p["name"] for p in json.loads(text)] == ["generate", "score", "merge"]
    import pyarrow.parquet as pq

    two = trials[trials["workers"] == 2]["trial_id"].iloc[0]
    children = pq.read_table(run / "timeseries" / f"{two}.parquet").column("children")
    assert max(c for c in children.to_pylist() if c is not None) >= 2  # the pool's processes
    assert "scored 100000 records" in (run / "logs" / f"{two}.log").read_text()


@pytest.mark.slow
def test_the_numpy_blocks_example_reports_its_own_units_for_each_grid_point(tmp_path):
    run = _run_example(tmp_path, "numpy_blocks", "--workers", "2", "--duration", "2",
                       "--grid", "size=512", "--grid", "block=64,256")
    trials = _trials(run)
    assert set(trials["status"]) == {"ok"}, trials["error"].tolist()
    assert len(trials) == 2 and set(trials["job_kind"]) == {"throughput"}
    assert set(trials["unit"]) == {"megapixel"} and (trials["units_per_s"] > 0).all()
    assert sorted({json.loads(g)["block"] for g in trials["grid"]}) == ["256", "64"]
    for text in trials["phases"]:
        assert [p["name"] for p in json.loads(text)] == ["prepare", "blocks"]


@pytest.mark.parametrize("name", ["scalene_regression", "batch_pool", "numpy_blocks",
                                  "leak", "cube_script"])
def test_each_example_is_one_command_in_readme(name):
    readme = (REPO / "README.md").read_text()
    assert f"cloudprof sweep --config examples/{name}/sweep.toml --dry-run" in readme
    assert (EXAMPLES / name / "sweep.toml").is_file()


# Each example as a --command sweep with a --grid under both profilers: the profile names
# the example's own hot functions (frames in its workdir, marked as the user's code).
_PROFILED = {
    "scalene_regression": (["--workers", "1", "--grid", "rows=3000", "--grid", "features=8",
                            "--grid", "model=mlp"], {"fit_model", "predict_rows", "load_data"}),
    "batch_pool": (["--workers", "2", "--grid", "records=20000", "--grid", "batch=500"],
                   {"score_record", "score_batch", "make_records", "merge_scores"}),
    "numpy_blocks": (["--workers", "1", "--duration", "3", "--grid", "size=1024",
                      "--grid", "block=128"],
                     {"smooth_block", "summarise_block", "process_tiles", "make_image"}),
}
# Under memray (native stacks) numpy's import alone took over 3 s on a loaded two-core
# host, and the job was stopped before its first tile: the time-bound example gets longer.
_UNDER_MEMRAY = {"numpy_blocks": ["--duration", "6"]}


# scalene_regression is profiled for CPU only: under memray it takes the same --command path
# as numpy_blocks (a native job, own sites by name) and batch_pool (forked children), while
# its scikit-learn import traced with native stacks cost ~50 s of CPU (the flame graph of
# its millions of native frames alone ~30 s), half of this file's.
_KINDS = [(name, kind) for name in sorted(_PROFILED) for kind in ("cpu", "memory")
          if (name, kind) != ("scalene_regression", "memory")]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "kind"), _KINDS)
def test_each_example_is_profiled_by_its_own_functions(tmp_path, name, kind):
    args, functions = _PROFILED[name]
    if kind == "memory":
        args = [*args, *_UNDER_MEMRAY.get(name, [])]  # the last --duration wins
    run = _run_example(tmp_path, name, *args, "--profile", kind)
    assert set(_trials(run)["status"]) == {"ok"}
    records = [json.loads(p.read_text()) for p in (run / "profiles").glob("*/record.json")]
    assert len(records) == 1 and records[0]["status"] == "ok", records
    prof = records[0]["profile"]
    assert prof["status"] == "ok", prof
    if kind == "cpu":
        own = [f["function"].split(" ")[0] for f in prof["own_functions"]]
    else:
        own = [s["caller"] for s in prof["top_sites"] if s["own"]]
    assert functions & set(own), (own, prof)  # the example's hot functions, by name
