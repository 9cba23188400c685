"""The report's table of rows (``orchestrator.results.report.rows``) against pandas itself.

The report used pandas for a handful of operations; ``rows.Frame`` does them in plain
Python so that a sweep and ``cloudprof report`` never import pandas. Each test here runs
the same operation both ways on the cases where the two could part: nulls in integer,
boolean and string columns, medians of even counts, ties, missing keys.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.results.report import rows
from orchestrator.results.report.rows import Frame, frame_from_records


def same(a: Any, b: Any) -> bool:
    """The same value of the same type (NaN equals NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def assert_same_records(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert list(g) == list(w)
        assert all(same(g[k], w[k]) for k in g), (g, w)


@pytest.fixture
def awkward(tmp_path: Path) -> Path:
    """A table with every kind of column the store writes, nulls in each."""
    table = pa.table({
        "machine": pa.array(["b", "a", None, "a"], pa.large_string()),
        "workers": pa.array([2, 1, 1, 2], pa.int64()),
        "repeat": pa.array([0, None, 1, 0], pa.int64()),
        "units_per_s": pa.array([1.5, float("nan"), None, 4.0], pa.float64()),
        "oversubscribed": pa.array([True, None, False, True], pa.bool_()),
        "spot": pa.array([False, True, False, False], pa.bool_()),
        "error": pa.nulls(4),
        "peak_rss_bytes": pa.array([2**33, 2**20, 3, None], pa.int64()),
    })  # fmt: skip
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    return path


def test_a_stored_table_reads_as_the_values_read_parquet_gives(awkward: Path) -> None:
    frame = Frame.from_arrow(pq.ParquetFile(awkward).read())
    theirs = pd.read_parquet(awkward)
    assert frame.columns == list(theirs.columns)
    assert_same_records(frame.records(), theirs.to_dict("records"))
    # the cases that matter: an int column with a null is float, a string's null is NaN
    assert frame.rows[0]["repeat"] == 0.0 and isinstance(frame.rows[0]["repeat"], float)
    assert isinstance(frame.rows[2]["machine"], float)
    assert frame.rows[1]["oversubscribed"] is None and frame.rows[0]["workers"] == 2


@pytest.mark.parametrize("values", [
    [3.0, 1.0, 2.0, 10.0],  # an even count: the mean of the middle two
    [0.1, 0.2, 0.7, float("nan"), 0.3],
    [float("nan"), float("nan")],
    [],
    [7.0],
    [1e308, 1e308],  # the middle two's sum overflows: inf, as numpy's mean of them
])  # fmt: skip
def test_reductions_skip_missing_values_as_pandas_does(values: list[float]) -> None:
    series = pd.Series(values, dtype=float)
    with np.errstate(over="ignore"):
        expected = series.median()
    assert same(rows.median(values), float(expected))
    assert same(rows.nanmax(values), float(series.max()))
    assert same(rows.nanmin(values), float(series.min()))
    assert same(rows.first(values), float(series.dropna().iloc[0]) if series.notna().any()
                else math.nan)


def test_idxmax_and_idxmin_take_the_first_of_ties_as_pandas_does() -> None:
    values = [float("nan"), 3.0, 5.0, 5.0, 1.0, 1.0]
    series = pd.Series(values)
    assert rows.idx_max(values) == series.idxmax() == 2
    assert rows.idx_min(values) == series.idxmin() == 4


def test_groups_come_in_key_order_with_missing_keys_last(awkward: Path) -> None:
    frame = Frame.from_arrow(pq.ParquetFile(awkward).read())
    theirs = pd.read_parquet(awkward)
    keys = ["machine", "workers"]
    mine = [(k, [r["peak_rss_bytes"] for r in g]) for k, g in frame.group_by(keys)]
    expected = [(tuple(None if isinstance(v, float) and math.isnan(v) else v for v in k),
                 list(g["peak_rss_bytes"]))
                for k, g in theirs.groupby(keys, sort=True, dropna=False)]
    assert [k for k, _ in mine] == [k for k, _ in expected] == [
        ("a", 1), ("a", 2), ("b", 2), (None, 1)]
    for (_, a), (_, b) in zip(mine, expected, strict=True):
        assert all(same(x, y) for x, y in zip(a, b, strict=True))
    unsorted = [k for k, _ in frame.group_by(["machine"], sort=False)]
    assert unsorted == [("b",), ("a",), (None,)]  # first appearance, as sort=False


def test_sort_by_puts_missing_values_last_and_keeps_ties_in_order(awkward: Path) -> None:
    frame = Frame.from_arrow(pq.ParquetFile(awkward).read())
    theirs = pd.read_parquet(awkward)
    for keys in (["machine", "workers", "repeat"], ["repeat"], ["units_per_s"]):
        expected = theirs.sort_values(keys, na_position="last", kind="stable")
        assert_same_records(frame.sort_by(keys).records(), expected.to_dict("records"))


def test_records_get_the_column_types_a_pandas_frame_of_them_has() -> None:
    records = [
        {"workers": 1, "vcpus": 2, "method": "IQR", "flag": True, "peaks": [1.0], "n": 1},
        {"workers": None, "vcpus": 4, "method": None, "flag": None, "peaks": [], "n": 2.5},
    ]
    columns = ["workers", "vcpus", "method", "flag", "peaks", "n", "absent"]
    frame = frame_from_records(records, columns)
    expected = pd.DataFrame(records, columns=columns).to_dict("records")
    assert_same_records(frame.records(), expected)
    assert frame.rows[0]["workers"] == 1.0 and isinstance(frame.rows[0]["workers"], float)


def test_a_numeric_arrow_column_reads_as_floats_with_nulls_as_nan() -> None:
    ints = pa.chunked_array([pa.array([1, None, 3], pa.int64()),
                             pa.array([None, 5, 6, 7], pa.int32()).cast(pa.int64())])
    floats = pa.array([0.5, None, float("nan"), 2.0, 9.0], pa.float64()).slice(1, 3)
    small = pa.array([1, 2, None], pa.uint8())
    for column in (ints, floats, small, pa.nulls(2), pa.array([True, None], pa.bool_())):
        got = rows.float_array(column)
        want = np.asarray(column.to_numpy(zero_copy_only=False)
                          if not isinstance(column, pa.ChunkedArray) else column.to_numpy(),
                          dtype=float)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, want)  # NaN where null, in both


def test_a_notebooks_pandas_frames_give_the_same_summary(two_runs_store: Path) -> None:
    from orchestrator.results import report

    run = report.load_run(two_runs_store)
    from_pandas = report.summarise(pd.read_parquet(two_runs_store / "trials.parquet")
                                   .assign(ran_on=lambda f: f["ran_on"].fillna(f["machine"])))
    assert_same_records(from_pandas.records(), report.summarise(run.trials).records())
    assert isinstance(report.summarise(run.trials).to_pandas(), pd.DataFrame)


@pytest.fixture
def two_runs_store(tmp_path: Path) -> Path:
    """A small store of two machines and repeats, one failed trial, written as the store does."""
    from orchestrator.results.store import TRIALS_FILE

    records = []
    for machine, price, rates in (("n2-highcpu-8", 0.29, {1: [100, 110], 2: [190, 180, 200]}),
                                  ("e2-standard-4", 0.13, {1: [90], 2: [150, 160]})):
        for workers, values in rates.items():
            for repeat, ups in enumerate(values):
                records.append({
                    "trial_id": f"{machine}-w{workers}-r{repeat}", "machine": machine,
                    "ran_on": machine, "workers": workers, "repeat": repeat, "vcpus": 8,
                    "units_per_s": float(ups), "units_per_s_per_vcpu": ups / 8,
                    "efficiency": float("nan"), "peak_rss_bytes": 2**20 * (workers + repeat),
                    "cpu_utilisation": 0.5, "leak_verdict": "ok", "price_per_hour": price,
                    "cost_per_million_units": price / (ups * 3600) * 1e6,
                    "oversubscribed": False, "status": "ok", "error": None,
                })  # fmt: skip
    records[-1]["status"], records[-1]["error"] = "failed", "boom"
    tmp_path.joinpath("run").mkdir()
    pd.DataFrame(records).to_parquet(tmp_path / "run" / TRIALS_FILE)
    return tmp_path / "run"
