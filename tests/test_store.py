"""The results store: atomic records, derived columns, resume bookkeeping."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from orchestrator.catalog.machines import MachineType
from orchestrator.errors import UsageError
from orchestrator.plan.planner import TrialPlan
from orchestrator.results.store import ALL_COLUMNS, TRIAL_COLUMNS, RunStore, derive, trial_row
from orchestrator.results.trials_table import _merged

MACHINE = MachineType(provider="gcp", name="n2-highcpu-8", family="n2", vcpus=8,
                      memory_gib=8.0, region="us-central1", price_on_demand=0.36,
                      price_spot=0.09, price_source="test", price_date="2024-06-01")


def trial(workers: int, repeat: int = 0) -> TrialPlan:
    return TrialPlan(f"n2-highcpu-8-w{workers}-r{repeat}", "n2-highcpu-8", workers, repeat, [])


def summary(units_per_s: float, status: str = "ok", peak: int = 100 << 20) -> dict:
    return {
        "schema": "cloudprof.trial/1", "status": status, "error": None, "unit": "cube",
        "units": int(units_per_s * 2), "seconds": 2.0, "units_per_s": units_per_s,
        "peak_rss_bytes": peak, "cpu_utilisation": 0.5, "leak": {"verdict": "ok",
                                                                 "slope_mb_per_s": 0.01},
        "host": {"hostname": "h", "cores_logical": 2, "memory_bytes": 4 << 30},
        "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:02Z",
    }


def record(store: RunStore, workers: int, ups: float, **kw) -> dict:
    ts = kw.pop("ts", None)
    return store.record_trial(trial_row(summary(ups, kw.pop("status", "ok")), MACHINE,
                                        trial=trial(workers, kw.pop("repeat", 0)), sweep_id="s",
                                        ran_on="local", provider="local", **kw), ts)


def _record_as_pandas_did(reference: Path, row: dict) -> None:
    """The old pandas path of ``record_trial``: the row replaces its trial's, ``reference``
    rewritten as pandas wrote it (the file the pyarrow-only record must read back as)."""
    old = pd.read_parquet(reference)
    for col in ALL_COLUMNS:
        if col not in old.columns:
            old[col] = None
    old = old[old["trial_id"] != row["trial_id"]]
    new = pd.DataFrame([row], columns=list(ALL_COLUMNS))
    derive(new if old.empty else pd.concat([old, new], ignore_index=True)).to_parquet(
        reference, index=False)


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    return RunStore.create(tmp_path / "run", {"sweep_id": "s", "spec": {}, "plan": {}})


def test_create_writes_readable_empty_store(store: RunStore) -> None:
    frame = pd.read_parquet(store.trials_path)
    assert frame.empty and list(frame.columns)[: len(TRIAL_COLUMNS)] == list(TRIAL_COLUMNS)
    data = json.loads(store.sweep_path.read_text())
    assert data["status"] == "planned" and data["sweep_id"] == "s"
    with pytest.raises(UsageError, match="--resume"):
        RunStore.create(store.run_dir, {"sweep_id": "s"})


def test_open_rejects_non_runs(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a cloudprof run"):
        RunStore.open(tmp_path)


def test_output_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="cannot write"):
        RunStore.create(tmp_path / "file" / "run", {})


def test_record_trial_and_derived_columns(store: RunStore, tmp_path: Path) -> None:
    ts = tmp_path / "ts.parquet"
    pd.DataFrame({"t": [0.0, 0.1], "rss_bytes": [1, 2]}).to_parquet(ts)
    record(store, 1, 100.0, ts=ts)
    record(store, 2, 150.0)
    record(store, 4, 160.0)
    store.compact()  # what a read of the store or the sweep's end does
    frame = pd.read_parquet(store.trials_path).set_index("workers")  # what a notebook reads
    assert frame.loc[1, "efficiency"] == pytest.approx(1.0)
    assert frame.loc[2, "efficiency"] == pytest.approx(150.0 / (2 * 100.0))
    assert frame.loc[4, "efficiency"] == pytest.approx(160.0 / (4 * 100.0))
    assert frame.loc[2, "units_per_s_per_vcpu"] == pytest.approx(150.0 / 2)
    assert frame.loc[2, "cost_per_million_units"] == pytest.approx(0.36 / 3600 / 150.0 * 1e6)
    assert not frame.loc[2, "oversubscribed"] and frame.loc[4, "oversubscribed"]
    assert frame.loc[1, "memory_gib"] == pytest.approx(4.0)
    assert frame.loc[1, "leak_verdict"] == "ok" and frame.loc[1, "cost_is_estimate"]
    assert pd.read_parquet(store.timeseries_path("n2-highcpu-8-w1-r0"))["rss_bytes"].tolist() \
        == [1, 2]
    assert not list(store.run_dir.glob(".*.tmp"))  # no temp file left behind


def test_a_recorded_time_series_is_the_fetched_file_linked_not_copied(store: RunStore,
                                                                      tmp_path: Path) -> None:
    fetched = tmp_path / "incoming" / "timeseries.parquet"
    fetched.parent.mkdir()
    pd.DataFrame({"t": [0.0, 0.1], "rss_bytes": [1, 2]}).to_parquet(fetched)
    record(store, 1, 100.0, ts=fetched)
    kept = store.timeseries_path("n2-highcpu-8-w1-r0")
    assert kept.stat().st_ino == fetched.stat().st_ino
    fetched.unlink()  # the engine removes its fetched copy: the store's stays
    assert pd.read_parquet(kept)["rss_bytes"].tolist() == [1, 2]


def test_efficiency_nan_without_one_worker_baseline(store: RunStore) -> None:
    record(store, 2, 150.0)
    assert math.isnan(store.trials_frame()["efficiency"].iloc[0])


def test_rerun_replaces_row_and_failed_is_not_done(store: RunStore) -> None:
    record(store, 1, 100.0)
    store.record_trial(trial_row(None, MACHINE, trial=trial(2), sweep_id="s", ran_on="local",
                                 provider="local", status="failed", error="boom\nsecond line"),
                       None)
    frame = store.trials_frame()
    failed = frame[frame["workers"] == 2].iloc[0]
    assert failed["status"] == "failed" and failed["error"] == "boom second line"
    assert math.isnan(failed["cost_per_million_units"])
    assert store.done_trial_ids() == {"n2-highcpu-8-w1-r0"}
    record(store, 2, 150.0)
    frame = store.trials_frame()
    assert len(frame) == 2 and set(frame["status"]) == {"ok"}
    assert store.done_trial_ids() == {"n2-highcpu-8-w1-r0", "n2-highcpu-8-w2-r0"}


def test_concurrent_records_are_all_kept(store: RunStore) -> None:
    threads = [threading.Thread(target=record, args=(store, w, 10.0 * w)) for w in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(store.trials_frame()["workers"]) == list(range(1, 9))


def test_vm_and_machine_state_merge(store: RunStore) -> None:
    store.record_vm("cp-s-n2", id="123", state="created")
    store.record_vm("cp-s-n2", state="deleted")
    store.record_machine("n2-highcpu-8", "failed", "quota")
    data = RunStore.open(store.run_dir).read_sweep()
    assert data["vms"]["cp-s-n2"] == {"id": "123", "state": "deleted"}
    assert data["machines"]["n2-highcpu-8"]["error"] == "quota"


def test_one_process_at_a_time_per_run(store: RunStore) -> None:
    with store.running(), pytest.raises(UsageError, match=r"in use by pid \d+"), \
                RunStore.open(store.run_dir).running():
        pass
    with RunStore.open(store.run_dir).running():  # released when the holder is done
        pass


def test_the_leak_probability_and_ramp_are_stored_with_each_trial(store: RunStore) -> None:
    ramp = summary(100.0)
    ramp["leak"] = {"verdict": "ok", "slope_mb_per_s": 9.0, "probability": 0.01, "ramp": True}
    store.record_trial(trial_row(ramp, MACHINE, trial=trial(1), sweep_id="s", ran_on="local",
                                 provider="local"), None)
    record(store, 2, 150.0)  # a runner from before the verdict had a probability
    frame = store.compact().to_pandas().set_index("workers")
    assert frame.loc[1, "leak_probability"] == pytest.approx(0.01) and frame.loc[1, "leak_ramp"]
    assert math.isnan(frame.loc[2, "leak_probability"]) and not frame.loc[2, "leak_ramp"]


def test_a_store_created_without_its_table_gets_the_empty_one_once_and_never_over_a_record(
        tmp_path: Path) -> None:
    """A sweep creates its store before its machines start and writes the empty table while
    they do (``trials_table=False``, then ``ensure_trials_table``): the same table as a
    store created whole, and a table a record wrote first is left as it is."""
    late = RunStore.create(tmp_path / "late", {"sweep_id": "s"}, trials_table=False)
    assert (late.run_dir / "sweep.json").is_file() and not late.trials_path.exists()
    late.ensure_trials_table()
    whole = RunStore.create(tmp_path / "whole", {"sweep_id": "s"})
    pd.testing.assert_frame_equal(pd.read_parquet(late.trials_path),
                                  pd.read_parquet(whole.trials_path))

    recorded = RunStore.create(tmp_path / "recorded", {"sweep_id": "s"}, trials_table=False)
    record(recorded, 1, 100.0)  # the first record came before it
    recorded.ensure_trials_table()
    recorded.compact()
    assert pd.read_parquet(recorded.trials_path)["units_per_s"].tolist() == [100.0]


def test_creating_a_store_does_not_import_pandas_and_its_empty_table_reads_as_before(
        tmp_path: Path) -> None:
    """A sweep imports pandas while its machines stage (the engine's warm-up), so the store
    it creates before them must not; the empty table it writes reads back as the pandas one."""
    code = ("import sys; from orchestrator.results.store import RunStore; "
            f"RunStore.create({str(tmp_path / 'run')!r}, {{'sweep_id': 's'}}); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path)
    assert out.stdout.strip() == "[]", out.stdout
    written = pd.read_parquet(tmp_path / "run" / "trials.parquet")
    pd.testing.assert_frame_equal(written, RunStore._empty_frame())
    assert list(written.columns) == list(ALL_COLUMNS)
    store = RunStore.open(tmp_path / "run")  # and the first record on it is an ordinary one
    record(store, 1, 100.0)
    assert store.trials_frame()["efficiency"].tolist() == [1.0]


def _reference_derived(frame: pd.DataFrame) -> pd.DataFrame:
    """Efficiency and scale-out efficiency the plain pandas way (a multi-key groupby of the
    baselines and a join), as ``derive`` computed them before it was made cheap per trial."""
    out = frame.copy()
    ups = pd.to_numeric(out["units_per_s"], errors="coerce")
    workers = pd.to_numeric(out["workers"], errors="coerce")
    ok = out["status"] == "ok"
    out["grid"] = out["grid"].fillna("")
    out["nodes"] = pd.to_numeric(out["nodes"], errors="coerce").fillna(1).astype(int)
    for name, keys, base_rows, scale in (
            ("efficiency", ["sweep_id", "machine", "ran_on", "grid", "nodes"], workers == 1,
             workers),
            ("scaleout_efficiency", ["sweep_id", "machine", "ran_on", "grid", "workers"],
             out["nodes"] == 1, out["nodes"])):
        base = (out[keys].assign(_ups=ups)[ok & base_rows].groupby(keys, dropna=False)["_ups"]
                .mean().rename("_base"))
        baseline = pd.to_numeric(out[keys].join(base, on=keys)["_base"]).to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            eff = ups.to_numpy(dtype=float) / (scale.to_numpy(dtype=float) * baseline)
        out[name] = np.where(ok.to_numpy() & (baseline > 0), eff, np.nan)
    return out


def test_the_derived_efficiencies_equal_a_multi_key_groupby_to_the_last_bit() -> None:
    """``derive`` runs after every trial, so its baselines come from a dict of keys and a
    one-key groupby; they must be the multi-key groupby's exactly, group for group (sweeps,
    machines, hosts, grid points, node counts, failures, missing rates)."""
    rng = random.Random(7)
    for _ in range(150):
        rows = []
        for i in range(rng.randint(1, 30)):
            row = {c: None for c in ALL_COLUMNS}
            row.update(sweep_id=rng.choice(["s1", "s2"]), trial_id=f"t{i}",
                       machine=rng.choice(["m1", "m2"]), ran_on=rng.choice(["local", "m1"]),
                       vcpus=rng.choice([2, 4, None]), workers=rng.choice([1, 1, 2, 4]),
                       units_per_s=rng.choice([rng.random() * 1e3, 1 / 3, 0.0, None,
                                               float("nan")]),
                       price_per_hour=rng.choice([2.87, None]),
                       status=rng.choice(["ok", "ok", "ok", "failed", None]),
                       grid=rng.choice(["", None, '{"a": 1}']), nodes=rng.choice([1, 1, 2, None]))
            rows.append(row)
        frame = pd.DataFrame(rows, columns=list(ALL_COLUMNS))
        got, want = derive(frame), _reference_derived(frame)
        for column in ("efficiency", "scaleout_efficiency"):
            np.testing.assert_array_equal(got[column].to_numpy(dtype=float),
                                          want[column].to_numpy(dtype=float))


def _mixed_rows() -> list[dict]:
    """Rows whose columns a Parquet round trip retypes: a failed trial first (units, peaks,
    rates all None), then ok ones, a re-run replacing the failure, a memory-gated one, a
    profiled one with phases and a grid, another sweep's row."""
    def row(summ, workers, repeat=0, status=None, sweep_id="s", error=None, grid=None):
        plan = TrialPlan(f"n2-highcpu-8-w{workers}-r{repeat}", "n2-highcpu-8", workers, repeat,
                         [], grid=grid or {})
        return trial_row(summ, MACHINE, trial=plan, sweep_id=sweep_id, ran_on="local",
                         provider="local", status=status, error=error, exit_code=1 if error
                         else 0)

    phased = {**summary(90.0), "phases": [{"name": "load", "wall_s": 0.5}], "load_s": 0.4,
              "peak_rss_trial_bytes": 90 << 20, "peak_rss_before_trial_bytes": 120 << 20,
              "peak_phase": "load", "peak_rss_source": "vmhwm", "cpu_seconds": 1.5}
    return [
        row(None, 1, status="failed", error="runner died"),
        row(summary(120.0), 2),
        row(summary(100.0), 1),  # replaces the failure
        row(summary(0.0, status="memory_budget_exceeded", peak=900 << 20), 4),
        row(phased, 2, repeat=1, grid={"dim": 50}),
        row(summary(150.0), 1, repeat=2, sweep_id="other"),
        row(None, 8, status="interrupted"),
    ]


