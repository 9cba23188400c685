"""The cube workload's inputs: generated deterministically, cached by content, loaded lazily.

The article's inputs are N frames of R×C random floats rounded to 10 decimals.
We generate them from a seed so that every VM of a sweep (and every re-run)
works on the same bytes, and cache them by the hash of their spec so the
default 800 MB set is written once per machine.

A cube only ever looks at the first ``dim`` rows of each frame, so Parquet files
are written with a small leading row group (100 rows, then the rest) and
:func:`load_rows` reads only the row groups that cover those rows — about a
tenth of each default file. Pages carry CRC checksums so that a flipped byte is
an error rather than a silently wrong cube.

Our files are plain: required doubles, PLAIN encoding, no compression, one page
per column chunk. Decoding 1000 tiny column chunks through a Parquet reader
costs far more than the bytes themselves, so the manifest also records where
each row group's values sit (its byte range, CRC-32 and page-header sizes).
The loader then reads a row group with one read, checks its CRC and slices the
values out with numpy. That index is verified against the data when written;
files without it (a user's own frames) go through pyarrow.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workloads import limits
from workloads.atomic import atomic_directory, atomic_write_text
from workloads.base import WorkloadInputError

if TYPE_CHECKING:
    import numpy as np

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = "cloudprof.inputs/1"
LAYOUT_VERSION = 2
"""Bump when the bytes written for a given spec change, so old caches are not reused."""

FORMATS = ("parquet", "csv")
LAYOUTS = ("rows", "columns")


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """What to generate. Two equal specs always produce the same bytes (same pyarrow)."""

    frames: int = 100
    rows: int = 1000
    cols: int = 1000
    seed: int = 0
    fmt: str = "parquet"
    decimals: int = 10
    row_group_rows: int = 100
    """Rows in the first Parquet row group (the rest of the frame is a second one)."""

    def __post_init__(self) -> None:
        for name in ("frames", "rows", "cols", "row_group_rows"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise WorkloadInputError(
                    f"inputs: {name} must be a positive integer, got {value!r}"
                )
        try:
            for name in limits.INPUT_LIMITS:
                limits.check_input_size(name, getattr(self, name))
            limits.check_input_bytes(self.frames, self.rows, self.cols)
        except ValueError as exc:
            raise WorkloadInputError(f"inputs: {exc}") from None
        if not isinstance(self.seed, int) or self.seed < 0:
            raise WorkloadInputError(
                f"inputs: seed must be a non-negative integer, got {self.seed!r}"
            )
        if not isinstance(self.decimals, int) or not 0 <= self.decimals <= 15:
            raise WorkloadInputError(f"inputs: decimals must be 0..15, got {self.decimals!r}")
        if self.fmt not in FORMATS:
            raise WorkloadInputError(
                f"inputs: format must be one of {', '.join(FORMATS)}, got {self.fmt!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def hash(self) -> str:
        """Content address of the inputs: the spec plus the on-disk layout version."""
        blob = json.dumps({**self.to_dict(), "layout": LAYOUT_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def file_name(self, index: int) -> str:
        return f"frame_{index:04d}.{self.fmt}"

    @property
    def nbytes(self) -> int:
        """Size of all frames in memory as float64."""
        return self.frames * self.rows * self.cols * 8


def column_names(cols: int) -> list[str]:
    """The article's DataFrames had integer column labels; as strings, "0".."cols-1"."""
    return [str(c) for c in range(cols)]


def frame_columns(spec: InputSpec, index: int) -> np.ndarray:
    """Frame ``index`` as a (cols, rows) array: row c is column c of the frame.

    Each frame has its own seed (spawned from ``spec.seed``) so frames can be
    generated in parallel and in any order with the same result.
    """
    import numpy as np

    seq = np.random.SeedSequence(spec.seed, spawn_key=(index,))
    values = np.random.Generator(np.random.PCG64(seq)).random((spec.cols, spec.rows))
    return np.round(values, spec.decimals, out=values)


