"""A small table of rows for the report: what it needed pandas for, on pyarrow and plain Python.

The report reads a few dozen trials and reduces them per machine and worker count; pandas'
import (0.5-0.7 s on a 2-core host) was the largest piece of a sweep's own overhead and of
``cloudprof report``'s wall, and the report used a handful of its operations. A
:class:`Frame` is a list of rows (one dict per row) with exactly those operations: filter,
group by keys in sorted order, sort with missing values last, and the column reductions
below, which skip missing values as pandas' do.

Values are the ones pandas gave the report, so every figure and every string is unchanged:
:meth:`Frame.from_arrow` converts each column by the rule ``read_parquet`` follows (an
integer column with a null is float with NaN, a string column's null is NaN, a boolean
column with a null holds ``None``), and :func:`frame_from_records` infers a column's type
from its values as ``pandas.DataFrame(records)`` does (an ``int`` column with a ``None``
becomes float). ``to_pandas`` converts at the notebook's boundary, importing pandas there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

Row = dict[str, Any]


def missing(value: Any) -> bool:
    """None or NaN: what pandas' ``isna`` calls missing in the report's columns."""
    return value is None or (isinstance(value, float) and value != value)


def number(value: Any) -> float:
    """``pd.to_numeric(errors="coerce")`` then ``float``: NaN for what is not a number."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    if hasattr(value, "item"):  # a numpy scalar
        return number(value.item())
    return math.nan


def numbers(values: Iterable[Any]) -> list[float]:
    return [number(v) for v in values]


def known(values: Iterable[Any]) -> list[Any]:
    """The values that are not missing (``dropna``), in order."""
    return [v for v in values if not missing(v)]


def median(values: Iterable[float]) -> float:
    """The median of the numbers that are not NaN (pandas' ``median``); NaN when none is."""
    data = sorted(v for v in values if v == v)
    n = len(data)
    if not n:
        return math.nan
    mid = n // 2
    return data[mid] if n % 2 else (data[mid - 1] + data[mid]) / 2


def nanmax(values: Iterable[float]) -> float:
    """The largest number that is not NaN (pandas' ``max``); NaN when none is."""
    data = [v for v in values if v == v]
    return max(data) if data else math.nan


def nanmin(values: Iterable[float]) -> float:
    """The smallest number that is not NaN (pandas' ``min``); NaN when none is."""
    data = [v for v in values if v == v]
    return min(data) if data else math.nan


def first(values: Iterable[Any]) -> Any:
    """The first value that is not missing (pandas' groupby ``first``); NaN when none is."""
    return next((v for v in values if not missing(v)), math.nan)


def idx_max(values: Sequence[float]) -> int:
    """Position of the first largest number that is not NaN (``idxmax``; 0 when all are NaN,
    where pandas raises)."""
    best = -1
    for i, v in enumerate(values):
        if v == v and (best < 0 or v > values[best]):
            best = i
    return max(best, 0)


def idx_min(values: Sequence[float]) -> int:
    """Position of the first smallest number that is not NaN (``idxmin``; see ``idx_max``)."""
    best = -1
    for i, v in enumerate(values):
        if v == v and (best < 0 or v < values[best]):
            best = i
    return max(best, 0)


def _sort_key(value: Any) -> tuple[bool, Any]:
    """Missing values after every other (pandas' ``na_position="last"``)."""
    return (True, 0) if missing(value) else (False, value)