def test_one_store_writes_the_trials_table_a_fresh_store_per_record_writes(tmp_path: Path) -> None:
    # Three ways to the same rows: one store (its in-memory table), a fresh store per record
    # (always reads the file back), and the frame-level steps record_trial made before the
    # table was kept in memory (read_parquet, concat, derive, to_parquet). All must read back
    # as the same frame, dtypes included, after every record.
    spec = {"sweep_id": "s", "spec": {}, "plan": {}}
    one = RunStore.create(tmp_path / "one", spec)
    RunStore.create(tmp_path / "fresh", spec)
    reference = tmp_path / "reference.parquet"
    pd.read_parquet(one.trials_path).to_parquet(reference, index=False)
    for row in _mixed_rows():
        one.record_trial(dict(row), None)
        one.compact()
        fresh = RunStore.open(tmp_path / "fresh")
        fresh.record_trial(dict(row), None)
        fresh.compact()
        _record_as_pandas_did(reference, row)
        want = pd.read_parquet(reference)
        for got in (one.trials_path, tmp_path / "fresh" / "trials.parquet"):
            pd.testing.assert_frame_equal(pd.read_parquet(got), want, check_exact=True)
        pd.testing.assert_frame_equal(one.trials_frame(), derive(want), check_exact=True)
    assert len(want) == 6 and set(want["status"]) == {"ok", "memory_budget_exceeded",
                                                      "interrupted"}