def row_group_bounds(rows: int, first: int) -> list[tuple[int, int]]:
    """A leading row group of ``first`` rows, then one with the rest.

    Only two: every row group multiplies the column chunks (1000 per group by
    default), and readers of whole files pay for each one.
    """
    return [(0, rows)] if rows <= first else [(0, first), (first, rows)]


def _encode(spec: InputSpec, columns: np.ndarray) -> bytes:
    import pyarrow as pa

    schema = pa.schema([pa.field(n, pa.float64(), nullable=False) for n in column_names(spec.cols)])
    from workloads.arrow import from_numpy

    table = pa.Table.from_arrays([from_numpy(c, pa.float64()) for c in columns], schema=schema)
    sink = pa.BufferOutputStream()
    if spec.fmt == "csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, sink)
    else:
        import pyarrow.parquet as pq

        with pq.ParquetWriter(
            sink,
            table.schema,
            compression="none",  # random doubles do not compress; decoding is faster without
            use_dictionary=False,
            write_statistics=False,
            write_page_checksum=True,
        ) as writer:
            for start, stop in row_group_bounds(spec.rows, spec.row_group_rows):
                writer.write_table(table.slice(start, stop - start), row_group_size=stop - start)
    return sink.getvalue().to_pybytes()


def _slice_values(buf: bytes, headers: np.ndarray, group_rows: int, take: int) -> np.ndarray:
    """The first ``take`` rows of a row group's bytes, as a (cols, take) float64 array.

    Column chunk c is ``headers[c]`` bytes of page header, then ``group_rows``
    little-endian doubles; chunks follow each other. Dropping the header bytes
    (a boolean mask built from a few thousand indices) leaves the values of all
    columns back to back, in column order.
    """
    import numpy as np

    raw = np.frombuffer(buf, dtype=np.uint8)
    lengths = headers.astype(np.int64)
    chunk_starts = np.arange(len(headers), dtype=np.int64) * (group_rows * 8)
    chunk_starts += np.cumsum(lengths) - lengths
    # Positions of every header byte: each chunk's start, plus 0..headers[c]-1.
    first_of_each = np.repeat(chunk_starts - (np.cumsum(lengths) - lengths), lengths)
    keep = np.ones(raw.size, dtype=bool)
    keep[first_of_each + np.arange(int(lengths.sum()))] = False
    values = raw[keep].view("<f8").reshape(len(headers), group_rows)
    return values[:, :take].astype(np.float64)


