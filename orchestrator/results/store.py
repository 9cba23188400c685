"""The results store: ``runs/<sweep-id>/`` as plain files pandas, DuckDB or a notebook read.

Layout: ``sweep.json`` (spec, plan, prices at launch, status, VMs created),
``trials.parquet`` (one row per trial, ``TRIAL_COLUMNS``),
``timeseries/<trial-id>.parquet``, ``report.html``, ``report.md``, ``plots/*.svg``.
Each trial is written atomically the moment it is collected, so a crash never
loses a finished trial and ``--resume`` knows exactly what is missing.

``trials.parquet`` and ``trials.parts/`` are the source of truth for trials. A
record writes one part (the row as JSON, a temp file then ``os.replace``): the
same cost at the 10th trial as at the 10,000th, where rewriting the table cost
3.7 ms at 10 rows and 113 ms at 5,000. Reading the store (the sweep's end, a
report, ``--resume``) first compacts the parts into ``trials.parquet``, in the
order they were recorded, under a lock (``.trials.lock``), so a crash at any
point loses no recorded trial and a reader sees every part. Removing a row from
the compacted table makes ``--resume`` run that trial again.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.atomic import atomic_path as _atomic_path
from orchestrator.atomic import atomic_write_bytes, link_or_copy
from orchestrator.errors import UsageError, one_line
from orchestrator.results.trials_table import (  # noqa: F401 - the store's names
    ALL_COLUMNS,
    EXTRA_COLUMNS,
    TRIAL_COLUMNS,
    _kind_of_column,
    _merged,
    derive,
)

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from orchestrator.catalog.machines import MachineType
    from orchestrator.plan.planner import TrialPlan

SWEEP_FILE = "sweep.json"
TRIALS_FILE = "trials.parquet"
TIMESERIES_DIR = "timeseries"
LOCK_FILE = ".lock"
PARTS_DIR = "trials.parts"  # one JSON row per trial recorded since the last compaction
COMPACT_LOCK = ".trials.lock"
SWEEP_SCHEMA = "cloudprof.sweep/1"


# Statuses whose result stands: --resume does not run these again. A failed,
# interrupted or preempted trial is missing data, so it runs again.
DONE_STATUSES = frozenset({"ok", "memory_budget_exceeded"})


def recorded_buckets(paths: Iterable[Path]) -> list[str]:
    """Bucket URLs the runs at ``paths`` used, each once (``cloudprof cleanup`` looks in them).

    A path is a run directory or a directory of them (``runs/``); anything unreadable
    is no run.
    """
    found: list[str] = []
    for path in map(Path, paths):
        runs = [path] if (path / SWEEP_FILE).is_file() else sorted(path.glob("*"))
        for run_dir in runs:
            try:
                url = json.loads((run_dir / SWEEP_FILE).read_text(encoding="utf-8")).get("bucket")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(url, str) and url and url not in found:
                found.append(url)
    return found


def run_in_progress(run_dir: Path) -> bool:
    """Whether a process holds ``run_dir``'s lock now (``RunStore.running``): a sweep is
    running exactly while it does, and a killed one released it with its process, though
    its sweep.json may still say ``running``.

    Asked with a shared lock taken and dropped at once (the kernel's word, not a pid that
    may have been reused); a lock file that cannot be opened for another reason than its
    absence counts as held, so that a doubt never makes a live sweep's resources due.
    """
    import fcntl

    try:
        fh = open(run_dir / LOCK_FILE, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return False  # never run, or from before the lock: nothing holds it
    except OSError:
        return True
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


# The columns every trials table cloudprof ever wrote has: a Parquet file without them is
# someone else's, and a store built on it would take nothing in it as done.
REQUIRED_COLUMNS = ("trial_id", "machine", "workers", "status")


class TrialsUnreadableError(OSError):
    """trials.parquet stopped reading back while the sweep recorded into it (damaged or
    replaced under it). An OSError, so the engine takes the path of a disk that refuses
    writes: the sweep stops, the file is left as it is (its rows are the record of what is
    done) and the bucket keeps its copy of every result for ``--resume``."""

    fix = "restore trials.parquet from a backup or move it aside"


def read_trials_file(path: Path) -> pd.DataFrame:
    """``trials.parquet`` as a frame; a truncated or corrupt file, or one that is not a
    trials table, is a one-line UsageError saying how to go on (its rows are the only
    record of which trials are done)."""
    import pandas as pd

    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise _unreadable(path, exc) from exc
    check_trials_columns(path, list(frame.columns))
    return frame


def check_trials_columns(path: Path, columns: list[str]) -> None:
    """Refuse a Parquet file that is not a cloudprof trials table (``REQUIRED_COLUMNS``)."""
    lacking = [c for c in REQUIRED_COLUMNS if c not in columns]
    if lacking:
        raise UsageError(
            f"{path} is not a cloudprof trials table (no {', '.join(lacking)} column); "
            "put the sweep's own trials.parquet back, or move this file aside to make "
            "--resume run every trial again")


def _unreadable(path: Path, exc: Exception) -> UsageError:
    return UsageError(
        f"cannot read {path}: {' '.join(str(exc).split())} — restore it from a backup, or "
        "move it aside to make --resume run every trial again")


def _plain(value: Any) -> Any:
    """A numpy scalar in a row as the Python value it holds (JSON knows no numpy)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not a trials table value")


