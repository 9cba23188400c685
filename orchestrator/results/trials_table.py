"""The trials table: its columns, the columns derived from other rows, and how a row joins it.

A record runs between two trials, so the row is merged into the table with pyarrow alone,
following the types pandas' round trip gave each column (see "recording without pandas").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa

TRIAL_COLUMNS = (
    "sweep_id",
    "trial_id",
    "machine",  # the machine type planned (e.g. n2-highcpu-80)
    "ran_on",  # where it really ran: the machine type, or "local" for --dry-run
    "provider",
    "vcpus",  # of the host it ran on
    "memory_gib",
    "workers",
    "repeat",
    "units",
    "seconds",
    "units_per_s",
    "units_per_s_per_vcpu",
    "efficiency",  # units_per_s / (workers * units_per_s at 1 worker, same machine); NaN without
    "peak_rss_bytes",  # the trial process's whole lifetime (load + trial); see peak_phase
    "cpu_utilisation",  # 0..1 of the host's cores
    "leak_verdict",
    "price_per_hour",  # USD, from the catalog at launch (of the planned machine)
    "cost_per_million_units",  # USD; an estimate when ran_on != machine
    "oversubscribed",  # workers > the host's logical cores
    "status",  # ok | failed | memory_budget_exceeded | preempted | interrupted
    "error",
    "started_at",
    "finished_at",
)

# Extra columns after TRIAL_COLUMNS: what a report needs to label and explain a row.
EXTRA_COLUMNS = (
    "unit",  # what one unit is ("cube")
    # "one cube of 100×100×100 float64 (8 MB) delivered as a strided view": what one unit
    # delivered, from the workload's describe() (None when it does not say)
    "unit_detail",
    "spot",  # the price is the spot price
    "cost_is_estimate",  # ran_on != machine: local throughput priced at the planned machine
    "hostname",
    "cpu_model",
    "peak_rss_sampled_bytes",
    "peak_rss_before_trial_bytes",  # imports, input loading, warm-up: before t = 0
    "peak_rss_trial_bytes",  # the trial alone (t >= 0)
    "peak_phase",  # "load" | "trial": which phase holds peak_rss_bytes
    "peak_rss_source",  # vmhwm | ru_maxrss | held | held_cgroup | cgroup-v1 | cgroup-v2 |
    #                     sampled | sampled_tree
    "peak_rss_upper_bound_bytes",  # a tree: the sum of its processes' own peaks
    "load_s",  # seconds the trial process ran before t = 0 (that load phase)
    "cpu_percent_mean",
    "leak_slope_mb_per_s",
    "leak_probability",  # P(RSS still grows at the leak rate at the end), 0..1; None: old runner
    "leak_ramp",  # grew, then levelled off: verdict ok
    "exit_code",  # of the trial runner; None when it never returned
    # A user's job (--command, --grid): see workloads.protocol's "job_kind" and "phases".
    "job_kind",  # None | "throughput" | "fixed_work" (seconds = time to complete one run)
    "cpu_seconds",  # CPU time of the trial (process or tree), user + system
    "phases",  # JSON list of the trial's phases (name, wall_s, cpu_s, peak_rss_bytes...)
    "grid",  # JSON object of the trial's --grid values; "" without a grid
    "peak_gpu_mem_bytes",  # summary's gpu.peak_mem_bytes (NVML or PyTorch); None: no GPU seen
    "gpu_peak_source",  # which of the two (summary's gpu.peak_source)
    # --nodes (scale out on Ray): price_per_hour above is then the price of all the nodes.
    "nodes",  # VMs the trial ran on (1 without --nodes; None in older stores means 1)
    "scaleout_efficiency",  # units_per_s / (nodes * units_per_s at 1 node, same workers)
    "node_peak_rss_bytes",  # JSON list, one peak per node (all its Ray processes), or None
    "node_peak_rss_source",  # JSON list: cgroup-v1 | cgroup-v2 (the node's memory cgroup,
    #                          the kernel's high-water mark) | sampled_tree, per node
    "node_peak_rss_sampled_bytes",  # JSON list: the sampled peak of each node's Ray tree
    "node_units_per_s",  # JSON list, one rate per node, or None
    "node_addresses",  # JSON list: the address each node's actor ran at (as Ray has it), or None
    # A command's tree: peak_rss_bytes is what it holds (anonymous + mapped file pages,
    # counted once; peak_rss_source "held"); the cgroup's usage with page cache beside it.
    "peak_usage_with_cache_bytes",
    "spikes",  # JSON list of the summary's memory spikes ({"t", "rss_bytes", ...}), or None
    # units/s a plain copy of each unit's bytes allows at the trial's workers, on its host
    # (workloads/bound.py); None for a workload without bytes_per_unit and a command job
    "bound_units_per_s",
)
ALL_COLUMNS = TRIAL_COLUMNS + EXTRA_COLUMNS


def _missing(value: Any) -> bool:
    """None, or a float NaN: what pandas' ``isna`` calls missing in these columns."""
    return value is None or (isinstance(value, float) and value != value)