def _row_group_index(data: bytes, columns: np.ndarray) -> list[dict[str, Any]] | None:
    """Where each row group's values are in ``data``; None unless slicing them reproduces
    ``columns`` exactly (so the loader's shortcut is proven on every file it applies to)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    md = pq.read_metadata(pa.BufferReader(data))
    groups, first_row = [], 0
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        start = pos = rg.column(0).data_page_offset
        headers = []
        for c in range(rg.num_columns):
            chunk = rg.column(c)
            header = chunk.total_compressed_size - rg.num_rows * 8
            if chunk.data_page_offset != pos or chunk.has_dictionary_page or not 0 < header < 256:
                return None
            headers.append(header)
            pos += chunk.total_compressed_size
        head = np.frombuffer(bytes(headers), dtype=np.uint8)
        values = _slice_values(data[start:pos], head, rg.num_rows, rg.num_rows)
        if not np.array_equal(values, columns[:, first_row : first_row + rg.num_rows]):
            return None
        groups.append(
            {
                "rows": [first_row, first_row + rg.num_rows],
                "offset": start,
                "length": pos - start,
                "crc32": zlib.crc32(data[start:pos]),
                "headers": base64.b64encode(bytes(headers)).decode(),
            }
        )
        first_row += rg.num_rows
    return groups


def _write_frame(spec: InputSpec, directory: Path, index: int) -> dict[str, Any]:
    columns = frame_columns(spec, index)
    data = _encode(spec, columns)
    name = spec.file_name(index)
    (directory / name).write_bytes(data)
    entry = {"name": name, "bytes": len(data), "md5": hashlib.md5(data).hexdigest()}
    if spec.fmt == "parquet":
        entry["row_groups"] = _row_group_index(data, columns)
    return entry


def _read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def is_complete(directory: str | os.PathLike[str], spec: InputSpec) -> bool:
    """True if ``directory`` holds exactly ``spec``'s inputs (manifest matches, files sized right).

    Checks sizes, not checksums: cheap enough to run before every trial.
    """
    directory = Path(directory)
    manifest = _read_manifest(directory)
    if not manifest or manifest.get("spec_hash") != spec.hash:
        return False
    try:
        return (
            all((directory / f["name"]).stat().st_size == f["bytes"] for f in manifest["files"])
            and len(manifest["files"]) == spec.frames
        )
    except (OSError, KeyError, TypeError):
        return False


def _threads(n: int) -> int:
    return max(1, min(n, os.cpu_count() or 1, 16))


def generate(spec: InputSpec, directory: str | os.PathLike[str],
             on_frame: Callable[[int], None] | None = None) -> Path:
    """Write ``spec``'s frames and manifest into ``directory``; a no-op if they are already there.

    The manifest is written last (atomically), so a directory whose generation was
    interrupted never looks complete. ``on_frame`` is called with the number of frames
    written so far after each one (from the writer threads), for a progress display.
    """
    directory = Path(directory)
    if is_complete(directory, spec):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST).unlink(missing_ok=True)
    written = [0]
    lock = threading.Lock()

    def write(i: int) -> dict[str, Any]:
        entry = _write_frame(spec, directory, i)
        if on_frame is not None:
            with lock:
                written[0] += 1
                on_frame(written[0])
        return entry

    with ThreadPoolExecutor(_threads(spec.frames)) as pool:
        files = list(pool.map(write, range(spec.frames)))
    content = hashlib.sha256("".join(f"{f['name']}:{f['md5']}\n" for f in files).encode())
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "spec": spec.to_dict(),
        "spec_hash": spec.hash,
        "layout": LAYOUT_VERSION,
        "shape": [spec.frames, spec.rows, spec.cols],
        "dtype": "float64",
        "seed": spec.seed,
        "format": spec.fmt,
        "row_groups": row_group_bounds(spec.rows, spec.row_group_rows)
        if spec.fmt == "parquet"
        else None,
        "content_hash": content.hexdigest(),
        "files": files,
    }
    atomic_write_text(directory / MANIFEST, json.dumps(manifest, indent=1))
    return directory


def default_cache_dir() -> Path:
    """``$CLOUDPROF_CACHE`` if set, else ``~/.cache/cloudprof/inputs``."""
    env = os.environ.get("CLOUDPROF_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "cloudprof" / "inputs"


def ensure_inputs(spec: InputSpec, cache_dir: str | os.PathLike[str] | None = None,
                  on_frame: Callable[[int], None] | None = None) -> Path:
    """``<cache>/<spec hash>/``, generated on first use and reused afterwards.

    Generation happens in a temporary sibling directory renamed into place, so a
    crash or Ctrl-C mid-way leaves no directory that looks complete, and two
    processes racing on the same spec both end up with one valid copy.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = cache / spec.hash
    if is_complete(final, spec):
        return final
    with atomic_directory(final, lambda d: is_complete(d, spec)) as tmp:
        generate(spec, tmp, on_frame)
    return final


# ---------------------------------------------------------------- loading


@dataclasses.dataclass(frozen=True)
class FrameFile:
    path: Path
    expected_bytes: int | None  # from the manifest, when there is one
    row_groups: list[dict[str, Any]] | None = None  # the manifest's value index
    shape: tuple[int, int] | None = None  # (rows, cols) from the manifest