def _read_parts(parts: list[Path]) -> list[dict[str, Any]]:
    """The rows of ``parts``, in order; a part another reader folded meanwhile is gone."""
    rows = []
    for part in parts:
        try:
            rows.append(json.loads(part.read_bytes()))
        except FileNotFoundError:
            continue
    return rows


def compact_parts(run_dir: Path) -> None:
    """Fold a run's recorded parts into its trials.parquet, if it has any: what a reader of
    the file itself (a report, a notebook) calls first to see every recorded trial."""
    if any((Path(run_dir) / PARTS_DIR).glob("*.json")):
        RunStore(Path(run_dir)).compact()


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class RunStore:
    """One sweep's directory; safe to use from the engine's per-machine threads."""

    def __init__(self, run_dir: Path) -> None:
        # Absolute, whatever --out was: hosts and trials get paths under it that must not
        # be read from their own working directories (runs/<id>/hosts/<vm>/runs/<id>/...).
        self.run_dir = Path(run_dir).absolute()
        self._lock = threading.RLock()
        # Wraps each read-change-write of sweep.json; the sweep engine defers signals in
        # it, so that a Ctrl-C never lands between the read and the write.
        self.guard: Callable[[], contextlib.AbstractContextManager[None]] = (
            contextlib.nullcontext)
        # The trials table this store last wrote, keyed by the file's (st_ino, st_size,
        # st_mtime_ns) then: see ``_read_table``.
        self._trials_cache: tuple[tuple[int, int, int], pa.Table] | None = None
        self._parts_made = False
        self._part_seq = itertools.count()

    # -- creation -------------------------------------------------------------

    @classmethod
    def create(cls, run_dir: Path, sweep: dict[str, Any], *,
               trials_table: bool = True) -> RunStore:
        """A new store holding ``sweep`` (spec, plan, prices...) and an empty trials table.

        ``trials_table=False`` leaves the table to :meth:`ensure_trials_table`: a sweep
        writes it once its machines have started, so that the pyarrow import it costs
        (~0.15-0.35 s) is no longer paid before they start.
        """
        run_dir = Path(run_dir)
        if (run_dir / SWEEP_FILE).exists():
            raise UsageError(f"{run_dir} already holds a sweep; use --resume {run_dir}")
        try:
            (run_dir / TIMESERIES_DIR).mkdir(parents=True, exist_ok=True)
            probe = run_dir / ".write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise UsageError(f"cannot write the output directory {run_dir}: "
                             f"{exc.strerror or exc}") from exc
        store = cls(run_dir)
        data = {"schema": SWEEP_SCHEMA, "status": "planned", "created_at": now_iso(),
                "vms": {}, "machines": {}, **sweep}
        store._write_sweep(data)
        if trials_table:
            store._write_empty_trials()
        return store

    @classmethod
    def open(cls, run_dir: Path) -> RunStore:
        run_dir = Path(run_dir)
        if not (run_dir / SWEEP_FILE).is_file():
            raise UsageError(f"{run_dir} is not a cloudprof run (no {SWEEP_FILE})")
        store = cls(run_dir)
        try:
            store.read_sweep()
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read {run_dir / SWEEP_FILE}: {exc}") from exc
        if not (run_dir / TRIALS_FILE).exists():
            store._write_empty_trials()
        store._read_table()  # a truncated table is one line now, before anything is paid for
        return store

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Hold the run's lock while a process works on it: two at once would run trials twice.

        An OS lock (``flock``), so a crashed or killed process releases it by itself. The
        recorded parts are compacted when the block ends, however it ends.
        """
        import fcntl

        fh = open(self.run_dir / LOCK_FILE, "a+")  # noqa: SIM115 - held for the block
        try:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fh.seek(0)
                holder = fh.read().strip() or "another process"
                raise UsageError(f"{self.run_dir} is in use by {holder}; wait for it or stop "
                                 "it first") from None
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()}")
            fh.flush()
            try:
                yield
            except BaseException as exc:
                self._settle(exc)
                raise
            finally:
                self._compact_at_end()
        finally:
            fh.close()

    def _compact_at_end(self) -> None:
        """However a run ends, its parts are folded into trials.parquet, so that the file
        alone (a notebook, DuckDB) holds every trial; a table that no longer reads back is
        left as it is (its parts with it, for the next reader)."""
        with contextlib.suppress(OSError, UsageError):
            self.compact()

    def _settle(self, exc: BaseException) -> None:
        """However a run ends, sweep.json never stays ``running``: an error that escaped
        every other status write leaves ``failed`` (or ``interrupted``) and its line."""
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if self.read_sweep().get("status") != "running":
                return
            if isinstance(exc, KeyboardInterrupt):
                self.set_status("interrupted", finished_at=now_iso())
            else:
                self.set_status("failed", finished_at=now_iso(), error=one_line(exc))

    # -- sweep.json -----------------------------------------------------------

    @property
    def sweep_path(self) -> Path:
        return self.run_dir / SWEEP_FILE

    @property
    def trials_path(self) -> Path:
        return self.run_dir / TRIALS_FILE

    def timeseries_path(self, trial_id: str) -> Path:
        return self.run_dir / TIMESERIES_DIR / f"{trial_id}.parquet"

    def read_sweep(self) -> dict[str, Any]:
        return json.loads(self.sweep_path.read_text())

    def _write_sweep(self, data: dict[str, Any]) -> None:
        atomic_write_bytes(self.sweep_path,
                           json.dumps(data, indent=2, sort_keys=True, default=str).encode())

    def update_sweep(self, **fields: Any) -> dict[str, Any]:
        """Merge top-level ``fields`` into sweep.json (read, change, atomic replace)."""
        with self._lock, self.guard():
            data = self.read_sweep()
            data.update(fields)
            self._write_sweep(data)
            return data

    def set_status(self, status: str, **fields: Any) -> None:
        self.update_sweep(status=status, **fields)

    def record_vm(self, name: str, **info: Any) -> None:
        """Record what a VM is as soon as it is known (its id first: cleanup needs it);
        the fields are a ``records.VmRecord``'s."""
        from orchestrator.results.records import check_vm_fields

        check_vm_fields(info)
        self._merge("vms", name, info)

    def record_machine(self, machine: str, status: str, error: str | None = None) -> None:
        self._merge("machines", machine, {"status": status, "error": error, "at": now_iso()})

    def _merge(self, section: str, key: str, info: dict[str, Any]) -> None:
        with self._lock, self.guard():
            data = self.read_sweep()
            entry = data.setdefault(section, {}).setdefault(key, {})
            entry.update(info)
            self._write_sweep(data)

    # -- trials ---------------------------------------------------------------

    def record_trial(self, row: dict[str, Any], timeseries_path: Path | None) -> dict[str, Any]:
        """Store one trial's row (from ``trial_row``), its time series first, and return it.

        The row is written as one part (``trials.parts/``), folded into trials.parquet by
        the next read (:meth:`compact`); a row with the same trial id replaces the earlier
        one there: a re-run supersedes a failure. The time series is hard-linked where it
        can be (the engine's fetched copy, removed next; the caller never rewrites it in
        place), synced either way. Runs between two trials, so it needs neither pandas nor
        a read of the table, unless the table changed since this store last read it (it
        is checked then: a table that no longer reads back stops the sweep).
        """
        trial_id = row["trial_id"]
        with self._lock:
            try:  # first: a table that no longer reads back is left as it is, never replaced
                self._read_base()
            except UsageError as exc:
                why = one_line(exc.__cause__) if exc.__cause__ is not None else \
                    "its columns are not a trials table's"
                raise TrialsUnreadableError(
                    errno.EIO, f"trials.parquet no longer reads back ({why}), so it was left "
                    f"as it is and trial {trial_id} was not added to it",
                    str(self.trials_path)) from None
            if timeseries_path is not None and Path(timeseries_path).is_file():
                with _atomic_path(self.timeseries_path(trial_id), mode=None) as tmp:
                    if not link_or_copy(timeseries_path, tmp):
                        tmp.chmod(0o644)  # a copy: readable as every result (a link keeps its mode)
            self._write_part(row)
        return row

    def _write_part(self, row: dict[str, Any]) -> None:
        """The row as one file of ``trials.parts/``, named so that names sort in the order
        of the records (nanoseconds, then this process and its own count)."""
        parts = self.run_dir / PARTS_DIR
        if not self._parts_made:
            parts.mkdir(exist_ok=True)
            self._parts_made = True
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._part_seq):08d}.json"
        atomic_write_bytes(parts / name, json.dumps(row, default=_plain).encode())

    def compact(self) -> pa.Table:
        """Fold the recorded parts into trials.parquet, in their order, and return the table.

        Under an OS lock, so that two readers never fold the same part twice; the parts are
        removed only once the table holding them is in place (a crash before that leaves
        them to the next read, which gives the same table). A store this process cannot
        write (a copy on a read-only disk) is read with its parts folded in memory.
        """
        import fcntl

        with self._lock:
            parts_dir = self.run_dir / PARTS_DIR
            if not any(parts_dir.glob("*.json")):
                return self._read_base()
            try:
                fh = open(self.run_dir / COMPACT_LOCK, "a+")  # noqa: SIM115 - closed below
            except OSError:
                return _merged(self._read_base(), _read_parts(sorted(parts_dir.glob("*.json"))))
            with fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                parts = sorted(parts_dir.glob("*.json"))  # another reader may have folded some
                table = self._read_base()
                if not parts:
                    return table
                table = _merged(table, _read_parts(parts))
                try:
                    self._write_table(table)
                except OSError:
                    return table
                for part in parts:
                    part.unlink(missing_ok=True)
                return table

    def done_trial_ids(self) -> set[str]:
        """Trials whose result stands (``DONE_STATUSES``): what ``--resume`` skips."""
        table = self._read_table()
        if "trial_id" not in table.column_names or "status" not in table.column_names:
            return set()
        return {t for t, s in zip(table["trial_id"].to_pylist(), table["status"].to_pylist(),
                                  strict=True) if s in DONE_STATUSES and t is not None}

    def reads_back(self) -> bool:
        """Whether trials.parquet still reads back as a trials table: until it does, the
        bucket's copies of the results are the only record, and are not deleted."""
        try:
            self._read_table()
        except UsageError:
            return False
        return True

    def trial_rows(self) -> list[dict[str, Any]]:
        """The trials as the file holds them, one dict per row with the file's columns (None
        where a value is null), read with pyarrow alone: what a sweep's end needs, without
        pandas' import. A column the file lacks (an older store) is absent from every row."""
        return self._read_table().to_pylist()

    def trials_frame(self) -> pd.DataFrame:
        """All trials with the derived columns (efficiency, cost per million...) up to date:
        the file as ``pandas.read_parquet`` reads it, every column of ``ALL_COLUMNS``."""
        return derive(self._read_trials())

    def _read_trials(self) -> pd.DataFrame:
        """trials.parquet as a frame with every column of ``ALL_COLUMNS``."""
        with self._lock:
            self.compact()
            if not self.trials_path.exists():
                return self._empty_frame()
            frame = read_trials_file(self.trials_path)
        for col in ALL_COLUMNS:
            if col not in frame.columns:
                frame[col] = None
        return frame

    def _read_table(self) -> pa.Table:
        """Every trial recorded: the parts compacted into the table (:meth:`compact`)."""
        return self.compact()

    def _read_base(self) -> pa.Table:
        """trials.parquet as the Arrow table in the file (an empty one without the file).

        The table this store wrote or read last is kept in memory and returned while the
        file is still that one: same inode, size and modification time. Any other writer
        (another process on the run, a test, a user removing a row for ``--resume``)
        replaces or rewrites the file, which changes the key, so the file is read again.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        with self._lock:
            try:
                st = self.trials_path.stat()
            except FileNotFoundError:
                return pa.table({})
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            cached = self._trials_cache
            if cached is not None and cached[0] == key:
                return cached[1]
            try:  # not pq.read_table, which imports pandas
                with pq.ParquetFile(self.trials_path) as file:
                    table = file.read()
            except Exception as exc:  # pyarrow raises several types for a corrupt file
                raise _unreadable(self.trials_path, exc) from exc
            check_trials_columns(self.trials_path, table.column_names)
            self._trials_cache = (key, table)
            return table

    def _write_table(self, table: pa.Table) -> None:
        """Write ``table`` atomically and keep it in memory (see ``_read_table``)."""
        import pyarrow.parquet as pq

        with self._lock:
            with _atomic_path(self.trials_path) as tmp:
                pq.write_table(table, tmp)
            st = self.trials_path.stat()
            self._trials_cache = ((st.st_ino, st.st_size, st.st_mtime_ns), table)

    def ensure_trials_table(self) -> None:
        """Write the empty trials table unless the store has one (a record may have written
        it already: checked under the lock every write of the table holds). pyarrow is
        imported first, outside the lock: its import (~0.5 s) under it held up the machine
        threads' ``record_vm`` between staging the inputs and waiting for the warm runner."""
        import pyarrow.parquet  # noqa: F401

        with self._lock:
            if not self.trials_path.exists():
                self._write_empty_trials()

    def _write_empty_trials(self) -> None:
        """An empty trials table, written with pyarrow alone: creating a store must not import
        pandas (~0.3-1 s), which a sweep imports while its machines provision and stage
        (``_Engine.execute``) instead of before them. It reads back exactly as
        ``_empty_frame()`` (one untyped, all-null column per name of ``ALL_COLUMNS``)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({c: pa.nulls(0) for c in ALL_COLUMNS})
        with self._lock, _atomic_path(self.trials_path) as tmp:
            pq.write_table(table, tmp)

    @staticmethod
    def _empty_frame() -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame({c: pd.Series(dtype="object") for c in ALL_COLUMNS})


def _num(value: Any) -> float | None:
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def _unit_detail(summary: dict[str, Any]) -> str | None:
    """What one unit delivered, as the workload described it (``params.workload_resolved``)."""
    params = summary.get("params")
    resolved = params.get("workload_resolved") if isinstance(params, dict) else None
    detail = resolved.get("unit_detail") if isinstance(resolved, dict) else None
    return detail if isinstance(detail, str) and detail else None


def trial_row(
    summary: dict[str, Any] | None,
    planned_machine: MachineType,
    *,
    trial: TrialPlan,
    sweep_id: str,
    ran_on: str,
    provider: str,
    spot: bool = False,
    status: str | None = None,
    error: str | None = None,
    exit_code: int | None = None,
) -> dict[str, Any]:
    """One row of trials.parquet from a runner summary; derived columns are filled by derive()."""
    s = summary or {}
    host = s.get("host") or {}
    leak = s.get("leak") or {}
    cores = host.get("cores_logical")
    memory = host.get("memory_bytes")
    err = error if error is not None else s.get("error")
    return {
        "sweep_id": sweep_id,
        "trial_id": trial.trial_id,
        "machine": planned_machine.name,
        "ran_on": ran_on,
        "provider": provider,
        "vcpus": int(cores) if cores else None,
        "memory_gib": float(memory) / 2**30 if memory else None,
        "workers": int(trial.workers),
        "repeat": int(trial.repeat),
        "units": int(s["units"]) if s.get("units") is not None else None,
        "seconds": _num(s.get("seconds")),
        "units_per_s": _num(s.get("units_per_s")),
        "units_per_s_per_vcpu": None,
        "efficiency": None,
        "cpu_utilisation": _num(s.get("cpu_utilisation")),
        "leak_verdict": leak.get("verdict"),
        "price_per_hour": _cluster_price(planned_machine.price(spot), trial),
        "cost_per_million_units": None,
        "oversubscribed": bool(cores) and int(trial.workers) > int(cores),
        "status": status or s.get("status") or "failed",
        "error": " ".join(str(err).split()) if err else None,
        "started_at": s.get("started_at"),
        "finished_at": s.get("finished_at") or now_iso(),
        "unit": s.get("unit"),
        "unit_detail": _unit_detail(s),
        "spot": bool(spot),
        "cost_is_estimate": ran_on != planned_machine.name,
        "hostname": host.get("hostname"),
        "cpu_model": host.get("cpu_model"),
        "peak_rss_sampled_bytes": s.get("peak_rss_sampled_bytes"),
        "peak_rss_before_trial_bytes": s.get("peak_rss_before_trial_bytes"),
        **_peaks(s),
        "load_s": _num(s.get("load_s")),
        "cpu_percent_mean": _num(s.get("cpu_percent_mean")),
        "leak_slope_mb_per_s": _num(leak.get("slope_mb_per_s")),
        "leak_probability": _num(leak.get("probability")),
        "leak_ramp": leak.get("ramp"),
        "exit_code": exit_code,
        "job_kind": s.get("job_kind"),
        "cpu_seconds": _num(s.get("cpu_seconds")),
        "phases": json.dumps(s["phases"]) if s.get("phases") else None,
        "grid": json.dumps(getattr(trial, "grid", None) or {}) if getattr(trial, "grid", None)
        else "",
        "peak_gpu_mem_bytes": _num((s.get("gpu") or {}).get("peak_mem_bytes")),
        "gpu_peak_source": (s.get("gpu") or {}).get("peak_source"),
        "nodes": int(getattr(trial, "nodes", 1) or 1),
        "scaleout_efficiency": None,
        "node_peak_rss_bytes": _per_node(s, "peak_rss_bytes"),
        "node_peak_rss_source": _per_node(s, "peak_rss_source"),
        "node_peak_rss_sampled_bytes": _per_node(s, "peak_rss_sampled_bytes"),
        "node_units_per_s": _per_node(s, "units_per_s"),
        "node_addresses": _per_node(s, "address"),
        "peak_usage_with_cache_bytes": _num(s.get("peak_usage_with_cache_bytes")),
        "spikes": json.dumps(s["spikes"]) if s.get("spikes") else None,
        "bound_units_per_s": _num((s.get("bound") or {}).get("units_per_s")),
    }


def _peaks(s: dict[str, Any]) -> dict[str, Any]:
    """The peak columns of a summary; one older than trial/4 had only the trial's peak as
    ``peak_rss_bytes``, so its whole-lifetime peak is the larger of that and the load's."""
    trial = s.get("peak_rss_trial_bytes", s.get("peak_rss_bytes"))
    before = s.get("peak_rss_before_trial_bytes")
    lifetime = s.get("peak_rss_bytes")
    phase = s.get("peak_phase")
    if "peak_rss_trial_bytes" not in s and before and trial and before > trial:
        lifetime, phase = before, "load"
    return {
        "peak_rss_bytes": int(lifetime) if lifetime else None,
        "peak_rss_trial_bytes": int(trial) if trial else None,
        "peak_phase": phase or ("trial" if trial else None),
        "peak_rss_source": s.get("peak_rss_source"),
        "peak_rss_upper_bound_bytes": s.get("peak_rss_upper_bound_bytes"),
    }


def _cluster_price(price: float | None, trial: Any) -> float | None:
    """A trial on n nodes pays for n VMs."""
    nodes = int(getattr(trial, "nodes", 1) or 1)
    return None if price is None else price * nodes


def _per_node(summary: dict[str, Any], key: str) -> str | None:
    """One figure per node of a Ray trial's summary, as a JSON list (None without nodes)."""
    nodes = summary.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        return None
    return json.dumps([n.get(key) if isinstance(n, dict) else None for n in nodes])