class Frame:
    """Rows (dicts with the same keys, ``columns``) and the few operations the report uses.

    Operations return new frames that share the row dicts: treat rows as read-only, and
    add a column with :meth:`with_column`.
    """

    __slots__ = ("columns", "rows")

    def __init__(self, rows: list[Row], columns: Sequence[str]) -> None:
        self.rows = rows
        self.columns = list(columns)

    @classmethod
    def from_arrow(cls, table: pa.Table) -> Frame:
        """The table's rows with the values ``read_parquet`` gives (see the module docstring)."""
        from orchestrator.results.store import _kind_of_column

        names = list(table.column_names)
        data: list[list[Any]] = []
        for name in names:
            column = table.column(name)
            kind = _kind_of_column(column)
            values = column.to_pylist()
            if kind == "float64":
                values = [math.nan if v is None else float(v) for v in values]
            elif kind == "str":
                values = [math.nan if v is None else v for v in values]
            data.append(values)
        rows = [dict(zip(names, values, strict=True)) for values in zip(*data, strict=True)]
        return cls(rows, names)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def __contains__(self, name: object) -> bool:
        return name in self.columns

    @property
    def empty(self) -> bool:
        return not self.rows

    def column(self, name: str) -> list[Any]:
        """The values of one column, in row order (KeyError for an unknown column)."""
        if name not in self.columns:
            raise KeyError(name)
        return [r[name] for r in self.rows]

    def __getitem__(self, name: str) -> list[Any]:
        return self.column(name)

    def get(self, name: str, default: Any = None) -> Any:
        """A column's values, or ``default`` without it (pandas' ``frame.get``)."""
        return self.column(name) if name in self.columns else default

    def numbers(self, name: str) -> list[float]:
        """A column as floats, NaN where missing or not a number; all NaN without it."""
        if name not in self.columns:
            return [math.nan] * len(self.rows)
        return [number(r[name]) for r in self.rows]

    def where(self, keep: Callable[[Row], bool]) -> Frame:
        return Frame([r for r in self.rows if keep(r)], self.columns)

    def with_column(self, name: str, values: Iterable[Any]) -> Frame:
        """A copy with column ``name`` set (added last, or replaced in place)."""
        rows = [{**r, name: v} for r, v in zip(self.rows, values, strict=True)]
        columns = self.columns if name in self.columns else [*self.columns, name]
        return Frame(rows, columns)

    def sort_by(self, keys: Sequence[str]) -> Frame:
        """Sorted by ``keys`` (stable), missing values last in each key."""
        return Frame(sorted(self.rows, key=lambda r: tuple(_sort_key(r[k]) for k in keys)),
                     self.columns)

    def group_by(self, keys: Sequence[str], sort: bool = True) -> list[tuple[tuple[Any, ...],
                                                                             Frame]]:
        """(key values, rows) per distinct key, rows in their order; groups sorted by key
        (missing last) or, with ``sort=False``, in order of first appearance. Missing keys
        form a group of their own (pandas' ``dropna=False``)."""
        groups: dict[tuple[Any, ...], list[Row]] = {}
        for r in self.rows:
            key = tuple(None if missing(r[k]) else r[k] for k in keys)
            groups.setdefault(key, []).append(r)
        items = list(groups.items())
        if sort:
            items.sort(key=lambda kv: tuple(_sort_key(v) for v in kv[0]))
        return [(key, Frame(rows, self.columns)) for key, rows in items]

    def records(self) -> list[Row]:
        """The rows as dicts (copies), like ``to_dict("records")``."""
        return [dict(r) for r in self.rows]

    def to_pandas(self) -> pd.DataFrame:
        """The same table as a pandas frame (for a notebook; imports pandas)."""
        import pandas as pd

        return pd.DataFrame({c: [r[c] for r in self.rows] for c in self.columns},
                            columns=self.columns)

    def __repr__(self) -> str:
        return f"Frame({len(self.rows)} rows × {len(self.columns)} columns)"


def as_frame(table: Frame | pd.DataFrame) -> Frame:
    """``table`` as a :class:`Frame`: a pandas frame (a notebook's) is converted by its
    records, whose values are the ones :meth:`Frame.from_arrow` gives a stored table."""
    if isinstance(table, Frame):
        return table
    return Frame(table.to_dict("records"), [str(c) for c in table.columns])


def float_array(column: pa.ChunkedArray | pa.Array) -> Any:
    """A numeric Arrow column as a float64 numpy array, nulls as NaN (what ``read_parquet``
    gives), viewed from its buffers: pyarrow's ``to_numpy`` imports pandas (0.5-0.7 s)."""
    import numpy as np
    import pyarrow as pa

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = []
    for chunk in chunks:
        n, offset, typ = len(chunk), chunk.offset, chunk.type
        fixed = pa.types.is_integer(typ) or pa.types.is_floating(typ)
        if not fixed:  # null, boolean, decimal...: not the time series' columns; the slow way
            parts.append(np.array([math.nan if v is None else float(v)
                                   for v in chunk.to_pylist()], dtype=float))
            continue
        validity, data = chunk.buffers()[:2]
        dtype = np.dtype(f"{'f' if pa.types.is_floating(typ) else 'i'}{typ.bit_width // 8}")
        if pa.types.is_unsigned_integer(typ):
            dtype = np.dtype(f"u{typ.bit_width // 8}")
        values = np.frombuffer(data, dtype=dtype, count=offset + n)[offset:].astype(float)
        if validity is not None and chunk.null_count:
            bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
            values[bits[offset:offset + n] == 0] = math.nan
        parts.append(values)
    return np.concatenate(parts) if parts else np.empty(0, dtype=float)


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        return value.item()  # a numpy scalar
    return value


def _infer(values: list[Any]) -> list[Any]:
    """A column as ``pandas.DataFrame(records)`` holds it: ints with a None or a float are
    floats (missing NaN), strings with a None hold NaN; anything else is kept."""
    present = [v for v in values if not missing(v)]
    if not present or (len(present) == len(values) and all(
            isinstance(v, bool) or not isinstance(v, int | float | str) for v in present)):
        return values
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        if all(isinstance(v, int) for v in values):
            return values
        return [math.nan if missing(v) else float(v) for v in values]
    if all(isinstance(v, str) for v in present):
        return [math.nan if missing(v) else v for v in values]
    return values


def frame_from_records(records: list[Row], columns: Sequence[str]) -> Frame:
    """A frame of ``records`` with ``columns`` (an absent key is NaN), each column's values
    as ``pandas.DataFrame(records, columns=...)`` would hold them (see :func:`_infer`)."""
    data = {c: _infer([_plain(r[c]) if c in r else math.nan for r in records]) for c in columns}
    rows = [{c: data[c][i] for c in columns} for i in range(len(records))]
    return Frame(rows, columns)