def test_a_store_notices_when_another_writer_changed_the_trials_table(store: RunStore) -> None:
    record(store, 1, 100.0)
    record(store, 2, 150.0)
    other = RunStore.open(store.run_dir)  # e.g. a --resume, or a test, writing the same run
    other.compact()  # e.g. the other process's report
    record(other, 4, 160.0)
    record(store, 8, 170.0)  # must keep the other writer's row
    store.compact()
    assert sorted(pd.read_parquet(store.trials_path)["workers"]) == [1, 2, 4, 8]
    # a user removes a row so that --resume runs it again: the store reads the new file
    frame = pd.read_parquet(store.trials_path)
    frame[frame["workers"] != 2].to_parquet(store.trials_path, index=False)
    assert sorted(store.trials_frame()["workers"]) == [1, 4, 8]
    assert "n2-highcpu-8-w2-r0" not in store.done_trial_ids()


def test_recording_a_trial_needs_no_pandas(tmp_path: Path) -> None:
    """A record runs between two trials: it appends to the table with pyarrow alone, and
    what ``--resume`` asks of a store (which trials are done) needs no pandas either."""
    ts = tmp_path / "ts.parquet"
    pd.DataFrame({"t": [0.0, 0.1], "rss_bytes": [1, 2]}).to_parquet(ts)
    code = f"""
import sys
from orchestrator.plan.planner import TrialPlan
from orchestrator.results.store import RunStore, trial_row
from orchestrator.catalog.machines import MachineType
MACHINE = MachineType(provider="gcp", name="n2-highcpu-8", family="n2", vcpus=8,
                      memory_gib=8.0, region="us-central1", price_on_demand=0.36,
                      price_spot=0.09, price_source="test", price_date="2024-06-01")
summary = {summary(1.0)!r}
store = RunStore.create({str(tmp_path / 'run')!r}, {{"sweep_id": "s"}})
for workers, ups in ((1, 100.0), (2, 150.0), (2, 160.0)):
    plan = TrialPlan(f"w{{workers}}", "n2-highcpu-8", workers, 0, [])
    store.record_trial(trial_row({{**summary, "units_per_s": ups}}, MACHINE, trial=plan,
                                 sweep_id="s",
                                 ran_on="local", provider="local"), {str(ts)!r})
print(sorted(RunStore.open(store.run_dir).done_trial_ids()))
print(sorted(m for m in sys.modules if m.split(".")[0] == "pandas"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.split("\n")[:2] == ["['w1', 'w2']", "[]"], out.stdout + out.stderr
    frame = pd.read_parquet(tmp_path / "run" / "trials.parquet").set_index("trial_id")
    assert frame.loc["w2", "units_per_s"] == 160.0
    assert frame.loc["w2", "efficiency"] == pytest.approx(160.0 / (2 * 100.0))
    assert pd.read_parquet(tmp_path / "run" / "timeseries" / "w2.parquet")["rss_bytes"].tolist() \
        == [1, 2]


def _random_row(rng: random.Random, trial_ids: list[str]) -> dict:
    """A row whose columns hold what rows hold (None, ints, floats, NaN, strings, booleans)
    in random mixes, so that a column's type in the file changes from record to record."""
    row: dict = {}
    for column in ALL_COLUMNS:
        if column in ("oversubscribed", "spot", "cost_is_estimate", "leak_ramp"):
            row[column] = rng.choice([True, False, None])
        elif column in ("trial_id",):
            row[column] = rng.choice(trial_ids)
        elif column in ("sweep_id", "machine", "ran_on", "status", "error", "unit",
                        "leak_verdict", "grid", "peak_phase", "phases"):
            row[column] = rng.choice({"status": ["ok", "ok", "failed", None],
                                      "grid": ["", None, '{"a": 1}']}.get(
                                          column, ["a", "b", None]))
        elif column in TRIAL_COLUMNS or rng.random() < 0.7:
            row[column] = rng.choice([None, 1, 2, 4, 0.5, 1 / 3, 250.0, float("nan")])
        else:
            row[column] = None
    return row