def frame_files(directory: str | os.PathLike[str]) -> tuple[list[FrameFile], str]:
    """The frame files of an inputs directory, in order, and their format.

    A directory with a manifest lists its files; one without (a user's own
    frames) is every ``*.parquet`` — or else every ``*.csv`` — sorted by name.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise WorkloadInputError(f"inputs: {directory} is not a directory")
    manifest = _read_manifest(directory)
    if manifest is None and (directory / MANIFEST).exists():
        raise WorkloadInputError(f"inputs: {directory / MANIFEST} is not valid JSON")
    if manifest is not None:
        try:
            shape = (int(manifest["shape"][1]), int(manifest["shape"][2]))
            files = [
                FrameFile(directory / f["name"], int(f["bytes"]), f.get("row_groups"), shape)
                for f in manifest["files"]
            ]
            fmt = str(manifest["format"])
        except (KeyError, TypeError, ValueError) as exc:
            raise WorkloadInputError(f"inputs: {directory / MANIFEST} lacks {exc}") from exc
    else:
        fmt = "parquet" if any(directory.glob("*.parquet")) else "csv"
        files = [FrameFile(p, None) for p in sorted(directory.glob(f"*.{fmt}"))]
    if fmt not in FORMATS:
        raise WorkloadInputError(f"inputs: unknown format {fmt!r} in {directory / MANIFEST}")
    if not files:
        raise WorkloadInputError(f"inputs: no .parquet or .csv frames in {directory}")
    for f in files:
        try:
            size = f.path.stat().st_size
        except FileNotFoundError:
            raise WorkloadInputError(f"inputs: missing file {f.path}") from None
        if f.expected_bytes is not None and size != f.expected_bytes:
            raise WorkloadInputError(
                f"inputs: {f.path} is truncated or modified ({size} bytes, manifest says "
                f"{f.expected_bytes})"
            )
    return files, fmt


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Turn whatever pyarrow raises on a bad file into a one-line error naming the file."""
    import pyarrow as pa

    try:
        yield
    except WorkloadInputError:
        raise
    except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WorkloadInputError(f"inputs: cannot read {path}: {first}") from exc


def _check_double(path: Path, schema: Any) -> None:
    import pyarrow as pa

    for field in schema:
        if not pa.types.is_floating(field.type):
            raise WorkloadInputError(
                f"inputs: {path}: column {field.name!r} is {field.type}, expected double"
            )


def _to_columns(path: Path, table: Any) -> np.ndarray:
    """A pyarrow table of doubles as a (cols, rows) array, its natural column-major form."""
    import numpy as np

    _check_double(path, table.schema)
    if table.num_rows == 0:
        return np.empty((table.num_columns, 0))
    batch = table.combine_chunks().to_batches()[0]
    return np.asarray(batch.to_tensor(row_major=False), dtype=np.float64).T


