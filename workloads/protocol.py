"""The contract between the trial runner (on a VM) and the orchestrator (on the laptop).

The orchestrator never imports the runner's internals: it starts
``python -m workloads.run`` and reads what this module defines — the exit codes,
the progress lines on stderr, and the names of the result files and their keys.
Keeping them in one module is what lets both sides change without drifting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, TypedDict

SCHEMA = "cloudprof.trial/4"
"""Value of ``summary.json``'s ``schema`` key; bump the suffix on incompatible changes.

/4: ``peak_rss_bytes`` is the trial process's whole lifetime (load phase included; /3 and
older: the trial only), with ``peak_rss_trial_bytes`` and ``peak_phase`` beside it.
/3 added ``profiled`` and ``profile`` (``--profile cpu|memory``); /2 added ``job_kind`` and
``phases`` (``--command --job``); older summaries lack them."""

SUMMARY_FILE = "summary.json"
TIMESERIES_FILE = "timeseries.parquet"

# Exit codes of ``python -m workloads.run``.
EXIT_OK = 0
EXIT_FAILED = 1  # the workload or the command raised / exited non-zero
EXIT_USAGE = 2  # bad arguments or bad inputs (corrupt Parquet, missing file...)
EXIT_MEMORY_BUDGET = 3  # the memory budget was breached and the trial was stopped
EXIT_INTERRUPTED = 130

class _EverySummary(TypedDict):
    """The keys every summary.json has, written by the runner from its first moment (a
    trial that fails before measuring anything still has them, "nothing measured yet")."""

    schema: str  # SCHEMA
    status: str  # "ok" | "failed" | "memory_budget_exceeded" | "interrupted"
    error: str | None  # one line
    params: dict[str, Any]  # workload, workload_params, workers, duration_s, units_target, ...
    host: dict[str, Any]  # hostname, cpu_model, cores_logical, cores_physical, memory_bytes,
    #                       platform, python, libraries {numpy, pyarrow, psutil}
    unit: str | None  # what one unit is, e.g. "cube"
    units: int
    seconds: float
    units_per_s: float
    peak_rss_bytes: int | None  # whole lifetime (load + trial): kernel high-water mark, exact
    peak_rss_source: str | None  # vmhwm | ru_maxrss | held | held_cgroup | cgroup-v1 |
    #                              cgroup-v2 (older runners) | sampled | sampled_tree
    peak_rss_trial_bytes: int | None  # the trial alone (t >= 0)
    peak_phase: str | None  # "load" or "trial": the phase that holds the lifetime peak
    peak_rss_sampled_bytes: int | None  # max of the sampled series
    cpu_percent_mean: float | None  # 100 = one core busy
    cpu_utilisation: float | None  # 0..1 of all logical cores
    leak: dict[str, Any]  # {"verdict": "ok"|"leak"|"inconclusive", "slope_mb_per_s",
    #                        "probability", "ramp", ...}
    spikes: list[dict[str, Any]]  # {"t": s, "rss_bytes": int, ...}
    memory_budget: dict[str, Any]  # {"limit_bytes": int|None, "breached": bool, ...}
    gpu: dict[str, Any] | None  # None when NVML is absent
    agent: dict[str, Any]  # samples, rate_hz_target, rate_hz_achieved, cpu_seconds,
    #                        sched_policy, samples_missed, lag_ms, rate_note (>10 % missed)
    started_at: str  # ISO 8601 UTC
    finished_at: str | None
    job_kind: str | None  # /2: None (a workload or bare command), "throughput" (it reported
    #                       units) or "fixed_work" (one complete run; seconds is its time)
    phases: list[dict[str, Any]]  # /2: {"name", "start_s", "wall_s", "cpu_s",
    #                               "peak_rss_bytes", "units", "units_per_s", "samples"}
    profiled: bool  # /3: a profiler ran: throughput not comparable with other trials
    runner_start: float | None  # when the runner process started (load_s counts from it)
    profile: dict[str, Any] | None  # /3: None, or PROFILE_KEYS below


class TrialSummary(_EverySummary, total=False):
    """summary.json: what one trial measured, the data plane's answer to a TrialRequest.

    The control plane reads it (``orchestrator/results/store.py``'s ``trial_row``); the
    keys below are written only by the trials they concern."""

    peak_rss_trial_source: str | None
    peak_rss_before_trial_bytes: int | None  # the load phase's high-water mark
    peak_rss_upper_bound_bytes: int | None  # a tree: the sum of its processes' own peaks
    peak_rss_note: str | None  # why the headline may be off (one line)
    peak_usage_with_cache_bytes: int | None  # a tree's cgroup usage, page cache included
    peak_usage_with_cache_source: str | None
    peak_basis: str | None  # what the headline of a tree counts
    peak_bases_note: str | None  # the other bases more than 10 % from the headline, and why
    cpu_seconds: float  # user + system of the trial process or tree
    gpu_note: str | None  # why there is no GPU figure
    load_s: float | None  # a workload: from the process's start to t = 0
    prepare_s: float  # a workload: its prepare() alone, within load_s
    bound: dict[str, Any]  # a workload with bytes_per_unit(): its copy bound (workloads.bound)
    command: dict[str, Any]  # a --command: argv, pid, exit_code, stopped_by, ...
    memory_limit: dict[str, Any]  # --memory-limit: the cgroup limit and what it did
    cgroup: dict[str, Any]  # the trial's own memory cgroup, where it had one
    cgroup_error: str  # a leftover cgroup of the trial on the host (said loudly)
    nodes: list[dict[str, Any]]  # a Ray trial: NODE_KEYS per node
    cluster: dict[str, Any]  # a Ray trial: CLUSTER_KEYS


SUMMARY_KEYS: tuple[str, ...] = tuple(_EverySummary.__annotations__)
"""Keys every summary.json has (the runner may add those of TrialSummary)."""

# cpu: py-spy without pausing the job (top functions, ~3 % cost); gil: py-spy pausing it to
# read native frames too, for the Python / native / GIL-wait split (~20 %, docs/benchmarks.md).
PROFILE_KINDS = ("cpu", "gil", "memory")
# summary["profile"]: always "kind", "tool", "status" ("ok" | "unavailable" | "failed"),
# "reason" (one line, when not ok) and "files" (names in the trial directory). Then, for
#   cpu (py-spy): "samples", "threads", "rate_hz", "native_frames",
#       "shares" {"python", "native", "gil_wait", "idle"} (fractions of thread samples),
#       "top_functions" [{"function", "site" (file:line), "class", "samples", "share"}]
#   memory (memray, or tracemalloc as labelled by "tool"): "peak_bytes", "attributed_bytes",
#       "at", "top_sites" [{"function", "site", "caller", "bytes", "allocations",
#       "share_of_peak"}], "grown_bytes", "grown_sites" (same rows: alive at the end,
#       allocated during the trial — memray only)
PROFILE_KEYS = ("kind", "tool", "status", "reason", "files")
# A trial on a Ray cluster (--ray-nodes N) adds summary["nodes"], one entry per node with
# NODE_KEYS, and summary["cluster"] with CLUSTER_KEYS (workloads.ray_trial fills both).
NODE_KEYS = (
    "node", "hostname", "node_params", "units", "seconds", "units_per_s",
    "peak_rss_bytes",  # all of the node's Ray processes: its memory cgroup's high-water mark
    "peak_rss_source",  # cgroup-v1 | cgroup-v2 | sampled_tree (no cgroup: peak_rss_note says why)
    "peak_rss_scope",  # "trial" (reset when it began) | "cgroup lifetime" (v2 before 6.12)
    "peak_rss_sampled_bytes",  # max of the node's sampled tree (raylet and descendants)
    "peak_rss_upper_bound_bytes",  # the sum of the tree's per-process kernel peaks
    "peak_rss_note", "cgroup", "processes", "cpu_seconds", "cpu_percent_mean",
    "agent",  # the node's agent_summary (samples, rates, the sampler's own CPU)
    "samples",  # the node's time series: [t, tree rss bytes, tree cpu seconds, units]
    "error",
)
CLUSTER_KEYS = ("nodes", "units", "units_per_s", "peak_rss_bytes_sum",
                "peak_rss_bytes_max_node", "peak_rss_sources", "cpu_seconds")
# The files a profiled trial may leave next to summary.json, collected with it (memray's raw
# capture stays on the host: it can be GBs).
PYSPY_SPEEDSCOPE_FILE = "profile.speedscope.json"
PYSPY_FLAMEGRAPH_FILE = "profile.flamegraph.svg"
MEMRAY_FLAMEGRAPH_FILE = "memray.flamegraph.html"
PROFILE_FILES = (PYSPY_SPEEDSCOPE_FILE, PYSPY_FLAMEGRAPH_FILE, MEMRAY_FLAMEGRAPH_FILE)

# Columns of timeseries.parquet (nullable where marked).
TIMESERIES_COLUMNS = (
    "t",  # seconds since the trial started
    "rss_bytes",
    "cpu_user_s",  # cumulative
    "cpu_system_s",  # cumulative
    "cpu_percent",  # over the last interval, 100 = one core
    "threads",
    "read_bytes",  # cumulative I/O
    "write_bytes",
    "uss_bytes",  # nullable: sampled at most once a second
    "pss_bytes",  # nullable
    "children",  # nullable: number of child processes
    "units",  # cumulative units done, nullable in --command mode
    "gpu_mem_bytes",  # nullable: used on the whole device(s)
    "gpu_util",  # nullable, 0..100, the whole device(s)
    "gpu_proc_mem_bytes",  # nullable: used by the trial's processes (where NVML lists them)
    "gpu_proc_util",  # nullable, 0..100 per device, the trial's processes' SM utilisation
    # nullable: a command's tree only: anonymous + mapped file pages, counted once (the basis
    # of its headline peak, workloads.run.held_peak)
    "held_bytes",
)

PROGRESS_PREFIX = "progress"

# ``python -m workloads.run --put MANIFEST`` puts its result files in the bucket itself, after
# writing them (summary.json last), and says so in one line on stderr: "results-put ok
# MANIFEST" when every file made it, "results-put failed MANIFEST: <why>" otherwise (or
# "skipped", when it was interrupted: the orchestrator decides then). Anything but "ok" for
# its own manifest, or no line at all (a runner killed, crashed, or without --put), and the
# orchestrator runs ``python -m workloads.transfer put MANIFEST`` itself.
PUT_PREFIX = "results-put"
PUT_OUTCOMES = ("ok", "failed", "skipped")


def format_put(outcome: str, manifest: str, reason: str | None = None) -> str:
    """The runner's line after ``--put``: ``outcome`` is one of PUT_OUTCOMES."""
    assert outcome in PUT_OUTCOMES
    return f"{PUT_PREFIX} {outcome} {manifest}" + (f": {reason}" if reason else "")


def put_succeeded(line: str, manifest: str) -> bool:
    """Whether ``line`` is the runner saying it put every file of ``manifest``."""
    return line.strip() == format_put("ok", manifest)


def format_progress(t: float, units: int, units_per_s: float, rss_bytes: int) -> str:
    """One progress line, printed once a second to stderr by the runner."""
    return (
        f"{PROGRESS_PREFIX} t={t:.1f} units={units} units_per_s={units_per_s:.2f} "
        f"rss_bytes={rss_bytes}"
    )


def parse_progress(line: str) -> dict[str, float] | None:
    """Parse a progress line (as streamed over SSH or a pipe); None for any other line."""
    parts = line.strip().split()
    if not parts or parts[0] != PROGRESS_PREFIX:
        return None
    out: dict[str, float] = {}
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        if not sep:
            return None
        try:
            out[key] = float(value)
        except ValueError:
            return None
    return out


# ---------------------------------------------------------------- the trial's request


@dataclass(frozen=True)
class TrialRequest:
    """Everything one trial of ``python -m workloads.run`` is asked to do, as one typed record.

    The planner builds it, sweep.json keeps it, the engine fills in what only the
    host knows (``inputs``, ``chdir``, the Ray cluster, ``put``, ``out``) with
    :func:`dataclasses.replace`, and :meth:`argv` is the one place it becomes the
    runner's arguments. Spliced argument lists once put ``--profile`` after a
    ``--command``'s ``--`` (the user's program received it): here the runner's
    options always precede the ``--`` and the command's words always follow it.

    ``command`` is None for a workload trial, else the command's words (one shell
    line with ``shell``). Defaults are the runner's own, so ``from_argv(r.argv())``
    gives ``r`` back.
    """

    workload: str = "cube"  # a registered name or module:Class (not used with a command)
    params: Mapping[str, str] = field(default_factory=dict)  # --param KEY=VALUE
    command: tuple[str, ...] | None = None  # the words after --
    job: bool = False  # --job: {placeholders}, the cloudprof: stdout protocol, output.log
    shell: bool = False  # the command is one shell line
    vars: Mapping[str, str] = field(default_factory=dict)  # --var NAME=VALUE (placeholders)
    workers: int = 1
    duration_s: float | None = None  # None: the runner's default (a command: until it exits)
    units: int | None = None  # stop after this many units
    warmup_s: float = 0.0
    sample_hz: float = 10.0
    memory_budget_bytes: int | None = None
    memory_limit_bytes: int | None = None  # --memory-limit: the tree under a cgroup limit
    profile: str | None = None  # one of PROFILE_KINDS: the same trial, a profiler attached
    ray_nodes: int = 1
    ray_address: str | None = None  # HOST:PORT of the cluster (the engine's to fill)
    ray_node_params: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    ray_node_chdirs: Mapping[int, str] = field(default_factory=dict)
    chdir: str | None = None  # the job's copy on the host
    put: str | None = None  # a workloads.transfer put manifest on the host
    out: str | None = None  # the trial's result directory on the host
    quiet: bool = False

    def __post_init__(self) -> None:
        if self.command is not None and not isinstance(self.command, tuple):
            object.__setattr__(self, "command", tuple(self.command))
        if self.profile is not None and self.profile not in PROFILE_KINDS:
            raise ValueError(f"unknown profile {self.profile!r} (choose from "
                             f"{', '.join(PROFILE_KINDS)})")
        if self.command is None and (self.job or self.shell or self.vars):
            raise ValueError("job, shell and vars go with a command")

    @property
    def is_command(self) -> bool:
        return self.command is not None

    def with_params(self, **params: str) -> TrialRequest:
        """This request with more ``--param`` values (the host's inputs path)."""
        return replace(self, params={**self.params, **params})

    def argv(self) -> list[str]:
        """The arguments of ``python -m workloads.run`` (after the module name)."""
        args: list[str] = []
        if self.command is not None:
            args += ["--command", *(["--job"] if self.job else []),
                     *(["--shell"] if self.shell else [])]
            for name, value in self.vars.items():
                args += ["--var", f"{name}={value}"]
        else:
            args += ["--workload", self.workload]
        for key, value in self.params.items():
            args += ["--param", f"{key}={value}"]
        args += ["--workers", str(self.workers)]
        if self.duration_s is not None:
            args += ["--duration", _number(self.duration_s)]
        if self.units is not None:
            args += ["--units", str(self.units)]
        args += ["--sample-hz", _number(self.sample_hz)]
        if self.warmup_s:
            args += ["--warmup", _number(self.warmup_s)]
        if self.memory_budget_bytes is not None:
            args += ["--memory-budget", str(self.memory_budget_bytes)]
        if self.memory_limit_bytes is not None:
            args += ["--memory-limit", str(self.memory_limit_bytes)]
        if self.profile is not None:
            args += ["--profile", self.profile]
        if self.ray_nodes != 1:
            args += ["--ray-nodes", str(self.ray_nodes)]
        if self.ray_address is not None:
            args += ["--ray-address", self.ray_address]
        for node, params in self.ray_node_params.items():
            for key, value in params.items():
                args += ["--ray-node-param", f"{node}:{key}={value}"]
        for node, path in self.ray_node_chdirs.items():
            args += ["--ray-node-chdir", f"{node}={path}"]
        if self.chdir is not None:
            args += ["--chdir", self.chdir]
        if self.quiet:
            args.append("--quiet")
        if self.put is not None:
            args += ["--put", self.put]
        if self.out is not None:
            args += ["--out", self.out]
        if self.command is not None:
            args += ["--", *self.command]
        return args

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> TrialRequest:
        """The request behind a runner argument list (``argv``'s inverse; sweep.json files
        written before requests were stored hold such lists). ValueError for anything the
        runner's options do not include."""
        words = list(argv)
        command: tuple[str, ...] | None = None
        if "--" in words:
            command = tuple(words[words.index("--") + 1:])
            words = words[:words.index("--")]
        values: dict[str, Any] = {}
        params: dict[str, str] = {}
        variables: dict[str, str] = {}
        node_params: dict[int, dict[str, str]] = {}
        node_chdirs: dict[int, str] = {}
        is_command = False
        i = 0
        while i < len(words):
            flag, value = words[i], None
            if "=" in flag and flag.startswith("--"):
                flag, value = flag.split("=", 1)
            if flag in _SWITCHES:
                if flag == "--command":
                    is_command = True
                else:
                    values[_SWITCHES[flag]] = True
                i += 1
                continue
            if flag not in _VALUED:
                raise ValueError(f"not a runner option: {words[i]!r}")
            if value is None:
                if i + 1 >= len(words):
                    raise ValueError(f"{flag} wants a value")
                value = words[i + 1]
                i += 1
            i += 1
            if flag in ("--param", "--var"):
                key, sep, item = value.partition("=")
                if not sep:
                    raise ValueError(f"{flag} wants NAME=VALUE, got {value!r}")
                (params if flag == "--param" else variables)[key] = item
            elif flag == "--ray-node-param":
                node, _, pair = value.partition(":")
                key, _, item = pair.partition("=")
                node_params.setdefault(int(node), {})[key] = item
            elif flag == "--ray-node-chdir":
                node, _, path = value.partition("=")
                node_chdirs[int(node)] = path
            else:
                name, convert = _VALUED[flag]
                values[name] = convert(value)
        if is_command and command is None:
            command = ()
        return cls(command=command, params=params, vars=variables,
                   ray_node_params=node_params, ray_node_chdirs=node_chdirs, **values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (sweep.json's plan); :meth:`from_dict` reads it back."""
        out = asdict(self)
        out["command"] = None if self.command is None else list(self.command)
        out["params"], out["vars"] = dict(self.params), dict(self.vars)
        out["ray_node_params"] = {str(k): dict(v) for k, v in self.ray_node_params.items()}
        out["ray_node_chdirs"] = {str(k): v for k, v in self.ray_node_chdirs.items()}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialRequest:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}  # a newer writer's extra keys
        if kwargs.get("command") is not None:
            kwargs["command"] = tuple(kwargs["command"])
        kwargs["ray_node_params"] = {int(k): dict(v) for k, v
                                     in (kwargs.get("ray_node_params") or {}).items()}
        kwargs["ray_node_chdirs"] = {int(k): v for k, v
                                     in (kwargs.get("ray_node_chdirs") or {}).items()}
        return cls(**kwargs)


def _number(x: float) -> str:
    """A number as the runner reads it back unchanged (``:g`` rounds to 6 digits)."""
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


_SWITCHES = {"--command": "command", "--job": "job", "--shell": "shell", "--quiet": "quiet"}
_VALUED: dict[str, tuple[str, Any]] = {
    "--workload": ("workload", str), "--param": ("params", str), "--var": ("vars", str),
    "--workers": ("workers", int), "--duration": ("duration_s", float),
    "--units": ("units", int), "--sample-hz": ("sample_hz", float),
    "--warmup": ("warmup_s", float), "--memory-budget": ("memory_budget_bytes", int),
    "--memory-limit": ("memory_limit_bytes", int),
    "--profile": ("profile", str), "--ray-nodes": ("ray_nodes", int),
    "--ray-address": ("ray_address", str), "--ray-node-param": ("ray_node_params", str),
    "--ray-node-chdir": ("ray_node_chdirs", str), "--chdir": ("chdir", str),
    "--put": ("put", str), "--out": ("out", str),
}  # fmt: skip
