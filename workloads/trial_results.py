"""A trial's result files (``summary.json``, ``timeseries.parquet``) and the measurements
the profiling agent's report puts in the summary: peaks and their bases, leak, spikes,
CPU, GPU.

Every file is written by rename once synced (``_atomic_write``), and the runner's
``--put`` uploads only the files this process wrote that way (``_SYNCED``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from workloads import arrow, limits, protocol
from workloads.agent import AgentReport
from workloads.atomic import atomic_path
from workloads.memory import find_spikes, leak_test
from workloads.profilers import torch_gpu

TREE_GAP = 1.10  # a sampled tree peak this far below the sum of per-process peaks is flagged

# -- result files -------------------------------------------------------------------------


_SYNCED: set[str] = set()  # the real paths this process wrote (and synced) with _atomic_write


def _atomic_write(path: Path, write: Any) -> None:
    """``write(tmp)`` fills a temporary file that then replaces ``path`` in one rename, once
    synced (``--put`` then links it into a file:// bucket without a sync of its own)."""
    with atomic_path(path) as tmp:
        write(tmp)
    _SYNCED.add(os.path.realpath(path))


def write_summary(out: Path, summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, sort_keys=False, default=str)
            f.write("\n")

    _atomic_write(out / protocol.SUMMARY_FILE, write)


def _timeseries_table(report: AgentReport) -> Any:
    import pyarrow as pa

    types = {
        "t": pa.float64(), "rss_bytes": pa.int64(), "cpu_user_s": pa.float64(),
        "cpu_system_s": pa.float64(), "cpu_percent": pa.float64(), "threads": pa.int32(),
        "read_bytes": pa.int64(), "write_bytes": pa.int64(), "uss_bytes": pa.int64(),
        "pss_bytes": pa.int64(), "children": pa.int32(), "units": pa.int64(),
        "gpu_mem_bytes": pa.int64(), "gpu_util": pa.float64(),
        "gpu_proc_mem_bytes": pa.int64(), "gpu_proc_util": pa.float64(),
        "held_bytes": pa.int64(),
    }  # fmt: skip
    cols = protocol.TIMESERIES_COLUMNS
    arrays = [arrow.nullable(report.column(c), types[c]) for c in cols]
    return pa.Table.from_arrays(arrays, schema=pa.schema([(c, types[c]) for c in cols]))


WRITER: Callable[[Path, Sequence[tuple]], bool] | None = None
"""In a runner forked from a warm runner without pyarrow: its writer process
(``workloads.warm_writer``), which writes the time series' rows to a path."""


def write_timeseries(out: Path, report: AgentReport) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if WRITER is not None:
        writer = WRITER

        def handed_over(tmp: Path) -> None:
            if not writer(tmp, report.rows):
                raise OSError("the warm runner's writer did not write it")

        with contextlib.suppress(OSError):
            _atomic_write(out / protocol.TIMESERIES_FILE, handed_over)
            return
    write_rows(out / protocol.TIMESERIES_FILE, report.rows, atomic=True)


def write_rows(path: Path, rows: Sequence[tuple], atomic: bool = False) -> None:
    """The time series of ``rows`` (``TIMESERIES_COLUMNS`` order) as Parquet at ``path``;
    ``atomic``: through a synced temporary file (the writer's path already is one)."""
    import pyarrow.parquet as pq

    table = _timeseries_table(AgentReport(rows=list(rows)))
    if atomic:
        _atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    else:
        pq.write_table(table, path)


def _warm_result_writer() -> None:
    """Write an empty time series to memory before the trial starts.

    pyarrow's first table and first Parquet write map tens of MB (allocator
    arenas, kernels). Done after the trial, that would become the process's
    high-water mark, and a parent's view of the peak (``/usr/bin/time -v``, the
    orchestrator's wait4) would disagree with the trial's own. Not in a warm runner
    before its forks: held from before prepare(), it would add to a load-phase peak
    (46 MiB more in tests/test_warm_runner.py), where a fresh runner maps it after.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(_timeseries_table(AgentReport()), pa.BufferOutputStream())


def peak_fields(rep: AgentReport) -> dict[str, Any]:
    """The headline peak is the trial process's whole lifetime, with the phases beside it.

    Loading data is often the peak (a workload that needs 600 MiB while loading
    and 120 MiB while running needs 600 MiB), so ``peak_rss_bytes`` is the larger
    of the load phase (interpreter start, imports, ``prepare()``, warm-up: the
    kernel's lifetime high-water mark when the trial began) and the trial's own
    peak. A command's agent starts with the command, so its trial is its lifetime.
    """
    trial, before = rep.peak_rss_bytes, rep.peak_rss_before_bytes
    out: dict[str, Any] = {"peak_rss_trial_bytes": trial,
                           "peak_rss_trial_source": rep.peak_rss_source}
    if before is not None and before > trial:
        # the kernel's high-water mark before the trial reset it
        out["peak_rss_bytes"] = before
        out["peak_rss_source"] = rep.peak_rss_before_source or "vmhwm"
    else:
        out["peak_rss_bytes"], out["peak_rss_source"] = trial, rep.peak_rss_source
    out["peak_phase"] = "load" if before is not None and before > trial else "trial"
    if before is not None:
        out["peak_rss_before_trial_bytes"] = before
    return out


BASES_DIFFER = 0.10  # another basis this far from the headline is named in peak_bases_note


def peak_bases(rep: AgentReport) -> dict[str, Any]:
    """The tree's other memory figures beside the headline, and a note naming those more
    than ``BASES_DIFFER`` away from it, with why they differ."""
    head = max(rep.peak_rss_bytes, 1)
    out: dict[str, Any] = {
        "peak_usage_with_cache_bytes": rep.peak_usage_with_cache_bytes,
        "peak_usage_with_cache_source": rep.peak_usage_with_cache_source,
        "peak_basis": rep.held_basis,
    }
    why = {  # name: (value, why it is higher, why it is lower)
        "cgroup usage with page cache": (
            rep.peak_usage_with_cache_bytes,
            "the page cache of files it read (reclaimed under a limit) counts there",
            "library pages another cgroup had cached are not charged there"),
        "sampled RSS sum": (rep.peak_rss_sampled_bytes,
                            "each process counts the shared libraries it maps again",
                            "the samples missed the peak (a kernel high-water mark has it)"),
    }
    notes = []
    for name, (value, higher, lower) in why.items():
        if value is not None and abs(value - head) > BASES_DIFFER * head:
            notes.append(f"{name} peaked at {limits.format_size(value)} "
                         f"({100.0 * (value / head - 1):+.0f} %): "
                         f"{higher if value > head else lower}")
    out["peak_bases_note"] = "; ".join(notes) or None
    return out


def fill_measurements(summary: dict[str, Any], rep: AgentReport, cores: int | None) -> None:
    """The agent's figures → summary keys (peak, CPU, leak verdict, spikes, budget, cost)."""
    t, rss = rep.column("t"), rep.column("rss_bytes")
    held = rep.column("held_bytes")
    if rep.held_basis is not None:  # a tree: leak and spikes on the headline's basis
        pairs = [(tt, h) for tt, h in zip(t, held, strict=True) if h is not None]
        t, rss = [p[0] for p in pairs], [p[1] for p in pairs]
    summary.update(peak_fields(rep))
    summary["peak_rss_sampled_bytes"] = rep.peak_rss_sampled_bytes
    upper = rep.peak_rss_upper_bound_bytes
    if rep.held_basis is not None or rep.peak_usage_with_cache_bytes is not None:
        summary.update(peak_bases(rep))
    if upper is not None:
        summary["peak_rss_upper_bound_bytes"] = upper
        sampled = rep.peak_rss_source in ("sampled_tree", "ru_maxrss")
        if sampled and upper > TREE_GAP * max(rep.peak_rss_bytes, 1):
            # The processes' own peaks add up to far more than the tree was seen at: they
            # may have peaked together between two samples.
            gap = f"{100.0 * (upper / max(rep.peak_rss_bytes, 1) - 1):.0f} %"
            summary["peak_rss_note"] = "; ".join(filter(None, [
                summary.get("peak_rss_note"), f"the sum of its processes' own peaks "
                f"({limits.format_size(upper)}) is {gap} above the reported peak"]))
    summary["cpu_seconds"] = round(rep.cpu_seconds_total, 3)
    if rep.wall_s > 0:
        pct = 100.0 * rep.cpu_seconds_total / rep.wall_s
        summary["cpu_percent_mean"] = round(pct, 2)
        summary["cpu_utilisation"] = round(pct / 100.0 / (cores or 1), 4)
    summary["leak"] = leak_test(t, rss)
    summary["spikes"] = find_spikes(t, rss, rep.peak_rss_bytes)
    budget = rep.budget_summary()
    if rep.budget_limit_bytes is not None and rep.peak_rss_bytes > rep.budget_limit_bytes:
        # A spike between samples can cross the budget unseen; the kernel peak still tells.
        budget["breached"] = True
    budget["stopped_trial"] = rep.budget_breached
    summary["memory_budget"] = budget
    summary["gpu"] = torch_gpu.merge_into(rep.gpu, rep.torch_peak_bytes)
    summary["gpu_note"] = rep.gpu_note if summary["gpu"] is None else None
    summary["agent"] = rep.agent_summary()