class _Reader:
    """Reads one frame file: its shape cheaply, then its first rows or all of it."""

    def __init__(self, frame: FrameFile, fmt: str) -> None:
        path = frame.path
        self.path, self.fmt = path, fmt
        self._pf: Any = None
        self._groups = frame.row_groups if fmt == "parquet" else None
        self.rows: int | None = None
        self.cols = 0
        with _reading(path):
            if self._groups and frame.shape:
                # Our own file, indexed by the manifest: no footer to parse.
                self.rows, self.cols = frame.shape
            elif fmt == "parquet":
                import pyarrow.parquet as pq

                self._pf = pq.ParquetFile(path, page_checksum_verification=True)
                md = self._pf.metadata
                self.rows = md.num_rows
                self.cols = md.num_columns
                _check_double(path, self._pf.schema_arrow)
            else:
                import pyarrow.csv as pcsv

                with open(path, "rb") as fh:
                    header = next(
                        pcsv.open_csv(fh, read_options=pcsv.ReadOptions(block_size=1 << 16))
                    )
                self.rows = None  # unknown without reading it all
                self.cols = header.num_columns

    def read(self, nrows: int | None) -> np.ndarray:
        """The first ``nrows`` rows (all if None), as (cols, nrows)."""
        with _reading(self.path):
            if self._groups:
                return self._read_indexed(nrows)
            if self.fmt == "parquet":
                return self._read_parquet(nrows)
            return self._read_csv(nrows)

    def _read_indexed(self, nrows: int | None) -> np.ndarray:
        """One read per needed row group, its CRC checked, values sliced out (see module doc)."""
        import numpy as np

        want = self.rows if nrows is None else nrows
        parts = []
        with open(self.path, "rb") as fh:
            for group in self._groups or ():
                first, last = group["rows"]
                if first >= want:
                    break
                fh.seek(group["offset"])
                data = fh.read(group["length"])
                if len(data) != group["length"] or zlib.crc32(data) != group["crc32"]:
                    raise WorkloadInputError(
                        f"inputs: cannot read {self.path}: checksum mismatch in rows "
                        f"{first}..{last - 1} (corrupt file)"
                    )
                headers = np.frombuffer(base64.b64decode(group["headers"]), dtype=np.uint8)
                take = min(last, want) - first
                parts.append(_slice_values(data, headers, last - first, take))
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

    def _read_parquet(self, nrows: int | None) -> np.ndarray:
        md = self._pf.metadata
        groups, covered = [], 0
        for i in range(md.num_row_groups):
            if nrows is not None and covered >= nrows:
                break
            groups.append(i)
            covered += md.row_group(i).num_rows
        table = self._pf.read_row_groups(groups, use_threads=False)
        if nrows is not None:
            table = table.slice(0, nrows)
        return _to_columns(self.path, table)

    def _read_csv(self, nrows: int | None) -> np.ndarray:
        import pyarrow as pa
        import pyarrow.csv as pcsv

        opts = pcsv.ReadOptions(use_threads=False, block_size=1 << 20)
        if nrows is None:
            return _to_columns(self.path, pcsv.read_csv(self.path, read_options=opts))
        batches, got = [], 0
        with pcsv.open_csv(self.path, read_options=opts) as reader:
            for batch in reader:
                batches.append(batch)
                got += batch.num_rows
                if got >= nrows:
                    break
        table = pa.Table.from_batches(batches) if batches else None
        if table is None or table.num_rows < nrows:
            have = 0 if table is None else table.num_rows
            raise WorkloadInputError(f"inputs: {self.path} has {have} rows, need {nrows}")
        return _to_columns(self.path, table.slice(0, nrows))


def _open_all(directory: str | os.PathLike[str], index: bool = True) -> list[_Reader]:
    files, fmt = frame_files(directory)
    if not index:
        files = [dataclasses.replace(f, row_groups=None) for f in files]
    with ThreadPoolExecutor(_threads(len(files))) as pool:
        readers = list(pool.map(lambda f: _Reader(f, fmt), files))
    first = readers[0]
    for r in readers[1:]:
        if r.cols != first.cols or (r.rows is not None and r.rows != first.rows):
            raise WorkloadInputError(
                f"inputs: {r.path} is {r.rows}x{r.cols} (rows x cols) "
                f"but {first.path} is {first.rows}x{first.cols}"
            )
    return readers


def check_inputs(directory: str | os.PathLike[str], dim: int | None = None) -> tuple[int, int]:
    """Refuse a directory that holds no valid frames, reading only their headers.

    What the cube workload's ``prepare`` would refuse on the VM, checked where
    the inputs are (before a sweep stages them): frames present, readable, of
    doubles, all of one width, and at least ``dim`` rows and columns where known.
    Returns (frames, columns).
    """
    readers = _open_all(directory, index=False)
    first = readers[0]
    if dim is not None:
        for axis, size in (("rows", first.rows), ("columns", first.cols)):
            if size is not None and dim > size:
                raise WorkloadInputError(
                    f"cube: dim {dim} exceeds the {size} {axis} of {directory}"
                )
    return len(readers), first.cols


