"""What a sweep is asked to do: the validated ``SweepSpec``.

The CLI and ``--config sweep.toml`` both end here; flags override the file.
Validation (machine names against the catalog, worker lists, paths) raises
``UsageError`` with one line, so nothing is provisioned for a bad spec.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

DEFAULT_WORKLOAD = "cube"


@dataclass
class SweepSpec:
    machines: list[str]
    workers: list[int] | None = None  # None: powers of two up to vCPUs, vCPUs, one oversubscribed
    # Three repeats per worker count: one gives no spread, and on replayed surfaces with
    # 2–5 % noise the peak N* lands within ±10 % in 78 % of cases with one, 95 % with three
    # (benchmarks/bench_model.py, docs/benchmarks.md); --adaptive spends fewer.
    repeats: int = 3
    # Scale out: each trial also runs at these node counts (a Ray cluster of that many VMs
    # of the machine type); [1] is the one-VM sweep of before, without Ray.
    nodes: list[int] = field(default_factory=lambda: [1])
    duration_s: float = 3.0  # per trial
    # Before each trial, untimed and unsampled: workers allocate their buffers and warm
    # caches first, so neither the rate nor the leak verdict sees the start-up ramp.
    warmup_s: float = 0.0
    # Per machine, run the worker counts that narrow the USL's peak N* (analysis/search.py)
    # instead of the whole grid; the grid's trial count is the budget.
    adaptive: bool = False
    # --search cost|throughput: try the candidate machines (--machine, or the catalog rows
    # matching --family/--vcpus/--max-price) one at a time, the next chosen by a Gaussian
    # process over machine features (analysis/search.py), at most ``budget`` of them.
    search: str | None = None
    budget: int | None = None  # machines tried; None: analysis.search.default_budget
    family: list[str] = field(default_factory=list)
    vcpus: list[int] | None = None  # [min, max]
    max_price: float | None = None  # USD per hour (the spot price with --spot)
    # --search --deadline T --total N: only a machine that runs N units within T (N/T
    # units/s) may be the pick (CherryPick's constraint); --total also sizes the whole job
    deadline_s: float | None = None
    total: float | None = None
    workload: str = DEFAULT_WORKLOAD  # registry name or "module:Class"
    workload_params: dict[str, Any] = field(default_factory=dict)  # frames, dim, strategy...
    provider: str | None = None  # None: the machine's provider in the catalog
    region: str | None = None
    zone: str | None = None
    project: str | None = None
    bucket: str | None = None
    spot: bool = False
    max_cost: float | None = None  # USD; refuse to start above it
    max_peak_memory: int | None = None  # bytes; the memory gate
    # What the gate compares: "lifetime" (the trial process's whole life, loading included)
    # or "trial" (t >= 0 only). --max-peak-memory trial:300MiB sets it.
    peak_gate: str = "lifetime"
    sample_hz: float = 10.0
    profile: str | None = None  # "cpu" | "memory": one extra profiled trial per worker count
    # A command job's memory request, proven: one extra trial per worker count under a cgroup
    # limit equal to it (prove_limit), or a bisection of the smallest limit it runs under
    # (find_limit, which proves too); kept apart from the tables (orchestrator.engine.limits)
    prove_limit: bool = False
    find_limit: bool = False
    out: Path = Path("runs")
    # report.html, report.md and their figures written at the end (False: the summary is
    # printed, the files are left to `cloudprof report`)
    report: bool = True
    dry_run: bool = False
    hosts_file: Path | None = None
    hosts: list[str] = field(default_factory=list)
    ssh_key: Path | None = None
    # A user's own job (orchestrator.engine.jobs): the project shipped to every host, a
    # command run once per host after the bootstrap, and a command profiled per trial.
    workdir: Path | None = None
    setup: str | None = None
    command: str | None = None  # placeholders {workers} {vcpus} {trial} {repeat} {<grid>}
    shell: bool = False  # the command is one shell line (else shlex-split, no shell)
    grid: dict[str, list[str]] = field(default_factory=dict)  # name -> values, swept
    stop_after_s: float | None = None  # a command job is stopped then (--duration given)
    # Each trial is stopped and failed past this; None: derived from the plan
    # (orchestrator/engine/timeouts.py).
    trial_timeout_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, stored in sweep.json (paths as strings)."""
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, Path):
                out[key] = str(value)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepSpec:
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        for key in ("out", "hosts_file", "ssh_key", "workdir"):
            if kwargs.get(key) is not None:
                kwargs[key] = Path(kwargs[key])
        return cls(**kwargs)