def _key_rows(columns: list[list[Any]]) -> list[tuple[Any, ...]]:
    """Per row, the tuple of its key values with every missing one as None (one group)."""
    return list(zip(*[[None if _missing(v) else v for v in col] for col in columns],
                    strict=True))


def _group_mean(keys: list[tuple[Any, ...]], values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Per row, the mean of ``values`` over the rows of its group (same key tuple) that are
    ``where``; NaN for a group without one (missing values are skipped, as by pandas).

    A record runs this after every trial, between two trials, without pandas: the sum is
    pandas' own ``groupby().mean()`` kernel (a Kahan-compensated sum in row order, then one
    division), so the figures are the ones a multi-key ``groupby`` gives, to the last bit
    (tests/test_store.py checks it).
    """
    import numpy as np

    groups: dict[tuple[Any, ...], int] = {}
    codes = [groups.setdefault(key, len(groups)) for key in keys]
    sums, comps, counts = [0.0] * len(groups), [0.0] * len(groups), [0] * len(groups)
    for code, value, chosen in zip(codes, values.tolist(), where.tolist(), strict=True):
        if not chosen or value != value:
            continue
        y = value - comps[code]
        t = sums[code] + y
        comp = t - sums[code] - y
        comps[code] = 0.0 if comp != comp else comp  # an inf in the sum: as pandas resets it
        sums[code] = t
        counts[code] += 1
    means = np.array([s / n if n else np.nan for s, n in zip(sums, counts, strict=True)]
                     + [np.nan])
    return means[np.array(codes, dtype=np.int64)] if codes else np.array([], dtype=float)


def _derived(ups: np.ndarray, workers: np.ndarray, vcpus: np.ndarray, price: np.ndarray,
             nodes: np.ndarray, ok: np.ndarray, key: Callable[[str], list[Any]]
             ) -> dict[str, np.ndarray]:
    """The columns ``derive`` recomputes, from the others as float arrays (NaN: missing),
    ``ok`` (status is "ok") and ``key(name)``, a key column's values (grid filled, nodes
    integers). One computation for the pandas frame and the Arrow table of a record."""
    import numpy as np

    def baseline(names: list[str], where: np.ndarray) -> np.ndarray:
        return _group_mean(_key_rows([key(n) for n in names]), ups, where)

    with np.errstate(divide="ignore", invalid="ignore"):
        per_vcpu = ups / np.where(vcpus > 0, vcpus, np.nan)
        # Each --grid point and each node count is its own scaling curve over workers.
        base = baseline(["sweep_id", "machine", "ran_on", "grid", "nodes"], ok & (workers == 1))
        eff = np.where(ok & (base > 0), ups / (workers * base), np.nan)
        cost = np.where(ok, price / 3600.0 / np.where(ups > 0, ups, np.nan) * 1e6, np.nan)
        # X(n) / (n · X(1)) at the same workers per node: 1.0 is perfect scale-out.
        base = baseline(["sweep_id", "machine", "ran_on", "grid", "workers"], ok & (nodes == 1))
        scaleout = np.where(ok & (base > 0), ups / (nodes * base), np.nan)
    return {"units_per_s_per_vcpu": per_vcpu, "efficiency": eff,
            "cost_per_million_units": cost, "scaleout_efficiency": scaleout,
            "oversubscribed": workers > vcpus}


def derive(frame: pd.DataFrame) -> pd.DataFrame:
    """Recompute the columns that depend on other rows or on prices.

    Efficiency compares each trial with the mean 1-worker throughput of the same
    sweep, planned machine and real host (``ran_on``), over ok trials only; a
    machine without a 1-worker trial gets NaN. Cost per million units prices the
    measured throughput at the planned machine's hourly price — an estimate when
    the trial ran elsewhere (``cost_is_estimate``).
    """
    import pandas as pd

    out = frame.copy()
    if out.empty:
        return out

    def num(name: str) -> np.ndarray:
        return pd.to_numeric(out[name], errors="coerce").to_numpy(dtype=float)

    out["grid"] = out["grid"].fillna("") if "grid" in out else ""
    out["nodes"] = pd.to_numeric(out["nodes"], errors="coerce").fillna(1).astype(int) \
        if "nodes" in out else 1
    derived = _derived(num("units_per_s"), num("workers"), num("vcpus"), num("price_per_hour"),
                       num("nodes"), (out["status"] == "ok").to_numpy(dtype=bool),
                       lambda name: out[name].tolist())
    for name, values in derived.items():
        out[name] = values
    return out


# -- recording without pandas -------------------------------------------------------
# ``record_trial`` used to append a row with pandas (read, concat, derive, from_pandas,
# write), so each column's type in the file came from pandas' rules: the dtype a column
# read back as, the common dtype of a concat, the Arrow type ``from_pandas`` infers. Those
# rules are followed here on Arrow tables, so the file reads back as it did.

# A column's kind: the pandas dtype a reader gets for it ("object" holds Python values).
_Kind = str


def _kind_of_value(value: Any) -> _Kind:
    """The dtype ``DataFrame([row])`` gives a column holding ``value``."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "str"
    return "object"


