"""The results store: ``runs/<sweep-id>/`` as plain files pandas, DuckDB or a notebook read.

Layout: ``sweep.json`` (spec, plan, prices at launch, status, VMs created),
``trials.parquet`` (one row per trial, ``TRIAL_COLUMNS``),
``timeseries/<trial-id>.parquet``, ``report.html``, ``report.md``, ``plots/*.png``.
Each trial is written atomically the moment it is collected, so a crash never
loses a finished trial and ``--resume`` knows exactly what is missing.
"""

from __future__ import annotations

SWEEP_FILE = "sweep.json"
TRIALS_FILE = "trials.parquet"
TIMESERIES_DIR = "timeseries"

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
    "peak_rss_bytes",
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