def test_records_read_back_as_the_pandas_records_did_for_random_rows(tmp_path: Path) -> None:
    """The type each column gets in the file follows pandas' rules (read, concat, derive,
    from_pandas) as record_trial applied them row by row, for any mix of missing and
    present values, re-runs replacing rows, and an older file with a column fewer and one
    unknown column, whether the parts are compacted after each record or all at once."""
    rng = random.Random(16)
    for case in range(24):
        run = tmp_path / f"run{case}"
        store = RunStore.create(run, {"sweep_id": "s"})
        reference = tmp_path / f"reference{case}.parquet"
        if case % 4 == 3:  # an older store: no "nodes" column, one this version does not know
            first = _random_row(rng, ["t0"])
            old = pd.DataFrame([first], columns=list(ALL_COLUMNS)).drop(columns=["nodes"])
            old["retired_column"] = 7
            old.to_parquet(store.trials_path, index=False)
            store = RunStore.open(run)
        pd.read_parquet(store.trials_path).to_parquet(reference, index=False)
        ids = [f"t{i}" for i in range(rng.randint(1, 5))]
        for _ in range(rng.randint(1, 8)):
            row = _random_row(rng, ids)
            store.record_trial(dict(row), None)
            _record_as_pandas_did(reference, row)
            if case % 2:  # compacted after every record, or once at the end
                store.compact()
                pd.testing.assert_frame_equal(pd.read_parquet(store.trials_path),
                                              pd.read_parquet(reference), check_exact=True)
        store.compact()
        assert not list((run / "trials.parts").iterdir())
        pd.testing.assert_frame_equal(pd.read_parquet(store.trials_path),
                                      pd.read_parquet(reference), check_exact=True)


