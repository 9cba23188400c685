"""Cube inputs: deterministic generation, the cache, the partial loader, bad files."""

from __future__ import annotations

import hashlib
import json
import shutil
import zlib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from workloads import inputs
from workloads.base import WorkloadInputError
from workloads.inputs import (
    MANIFEST,
    InputSpec,
    default_cache_dir,
    ensure_inputs,
    frame_columns,
    generate,
    is_complete,
    load_frames,
    load_rows,
    row_group_bounds,
)

SMALL = InputSpec(frames=6, rows=40, cols=50, seed=3, row_group_rows=10)


def _mtimes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}


def _one_line_error(excinfo: pytest.ExceptionInfo[WorkloadInputError], *needles: str) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


@pytest.fixture
def small(tmp_path: Path) -> Path:
    return generate(SMALL, tmp_path / "small")


def test_generate_is_deterministic_and_seed_dependent(tmp_path: Path) -> None:
    a = generate(SMALL, tmp_path / "a")
    b = generate(SMALL, tmp_path / "b")
    other = generate(
        InputSpec(frames=6, rows=40, cols=50, seed=4, row_group_rows=10), tmp_path / "c"
    )
    for i in range(SMALL.frames):
        name = SMALL.file_name(i)
        assert (a / name).read_bytes() == (b / name).read_bytes()
        assert (a / name).read_bytes() != (other / name).read_bytes()
    ma, mb, mc = (json.loads((d / MANIFEST).read_text()) for d in (a, b, other))
    assert ma["content_hash"] == mb["content_hash"] != mc["content_hash"]
    assert ma["spec_hash"] == SMALL.hash != mc["spec_hash"]
    assert not np.array_equal(load_frames(a), load_frames(other))


def test_manifest_describes_the_files(small: Path) -> None:
    manifest = json.loads((small / MANIFEST).read_text())
    assert manifest["shape"] == [6, 40, 50]
    assert manifest["dtype"] == "float64"
    assert manifest["seed"] == 3 and manifest["format"] == "parquet"
    assert [f["name"] for f in manifest["files"]] == [SMALL.file_name(i) for i in range(6)]
    for f in manifest["files"]:
        data = (small / f["name"]).read_bytes()
        assert f["bytes"] == len(data)
        assert f["md5"] == hashlib.md5(data).hexdigest()
        # The value index the loader uses instead of a Parquet decoder.
        groups = f["row_groups"]
        assert [g["rows"] for g in groups] == [[0, 10], [10, 40]]
        for g in groups:
            assert g["crc32"] == zlib.crc32(data[g["offset"] : g["offset"] + g["length"]])


def test_values_are_the_articles_rounded_uniforms(small: Path) -> None:
    frames = load_frames(small)
    assert frames.shape == (6, 40, 50) and frames.dtype == np.float64
    assert np.array_equal(frames, np.round(frames, 10))
    assert frames.min() >= 0.0 and frames.max() < 1.0
    assert np.array_equal(frames[2], frame_columns(SMALL, 2).T)
    schema = pq.read_schema(small / SMALL.file_name(0))
    assert schema.names == [str(c) for c in range(50)]


def test_parquet_has_small_leading_row_groups(small: Path) -> None:
    assert row_group_bounds(40, 10) == [(0, 10), (10, 40)]
    assert row_group_bounds(1000, 100) == [(0, 100), (100, 1000)]
    assert row_group_bounds(50, 100) == [(0, 50)]
    md = pq.ParquetFile(small / SMALL.file_name(0)).metadata
    assert [md.row_group(i).num_rows for i in range(md.num_row_groups)] == [10, 30]


def test_regenerating_is_a_noop(small: Path) -> None:
    before = _mtimes(small)
    assert generate(SMALL, small) == small
    assert _mtimes(small) == before


def test_ensure_inputs_generates_once_into_the_cache(tmp_path: Path) -> None:
    first = ensure_inputs(SMALL, tmp_path)
    assert first == tmp_path / SMALL.hash and is_complete(first, SMALL)
    before = _mtimes(first)
    assert ensure_inputs(SMALL, tmp_path) == first
    assert _mtimes(first) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [SMALL.hash]  # no temp dirs left