def _load(
    directory: str | os.PathLike[str],
    nrows: int | None,
    alloc: Callable[[int, int, int], np.ndarray],
    store: Callable[[np.ndarray, int, np.ndarray], None],
    index: bool = True,
) -> np.ndarray:
    readers = _open_all(directory, index)
    first = readers[0]
    if nrows is not None and first.rows is not None and nrows > first.rows:
        raise WorkloadInputError(
            f"inputs: dim {nrows} exceeds the {first.rows} rows of {first.path}"
        )
    # The first frame fixes the shape (CSV row counts are only known once read).
    block0 = first.read(nrows)
    shape = block0.shape
    out = alloc(len(readers), shape[1], shape[0])
    store(out, 0, block0)

    def one(index: int) -> None:
        block = readers[index].read(nrows)
        if block.shape != shape:
            raise WorkloadInputError(
                f"inputs: {readers[index].path} is {block.shape[1]}x{block.shape[0]} "
                f"but {first.path} is {shape[1]}x{shape[0]}"
            )
        store(out, index, block)

    with ThreadPoolExecutor(_threads(len(readers))) as pool:
        list(pool.map(one, range(1, len(readers))))
    return out


def load_rows(
    directory: str | os.PathLike[str], dim: int, *, layout: str = "rows", index: bool = True
) -> np.ndarray:
    """The first ``dim`` rows of every frame, as an array of shape (frames, dim, cols).

    Reads only the row groups covering those rows. ``layout`` picks the memory
    order behind that shape: ``"rows"`` is C-contiguous; ``"columns"`` is a view
    of a C-contiguous (cols, frames, dim) array, where one column of all frames
    is a single contiguous run — the layout the ``fast`` cube strategy gathers
    from. Both compare equal. ``index=False`` ignores the manifest's value index
    and decodes through pyarrow (for comparison; the result is the same).
    """
    import numpy as np

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}")
    if dim < 1:
        raise WorkloadInputError(f"inputs: dim must be positive, got {dim}")
    if layout == "columns":

        def alloc(frames: int, rows: int, cols: int) -> np.ndarray:
            return np.empty((cols, frames, rows))

        def store(out: np.ndarray, f: int, block: np.ndarray) -> None:
            out[:, f, :] = block

        return _load(directory, dim, alloc, store, index).transpose(1, 2, 0)

    def alloc_rows(frames: int, rows: int, cols: int) -> np.ndarray:
        return np.empty((frames, rows, cols))

    def store_rows(out: np.ndarray, f: int, block: np.ndarray) -> None:
        out[f] = block.T

    return _load(directory, dim, alloc_rows, store_rows, index)


def load_frames(directory: str | os.PathLike[str]) -> np.ndarray:
    """Every frame whole, as a (frames, rows, cols) array: the article's ``arr_data``."""
    import numpy as np

    def alloc(frames: int, rows: int, cols: int) -> np.ndarray:
        return np.empty((frames, rows, cols))

    def store(out: np.ndarray, f: int, block: np.ndarray) -> None:
        out[f] = block.T

    return _load(directory, None, alloc, store)


def read_frame_pandas(path: str | os.PathLike[str]) -> Any:
    """One frame read whole with pandas, as the article did (``read_parquet``/``read_csv``)."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise WorkloadInputError(f"inputs: missing file {path}")
    with _reading(path):
        if path.suffix == ".csv":
            return pd.read_csv(path)
        return pd.read_parquet(path)


def frame_paths(directory: str | os.PathLike[str]) -> Sequence[Path]:
    """Paths of the frames, validated (present, sizes as in the manifest)."""
    return [f.path for f in frame_files(directory)[0]]