def test_trial_rows_hold_the_files_columns_and_leave_out_one_an_older_store_lacks(store):
    """A sweep's end reads its trials as rows (no pandas): an older store's file without
    ``peak_rss_trial_bytes`` gives rows without that key, so the trial gate can tell a
    missing column (fall back to the lifetime peak) from a trial that measured none."""
    import pyarrow.parquet as pq

    record(store, 1, 10.0)
    (row,) = store.trial_rows()
    assert "peak_rss_trial_bytes" in row and row["workers"] == 1
    table = pq.read_table(store.trials_path)
    pq.write_table(table.drop_columns(["peak_rss_trial_bytes"]), store.trials_path)
    (old,) = RunStore.open(store.run_dir).trial_rows()
    assert "peak_rss_trial_bytes" not in old and old["trial_id"] == row["trial_id"]


def _timed_records(store: RunStore, rows: list[dict], first: int) -> float:
    """Median seconds of recording ``rows`` one by one, ids from ``first`` on."""
    import time

    times = []
    for i, row in enumerate(rows):
        row = {**row, "trial_id": f"t{first + i}"}
        start = time.perf_counter()
        store.record_trial(row, None)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def test_recording_the_5000th_trial_costs_what_the_10th_did(tmp_path: Path) -> None:
    """A record writes one part, whatever the table holds: rewriting the whole table cost
    3.7 ms at 10 rows and 113 ms at 5,000 (30x)."""
    base = trial_row(summary(100.0), MACHINE, trial=trial(1), sweep_id="s", ran_on="local",
                     provider="local")
    rows = [{**base, "workers": 1 + i % 16, "units_per_s": 100.0 + i} for i in range(5000)]
    small = RunStore.create(tmp_path / "small", {"sweep_id": "s"})
    big = RunStore.create(tmp_path / "big", {"sweep_id": "s"})
    for i, row in enumerate(rows[:9]):
        small.record_trial({**row, "trial_id": f"t{i}"}, None)
    small.compact()
    # 4,999 records' table, written at once (recording them costs a disk sync each)
    big._write_table(_merged(pa.table({}), [{**r, "trial_id": f"t{i}"}
                                            for i, r in enumerate(rows[:4999])]))
    assert len(big.compact()) == 4999 and len(small.compact()) == 9
    probe = rows[:21]  # alternating, so a neighbour's load hits both alike
    at_10, at_5000 = [], []
    for i in range(3):
        at_10.append(_timed_records(small, probe, 100 + 100 * i))
        at_5000.append(_timed_records(big, probe, 10000 + 100 * i))
    assert min(at_5000) < 3 * min(at_10), (at_10, at_5000)
    assert len(big.compact()) == 4999 + 63


def test_a_reader_sees_every_part_and_a_crash_while_compacting_loses_nothing(
        store: RunStore) -> None:
    for w in (1, 2, 4):
        record(store, w, 50.0 * w)
    record(store, 2, 120.0)  # a re-run: its part replaces the first one's row
    parts = {p: p.read_bytes() for p in sorted((store.run_dir / "trials.parts").iterdir())}
    assert len(parts) == 4 and pd.read_parquet(store.trials_path).empty  # not compacted yet
    other = RunStore.open(store.run_dir)  # another process (a report, --resume)
    assert sorted(other.trials_frame()["units_per_s"]) == [50.0, 120.0, 200.0]
    assert not list((store.run_dir / "trials.parts").iterdir())
    want = pd.read_parquet(store.trials_path)
    for part, data in parts.items():  # a crash after the table was written, parts still there
        part.write_bytes(data)
    again = RunStore.open(store.run_dir)
    pd.testing.assert_frame_equal(again.trials_frame(), derive(want), check_exact=True)
    pd.testing.assert_frame_equal(pd.read_parquet(store.trials_path), want, check_exact=True)