def _kind_of_column(column: pa.ChunkedArray) -> _Kind:
    """The dtype ``read_parquet`` gives a column of this Arrow type (nulls make an integer
    column float64 and a boolean one object)."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_int64(kind):
        return "float64" if column.null_count else "int64"
    if pa.types.is_floating(kind):
        return "float64"
    if pa.types.is_boolean(kind):
        return "object" if column.null_count else "bool"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "str"
    return "object"


def _common_kind(old: _Kind, new: _Kind | None) -> _Kind:
    """The dtype ``concat([old, new])`` gives a column; ``new`` None: a column the new row
    lacks (an unknown column of an older file), which pandas fills with missing values."""
    if new is None:
        return {"int64": "float64", "bool": "object"}.get(old, old)
    if old == new:
        return old
    pair = {old, new}
    if "object" in pair or "str" in pair:
        return "object"
    if pair == {"int64", "float64"} or (old, new) == ("float64", "bool"):
        return "float64"
    if pair == {"int64", "bool"}:
        return "int64"
    return "object"  # (bool, float64): as pandas has it


def _as_kind(values: list[Any], kind: _Kind) -> list[Any]:
    """``values`` as a column of ``kind`` holds them (float64: missing is NaN)."""
    if kind == "float64":
        return [math.nan if v is None else float(v) for v in values]
    if kind == "int64":
        return [int(v) for v in values]
    return values


def _arrow_column(values: list[Any], kind: _Kind) -> pa.Array:
    """The Arrow array ``Table.from_pandas`` makes of a column of ``kind`` (NaN is null;
    an object column's type is inferred from its values, as from_pandas does), built from
    its buffers: ``pa.array`` would import pandas (see workloads/arrow.py)."""
    import pyarrow as pa

    from workloads import arrow

    present = [v for v in values if not _missing(v)]
    if kind == "object":  # from_pandas infers the type of a column of Python objects
        if not present:
            return pa.nulls(len(values))
        if all(isinstance(v, bool) for v in present):
            kind = "bool"
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in present):
            kind = "int64"
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
            kind = "float64"
        elif all(isinstance(v, str) for v in present):
            return arrow.strings([None if _missing(v) else v for v in values], pa.string())
        else:  # no row holds such a mix: pyarrow's own inference (which imports pandas)
            import numpy as np

            return pa.array(np.array(values, dtype=object), from_pandas=True)
    nullable = [None if _missing(v) else v for v in values]
    if kind == "str":
        return arrow.strings(nullable, pa.large_string())
    if kind == "bool":
        return arrow.booleans(nullable)
    return arrow.nullable(nullable, pa.float64() if kind == "float64" else pa.int64())


# -- many rows at once ---------------------------------------------------------------
# Compacting a sweep's parts merges thousands of rows. Appending them one at a time
# (read the table, concat, derive, write) would cost O(rows) each; ``_merged`` gives the
# same table, to the type of every column, in one pass: it keeps each column's values
# as they read back from the file (its "read kind") and, per row, follows the one step
# the row changes; only a step that changes a column's type (a few per column and
# sweep) takes the whole column through Arrow, as writing the file would.

_DERIVED = ("units_per_s_per_vcpu", "efficiency", "cost_per_million_units",
            "scaleout_efficiency", "oversubscribed")


def _class_of(value: Any) -> str:
    """What ``_arrow_column`` sees of a value when it infers an object column's type."""
    if _missing(value):
        return "missing"
    for name, kind in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if isinstance(value, kind):
            return name
    return "other"


def _inferred(counts: dict[str, int]) -> _Kind | None:
    """The read kind of an object column with these value classes (None: not followed
    here, the column goes through Arrow)."""
    present = {c for c, k in counts.items() if k and c != "missing"}
    nulls = bool(counts.get("missing"))
    if not present:
        return "object"
    if present == {"bool"}:
        return "object" if nulls else "bool"
    if present == {"int"}:
        return "float64" if nulls else "int64"
    if present <= {"int", "float"}:
        return "float64"
    if present == {"str"}:
        return "str"
    return None


_AS_READ = object()  # _Column._push: the value was written as it reads back


class _Column:
    """One column while rows merge: values as they read back (``kind``), the kind they
    were last written with, and how many values of each class it holds."""

    def __init__(self, kind: _Kind, values: list[Any], written: _Kind | None = None) -> None:
        self._reset(kind, values, written)

    def _reset(self, kind: _Kind, values: list[Any], written: _Kind | None = None) -> None:
        self.kind, self.values, self.written = kind, values, written or kind
        # The last write: its array (a step through Arrow) or its last value as written
        # (a step that appended; the values above are as it reads back)
        self.array: pa.Array | None = None
        self.last: Any = values[-1] if values else None
        self.counts: dict[str, int] = {}
        for v in values:
            self._count(v, 1)

    def _count(self, value: Any, by: int) -> None:
        c = _class_of(value)
        self.counts[c] = self.counts.get(c, 0) + by

    def _only(self, *classes: str) -> bool:
        return all(c in classes for c, k in self.counts.items() if k)

    def pop(self, i: int) -> None:
        self._count(self.values.pop(i), -1)

    def _push(self, value: Any, written: _Kind, raw: Any = _AS_READ) -> None:
        """Append ``value`` as it reads back; ``raw``: as it was written, when not the same."""
        self.values.append(value)
        self._count(value, 1)
        self.written, self.array = written, None
        self.last = value if raw is _AS_READ else raw

    def final(self) -> pa.Array:
        """The column as the last step wrote it."""
        if self.array is not None:
            return self.array
        return _arrow_column([*self.values[:-1], self.last], self.written)

    def through_arrow(self, values: list[Any], written: _Kind) -> None:
        """Write ``values`` as ``written`` and read them back, as the file would."""
        array = _arrow_column(values, written)
        kind = _kind_of_column(array)
        self._reset(kind, _as_kind(array.to_pylist(), kind), written)
        self.array = array

    def append(self, value: Any, new: _Kind | None, name: str) -> None:
        """One row's step for this column: ``value`` (``new``: its kind, None
        when the row lacks the column) joins, then the column is written and read back."""
        kind = _common_kind(self.kind, new)
        if name == "grid":
            written = kind if kind == "str" else "object"
            plain = "" if _missing(value) else value
            if isinstance(plain, str) and self._only("str"):
                self._push(plain, written)
            else:
                self.through_arrow(["" if _missing(v) else v
                                    for v in _as_kind([*self.values, value], kind)], written)
            return
        if name == "nodes":
            if self._only("int"):
                value = _as_kind([value], kind)[0]
                self._push(1 if _missing(value) else int(value), "int64")
            else:
                self._reset("int64", [1 if _missing(v) else int(v)
                                      for v in _as_kind([*self.values, value], kind)])
            return
        if kind == self.kind and kind != "object":
            self._push(_as_kind([value], kind)[0], kind)
            return
        if kind == "object":
            self._count(value, 1)
            read = _inferred(self.counts)
            self._count(value, -1)
            if read == self.kind:
                if read == "float64":
                    back = math.nan if _missing(value) else float(value)
                else:
                    back = None if _missing(value) else value
                self._push(back, kind, raw=value)
                return
        self.through_arrow(_as_kind([*self.values, value], kind), kind)


def _merged(old: pa.Table, rows: list[dict[str, Any]]) -> pa.Table:
    """``old`` with ``rows`` recorded one after another, each replacing its trial's row,
    derived columns recomputed: the table that reading, concatenating, ``derive`` and
    ``Table.from_pandas`` made, row by row, in one pass."""
    import numpy as np
    import pyarrow as pa

    if not rows:
        return old
    names = old.column_names
    ids = old.column("trial_id").to_pylist() if "trial_id" in names else []
    cols: dict[str, _Column] = {}
    if ids:
        for name in names:
            column = old.column(name)
            kind = _kind_of_column(column)
            cols[name] = _Column(kind, _as_kind(column.to_pylist(), kind))
    where = {t: i for i, t in enumerate(ids)}
    for row in rows:
        cols = _merge_row(cols, ids, where, row)

    def num(name: str) -> np.ndarray:
        return np.array([float(v) if isinstance(v, (int, float)) else np.nan
                         for v in cols[name].values], dtype=float)

    derived = _derived(num("units_per_s"), num("workers"), num("vcpus"), num("price_per_hour"),
                       num("nodes"), np.array([v == "ok" for v in cols["status"].values]),
                       lambda name: cols[name].values)
    arrays = {name: c.final() for name, c in cols.items()}
    for name, values in derived.items():
        arrays[name] = _arrow_column(values.tolist(), "bool" if values.dtype == bool else "float64")
    return pa.table(arrays)


def _merge_row(cols: dict[str, _Column], ids: list[Any], where: dict[Any, int],
               row: dict[str, Any]) -> dict[str, _Column]:
    """One row of ``_merged`` (``ids`` and ``where``, the trial ids in order and their
    rows, are updated in place): its trial's old row out, the row in (alone in a table
    that had no other row, with its own kinds, as ``DataFrame([row])`` types them)."""
    trial_id = row["trial_id"]
    if trial_id in where:
        i = where.pop(trial_id)
        for column in cols.values():
            column.pop(i)
        del ids[i]
        where.update({t: j for j, t in enumerate(ids[i:], start=i)})
    if not ids:
        cols = {}
        for name in ALL_COLUMNS:
            value = row.get(name)
            kind = _kind_of_value(value)
            if name == "grid":
                value, kind = ("" if _missing(value) else value), (
                    kind if kind == "str" else "object")
            elif name == "nodes":
                value, kind = (1 if _missing(value) else int(value)), "int64"
            column = _Column(kind, [])
            column.through_arrow([value], kind)
            cols[name] = column
    else:
        for name in ALL_COLUMNS:
            if name not in cols:  # a column the file lacks: read as missing values
                cols[name] = _Column("object", [None] * len(ids))
        for name, column in cols.items():
            if name in _DERIVED:  # recomputed from the others at the end
                column.values.append(None)
                continue
            column.append(row.get(name), _kind_of_value(row[name]) if name in row else None,
                          name)
    where[trial_id] = len(ids)
    ids.append(trial_id)
    return cols