def test_default_cache_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CLOUDPROF_CACHE", str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache"
    assert ensure_inputs(SMALL).parent == tmp_path / "cache"
    monkeypatch.delenv("CLOUDPROF_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "cloudprof" / "inputs"


def test_interrupted_generation_never_looks_complete(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = inputs._write_frame

    def dies_on_frame_4(spec: InputSpec, directory: Path, index: int) -> dict:
        if index == 4:
            raise KeyboardInterrupt
        return real(spec, directory, index)

    monkeypatch.setattr(inputs, "_write_frame", dies_on_frame_4)
    with pytest.raises(KeyboardInterrupt):
        ensure_inputs(SMALL, tmp_path)
    assert list(tmp_path.iterdir()) == []  # neither a final dir nor a leftover temp dir
    monkeypatch.setattr(inputs, "_write_frame", real)
    assert is_complete(ensure_inputs(SMALL, tmp_path), SMALL)


def test_ensure_inputs_replaces_a_stale_partial_copy(tmp_path: Path) -> None:
    stale = tmp_path / SMALL.hash
    stale.mkdir()
    (stale / SMALL.file_name(0)).write_bytes(b"half a file")
    assert ensure_inputs(SMALL, tmp_path) == stale
    assert is_complete(stale, SMALL)
    assert np.array_equal(load_frames(stale)[0], frame_columns(SMALL, 0).T)


@pytest.mark.parametrize("indexed", [True, False], ids=["manifest-index", "pyarrow"])
@pytest.mark.parametrize("dim", [1, 10, 15, 40])
def test_load_rows_equals_the_first_rows_in_both_layouts(
    small: Path, dim: int, indexed: bool
) -> None:
    expected = np.stack([frame_columns(SMALL, i).T for i in range(SMALL.frames)])
    if not indexed:
        (small / MANIFEST).unlink()
    full = load_frames(small)
    assert np.array_equal(full, expected)
    rows = load_rows(small, dim)
    cols = load_rows(small, dim, layout="columns")
    assert rows.shape == cols.shape == (6, dim, 50)
    assert rows.flags.c_contiguous
    assert cols.transpose(2, 0, 1).flags.c_contiguous  # (cols, frames, dim) underneath
    assert np.array_equal(rows, full[:, :dim]) and np.array_equal(cols, full[:, :dim])
    assert np.array_equal(load_rows(small, dim, index=False), rows)


def _flip_in_row_group(path: Path, group: int) -> None:
    """Overwrite bytes in the middle of the first column chunk of row group ``group``."""
    md = pq.ParquetFile(path).metadata
    chunk = md.row_group(group).column(0)
    middle = chunk.data_page_offset + chunk.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[middle : middle + 4] = bytes(b ^ 0xFF for b in data[middle : middle + 4])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("indexed", [True, False], ids=["manifest-index", "pyarrow"])
def test_load_rows_reads_only_the_leading_row_group(small: Path, indexed: bool) -> None:
    if not indexed:
        (small / MANIFEST).unlink()
    target = small / SMALL.file_name(2)
    _flip_in_row_group(target, 1)  # rows 10..39: not needed for dim <= 10
    assert np.array_equal(load_rows(small, 10)[2], frame_columns(SMALL, 2).T[:10])
    for load in (lambda: load_rows(small, 11), lambda: load_frames(small)):
        with pytest.raises(WorkloadInputError) as excinfo:
            load()
        _one_line_error(excinfo, str(target), "cannot read")


@pytest.mark.parametrize("indexed", [True, False], ids=["manifest-index", "pyarrow"])
def test_corrupt_file_is_an_error_naming_it(small: Path, indexed: bool) -> None:
    if not indexed:
        (small / MANIFEST).unlink()
    target = small / SMALL.file_name(1)
    _flip_in_row_group(target, 0)
    with pytest.raises(WorkloadInputError) as excinfo:
        load_rows(small, 10)
    _one_line_error(excinfo, str(target), "cannot read", "checksum" if indexed else "CRC")


def test_missing_file_is_an_error_naming_it(small: Path) -> None:
    target = small / SMALL.file_name(4)
    target.unlink()
    with pytest.raises(WorkloadInputError) as excinfo:
        load_rows(small, 10)
    _one_line_error(excinfo, "missing file", str(target))


def test_truncated_file_is_an_error_naming_it(small: Path) -> None:
    target = small / SMALL.file_name(3)
    target.write_bytes(target.read_bytes()[:-100])
    with pytest.raises(WorkloadInputError) as excinfo:
        load_rows(small, 10)
    _one_line_error(excinfo, str(target), "truncated")
    # Without a manifest to compare sizes with, the Parquet reader itself notices.
    (small / MANIFEST).unlink()
    with pytest.raises(WorkloadInputError) as excinfo:
        load_rows(small, 10)
    _one_line_error(excinfo, str(target), "cannot read")


def test_frames_of_different_shapes_are_an_error_naming_the_odd_one(
    small: Path, tmp_path: Path
) -> None:
    odd = generate(InputSpec(frames=1, rows=40, cols=51, row_group_rows=10), tmp_path / "odd")
    (small / MANIFEST).unlink()  # a user's own directory of frames
    target = small / SMALL.file_name(5)
    shutil.copyfile(odd / "frame_0000.parquet", target)
    for load in (lambda: load_rows(small, 10), lambda: load_frames(small)):
        with pytest.raises(WorkloadInputError) as excinfo:
            load()
        _one_line_error(excinfo, str(target), "40x51")


def test_dim_larger_than_the_frames_is_an_error(small: Path) -> None:
    with pytest.raises(WorkloadInputError) as excinfo:
        load_rows(small, 41)
    _one_line_error(excinfo, "dim 41", "40 rows")


def test_csv_inputs_hold_the_same_values(tmp_path: Path) -> None:
    spec = InputSpec(frames=3, rows=30, cols=20, seed=9, fmt="csv")
    as_csv = generate(spec, tmp_path / "csv")
    assert sorted(p.suffix for p in as_csv.iterdir() if p.name != MANIFEST) == [".csv"] * 3
    as_parquet = generate(InputSpec(frames=3, rows=30, cols=20, seed=9), tmp_path / "pq")
    assert np.array_equal(load_rows(as_csv, 12), load_rows(as_parquet, 12))
    assert np.array_equal(load_frames(as_csv), load_frames(as_parquet))
    # A truncated CSV without a manifest: too few rows, named.
    (as_csv / MANIFEST).unlink()
    target = as_csv / spec.file_name(1)
    target.write_text("\n".join(target.read_text().splitlines()[:5]) + "\n")
    with pytest.raises(WorkloadInputError) as excinfo:
        load_rows(as_csv, 12)
    _one_line_error(excinfo, str(target), "4 rows")


@pytest.mark.parametrize(
    "kwargs",
    [{"frames": 0}, {"rows": -1}, {"fmt": "xls"}, {"seed": -2}, {"decimals": 99}, {"cols": 2.5}],
)
def test_bad_specs_are_one_line_errors(kwargs: dict) -> None:
    with pytest.raises(WorkloadInputError) as excinfo:
        InputSpec(**kwargs)
    _one_line_error(excinfo, "inputs:")


def test_not_a_directory_and_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(WorkloadInputError) as excinfo:
        load_rows(tmp_path / "nope", 1)
    _one_line_error(excinfo, "not a directory")
    with pytest.raises(WorkloadInputError) as excinfo:
        load_rows(tmp_path, 1)
    _one_line_error(excinfo, "no .parquet or .csv frames")


def test_concurrent_ensure_inputs_agree_on_one_copy(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        dirs = list(pool.map(lambda _: ensure_inputs(SMALL, tmp_path), range(4)))
    assert dirs == [tmp_path / SMALL.hash] * 4
    assert is_complete(dirs[0], SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == [SMALL.hash]
