"""Every ``cloudprof sweep`` option, declared once.

Each entry holds what the option is everywhere it appears: its flags, its
``--help`` text and panel, its converter (which also reads it from
``sweep.toml``), its ``sweep.toml`` key and aliases, the ``SweepSpec`` field it
fills and the longer text of the reference page. The Typer command
(``orchestrator/cli/sweep.py``), the config reader (``spec/config.py``) and the docs'
option tables (``docs/gen_cli.py``) are all generated from this table, so an
option cannot exist in one of them and not in the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.spec import values as v
from orchestrator.spec.spec import SweepSpec
from workloads.cube_strategies import STRATEGIES
from workloads.limits import INPUT_LIMITS, MAX_SAMPLE_HZ, MIN_SAMPLE_HZ
from workloads.protocol import PROFILE_KINDS

Converter = Callable[[Any, str], Any]

SWEEP = "Sweep"
SEARCH = "Search over machine types"
WORKLOAD = "Workload"
JOB = "Your own job"
CLOUD = "Provider"
LIMITS = "Limits and output"

SIZE_HELP = ("Which --grid variable is the data size (rows, samples, features) for --target; "
             "default: the only numeric one.")
TARGET_HELP = ("Forecast time and peak memory at this size from the sizes swept (e.g. "
               "rows=4000000), per machine, workers and nodes; with --total, the whole job.")
TOTAL_HELP = ("The whole job: N units (runs for a job that reports none); prints its wall time "
              "and dollars per configuration, VM start included.")

KINDS = ("text", "path", "int", "float", "texts", "flag", "switch", "choice")
_DEFAULTS = SweepSpec(machines=[])  # help texts show the spec's own defaults


@dataclass(frozen=True)
class SweepOption:
    """One sweep option. ``kind`` is its command-line shape: text, path (a string on the
    command line, a path in the spec), int, float, texts (repeatable), flag
    (``--x/--no-x``), switch (``--x`` alone) or choice (one of ``choices``)."""

    key: str  # the sweep.toml key, and build_spec's name for the option
    help: str
    panel: str
    kind: str = "text"
    flags: tuple[str, ...] = ()  # default: --<key with dashes>
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    convert: Converter | None = None  # None: a command-line-only option, not in sweep.toml
    doc: str = ""  # the reference page's text; default: the help
    complete: str | None = None  # "machine" or "workload": completed by the shell
    field: str | None = None  # the SweepSpec field; default: the key
    workload_param: bool = False  # lands in SweepSpec.workload_params, not a field
    aliases: tuple[str, ...] = ()  # other sweep.toml spellings of the key

    @property
    def names(self) -> tuple[str, ...]:
        if self.flags:
            return self.flags
        dashed = self.key.replace("_", "-")
        return (f"--{dashed}/--no-{dashed}",) if self.kind == "flag" else (f"--{dashed}",)

    @property
    def flag(self) -> str:
        """The long flag as a user types it (``--adaptive``, ``--hosts``)."""
        return self.names[0].split("/")[0]

    @property
    def param(self) -> str:
        """The command function's parameter name."""
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def spec_field(self) -> str:
        return self.field or self.key

    @property
    def in_config(self) -> bool:
        return self.convert is not None

    @property
    def text(self) -> str:
        return self.doc or self.help


def _opt(key: str, help: str, panel: str, **kw: Any) -> SweepOption:
    return SweepOption(key=key, help=help, panel=panel, **kw)


SWEEP_OPTIONS: tuple[SweepOption, ...] = (
    _opt("machines", "Machine type (repeatable), e.g. n2-highcpu-80, c6i.large.", SWEEP,
         kind="texts", flags=("--machine", "-m"), metavar="TYPE", convert=v.string_list,
         complete="machine", aliases=("machine",),
         doc="machine type, repeatable (`n2-highcpu-80`, `c6i.large`); unknown names get the "
         "nearest suggestions"),
    _opt("workers", "Worker counts: 1,2,4,8 or 1-8 or 1-64:x2 (default: powers of two up to "
         "the vCPUs, the vCPUs, one oversubscribed).", SWEEP, metavar="COUNTS",
         convert=v.parse_workers,
         doc="worker counts (below); default: powers of two up to the vCPUs, the vCPU count, "
         "one oversubscribed point"),
    _opt("nodes", "Scale out: node counts such as 1,2,4 (default 1). Each trial also runs on a "
         "Ray cluster of that many VMs of the machine; needs cloudprof[ray].", SWEEP,
         metavar="COUNTS", convert=lambda value, where: v.parse_nodes(value, where),
         doc="scale out: node counts such as `1,2,4` (default 1); each trial also runs on a "
         "Ray cluster of that many VMs of the machine (see "
         "[Scale out](../tutorials/scale-out.md)); needs `pip install 'cloudprof[ray]'`"),
    _opt("repeats", f"Trials per worker count (default: {_DEFAULTS.repeats}).", SWEEP,
         kind="int", metavar="N",
         convert=v.integer(1, v.MAX_REPEATS, "each repeat runs every trial again; the spread "
                           "is known well from 3 to 10"),
         doc=f"trials per worker count (default {_DEFAULTS.repeats}: the least that gives each "
         "median a spread; see [Picking repeats and duration](../how-to/repeats.md))"),
    _opt("duration", f"Time per trial: 5, 30s, 2m (default: {_DEFAULTS.duration_s:g}s).", SWEEP,
         metavar="TIME", convert=v.trial_duration, field="duration_s", aliases=("duration_s",),
         doc="time per trial: `5`, `30s`, `2m` (at least 0.1 s, one sampling period)"),
    _opt("warmup", "Untimed warm-up before each trial, e.g. 5s: workers allocate their buffers "
         "before the clock and the memory sampler start (default: none).", SWEEP,
         metavar="T", convert=v.parse_warmup, field="warmup_s", aliases=("warmup_s",),
         doc="untimed warm-up before each trial (default none): the workers run, unmeasured "
         "and unsampled, so buffer allocation and cold caches stay out of the rate and the "
         "leak verdict; the plan's estimate counts it"),
    _opt("trial_timeout", "Stop and fail a trial that runs longer than this, e.g. 600 or 10m "
         "(default: from the plan: 4 x the trial's length + 2 min; a fixed-work --command "
         "job: 4 x its slowest finished trial + 2 min, 1 h before the first).", SWEEP,
         metavar="SECONDS", convert=v.parse_duration, field="trial_timeout_s",
         aliases=("trial_timeout_s",),
         doc="stop a trial that runs longer than this (`600`, `10m`) and fail it with `timed "
         "out after N s (--trial-timeout)`; the sweep goes on. Default, from the plan: 4 × "
         "(warm-up + duration) + 2 min (5 min for a profiled or Ray trial); a fixed-work "
         "`--command` job (no `--duration`): 4 × its slowest finished trial of the same "
         "machine and grid point, scaled up by how many fewer workers the next one has, + 2 "
         "min, and 1 h before any finished. The live display shows each running trial's time "
         "against its limit, and `no output for N s` / `no progress for N s` while it is "
         "stuck"),
    _opt("adaptive", "Per machine, start at 1, v/4, v and 2v workers and add the counts that "
         "narrow the predicted peak (USL fit) until it is known within ±10% or the grid's "
         "trial count is spent.", SWEEP, kind="flag", convert=v.boolean,
         doc="per machine, run only the worker counts that narrow the predicted peak (see "
         "[How sure](../measurement/confidence.md)) instead of the whole grid; the grid's "
         "trial count (workers × repeats) is the budget, and the plan and its cost estimate "
         "are the grid's, an upper bound"),
    _opt("search", "Try the candidate machines one at a time, each next one chosen from what "
         "was measured (a Gaussian process, expected improvement), for the lowest cost per "
         "unit or the highest throughput; report the pick and how sure it is.", SEARCH,
         kind="choice", choices=v.SEARCH_GOALS,
         convert=lambda value, where: v.choice(value, where, v.SEARCH_GOALS),
         doc="try the candidate machines one at a time, each next one chosen from what the "
         "others measured, for the lowest cost per unit or the highest throughput (see "
         "[Searching machine types](../how-to/search.md))"),
    _opt("budget", "--search tries at most N machines (default: 3 spread over the candidates "
         "plus √candidates, at least 2, chosen by the model).", SEARCH, kind="int",
         metavar="N", convert=v.integer(1),
         doc="`--search` creates at most N machines (default: 3 spread over the candidates "
         "plus √candidates, at least 2, chosen by the model)"),
    _opt("family", "--search candidates: catalog family or name prefix, e.g. n2-highcpu,c3 "
         "(repeatable).", SEARCH, kind="texts", metavar="FAMILY", convert=v.family_list,
         doc="`--search`'s candidates from the catalog (`--family n2-highcpu,c3`), on top of "
         "any `--machine`; provider and region as given"),
    _opt("vcpus", "--search candidates: vCPUs, e.g. 8-80.", SEARCH, metavar="MIN-MAX",
         convert=v.vcpu_range, doc="`--search`'s candidates with this many vCPUs (`8-80`)"),
    _opt("max_price", "--search candidates: at most this many USD per hour.", SEARCH,
         kind="float", metavar="USD", convert=v.positive_number,
         doc="`--search`'s candidates costing at most this many USD per hour (the spot price "
         "with `--spot`)"),
    _opt("deadline", "--search: only a machine that finishes --total units within this time "
         "may be the pick, e.g. 10m.", SEARCH, metavar="TIME", convert=v.parse_duration,
         field="deadline_s", aliases=("deadline_s",),
         doc="`--search` under a deadline (CherryPick's constraint): with `--total N`, only a "
         "machine whose measured peak rate finishes N units within this time may be the pick "
         "(with `--nodes`, the rate of all a configuration's VMs together), "
         "and each untried machine is weighed by how likely it is to; when none tried "
         "does, the fastest is named and the search says so"),
    _opt("config", "sweep.toml with any of these options; flags override it.", SWEEP,
         kind="path", flags=("--config", "-c"), metavar="FILE",
         doc="a `sweep.toml` holding any of these options (below)"),
    _opt("dry_run", "Print the plan and cost, then run the whole pipeline on this machine: no "
         "cloud call, no credentials.", SWEEP, kind="flag", convert=v.boolean,
         doc="print the plan, every cloud action it stands for and the estimate, then run the "
         "whole pipeline on this machine: no cloud call, no credentials"),
    _opt("plan", "Print the plan and its estimated time and cost, then stop: no VM, no "
         "credentials, no input generated, nothing run or written.", SWEEP, kind="switch",
         doc="print the plan and the estimate, then stop: no credentials, no inputs "
         "generated, nothing created (exit 0)"),
    _opt("resume", "Run only the missing trials of the run directory RUN.", SWEEP, kind="path",
         metavar="RUN",
         doc="run only the trials missing from `RUN` (its spec comes from `RUN/sweep.json`, "
         "so no other option is allowed)"),
    _opt("workload", f"Registered workload or module:Class (default: {_DEFAULTS.workload}).",
         WORKLOAD, metavar="NAME", convert=v.workload_name, complete="workload",
         doc="`cube` (default) or your own `module:Class`, which must be findable here with "
         "`Class` defined in it (its source is read, not run)"),
    _opt("frames", "Input frames (Parquet files).", WORKLOAD, kind="int", metavar="N",
         convert=v.input_size("frames"), workload_param=True,
         doc=f"cube input frames, one Parquet file each (at most "
         f"{INPUT_LIMITS['frames'][0]:,}: each is staged and fetched by every VM)"),
    _opt("dim", "Cube side.", WORKLOAD, kind="int", metavar="N", convert=v.integer(1),
         workload_param=True, doc="cube side: each cube is frames × dim × dim"),
    _opt("rows", "Rows per frame.", WORKLOAD, kind="int", metavar="N",
         convert=v.input_size("rows"), workload_param=True,
         doc=f"rows per cube input frame (at most {INPUT_LIMITS['rows'][0]:,})"),
    _opt("cols", "Columns per frame.", WORKLOAD, kind="int", metavar="N",
         convert=v.input_size("cols"), workload_param=True,
         doc=f"columns per cube input frame (at most {INPUT_LIMITS['cols'][0]:,})"),
    _opt("strategy", "How the cube workload reads its inputs.", WORKLOAD, kind="choice",
         choices=tuple(STRATEGIES), convert=v.strategy_name, workload_param=True,
         doc="how the cube workload builds its cubes: " + ", ".join(STRATEGIES)),
    _opt("seed", "Input generator seed.", WORKLOAD, kind="int", metavar="N",
         convert=v.integer(0), workload_param=True,
         doc="seed of the cube's input generator and column samplers"),
    _opt("params", "key=value for the workload (repeatable).", WORKLOAD, kind="texts",
         flags=("--param", "-p"), metavar="KEY=VALUE", convert=v.param_table,
         aliases=("param",),
         doc="any workload parameter, repeatable (TOML `[params]`); the cube's `inputs=DIR` "
         "must hold readable frames of doubles at least `--dim` wide, checked here before "
         "anything starts"),
    _opt("workdir", "Your project directory, shipped to every machine (honours .gitignore and "
         ".cloudprofignore); trials run in its copy.", JOB, kind="path", metavar="DIR",
         convert=v.path_text,
         doc="your project directory, shipped to every machine "
         "([Your own workload](../tutorials/your-own-job.md))"),
    _opt("setup", "Shell command run in the copy once per (command, workdir, host) and reused "
         "by later sweeps there, e.g. 'pip install -r requirements.txt'.", JOB, metavar="CMD",
         convert=v.string_value,
         doc="shell command run in the shipped copy once per (command, workdir hash, host) "
         "and reused by later sweeps there, e.g. `python -m pip install -r requirements.txt`"),
    _opt("command", "Profile this command at each worker count; {workers} {vcpus} {trial} "
         "{repeat} and grid names are filled in.", JOB, metavar="CMD", convert=v.string_value,
         doc="profile this command (and its children) at each worker count; `{workers}` "
         "`{vcpus}` `{trial}` `{repeat}` and grid names are filled in"),
    _opt("shell", "Run --command through sh -c.", JOB, kind="flag", convert=v.boolean,
         doc="run `--command` through `sh -c` (otherwise it is split with shlex and runs with "
         "no shell)"),
    _opt("grid", "A parameter swept on top of machines x workers (repeatable).", JOB,
         kind="texts", flags=("--grid",), metavar="NAME=V1,V2,...", convert=v.grid_table,
         doc="a parameter swept on top of machines × workers (repeatable; TOML `[grid]`); "
         "with `--command`, each name must reach the job as `{name}` or `$CLOUDPROF_NAME`"),
    _opt("size", SIZE_HELP, JOB, metavar="NAME",
         doc="which `--grid` variable is the data size for `--target` (default: the only "
         "numeric one)"),
    _opt("target", TARGET_HELP, JOB, metavar="[NAME=]SIZE",
         doc="after the sweep, forecast time and peak memory at this size from the sizes "
         "swept, per machine, workers and nodes (see [Forecasts](../measurement/forecast.md)); "
         "checked before anything starts: the grid must sweep a numeric size"),
    _opt("total", TOTAL_HELP, JOB, kind="float", metavar="N", convert=v.positive_number,
         doc="after the sweep, the whole job of N units (runs for a fixed-work job): wall time "
         "and dollars per configuration, the measured VM start included, billed per second "
         "with a one-minute minimum; with `--search --deadline`, the job the deadline is "
         "for"),
    _opt("provider", "Where the machines come from (default: each machine's provider in the "
         "catalog, an SSH host's ssh: one sweep may span them).", CLOUD, kind="choice",
         choices=v.PROVIDER_NAMES, convert=v.provider_name,
         doc="default: each machine's provider in the catalog (`n2-*` → gcp, `c6i.*` → aws; "
         "an SSH host's name → ssh), so one sweep may span them (see "
         "[One sweep across providers](../tutorials/across-clouds.md))"),
    _opt("region", "Region (default: the catalog's first; one cloud only).", CLOUD,
         metavar="REGION", convert=v.location_name("region"),
         doc="where to run; the region must have a catalog price; with machines of both "
         "clouds in one sweep it is refused and each machine runs in its catalog's default "
         "region"),
    _opt("zone", "Zone (sets the region).", CLOUD, metavar="ZONE",
         convert=v.location_name("zone"), doc="a zone, which sets its region"),
    _opt("project", "GCP project.", CLOUD, metavar="ID", convert=v.location_name("project"),
         doc="the Google Cloud project"),
    _opt("bucket", "gs://name, s3://name or a directory for the inputs.", CLOUD,
         metavar="URL", convert=v.bucket_url,
         doc="`gs://name`, `s3://name` or a directory, for the inputs (names are checked "
         "before any VM exists); in a sweep across providers only its own cloud's VMs use "
         "it"),
    _opt("spot", "Spot/preemptible VMs.", CLOUD, kind="flag", convert=v.boolean,
         doc="spot/preemptible VMs (gcp, aws)"),
    _opt("hosts_file", "TOML file of SSH hosts (provider ssh, or beside cloud machines).", CLOUD,
         kind="path", flags=("--hosts",), metavar="FILE", convert=v.path_text,
         doc="a TOML file of the `ssh` provider's hosts; unless `--machine` names some of "
         "them every host is swept, beside any cloud machines"),
    _opt("hosts", "An SSH host (repeatable; provider ssh, or beside cloud machines).", CLOUD,
         kind="texts", flags=("--host",), metavar="USER@ADDRESS[:PORT]", convert=v.host_list,
         aliases=("host",), doc="an SSH host, repeatable, as `--hosts` holds them"),
    _opt("ssh_key", "Private key for --host (instead of a per-sweep key).", CLOUD, kind="path",
         metavar="FILE", convert=v.path_text,
         doc="private key for `--host` (instead of a per-sweep key); refused when encrypted"),
    _opt("max_cost", "Refuse to start when the estimate is above this many USD.", LIMITS,
         kind="float", metavar="USD", convert=v.positive_number,
         doc="refuse to start when the estimated cost is above it (exit 4); a sweep estimated "
         "above $100 needs it"),
    _opt("max_peak_memory", "Memory gate: exit 3 when a trial process peaks above this over its "
         "whole lifetime, loading included (2G, 512MiB); trial:SIZE gates the trial alone.",
         LIMITS, metavar="[trial:]SIZE", convert=v.parse_peak_gate,
         doc="memory gate: exit 3 when any trial process peaks above SIZE over its whole "
         "lifetime, loading data and `prepare()` included (`lifetime:SIZE` says so "
         "explicitly); `trial:SIZE` gates the trial alone (t ≥ 0). The error says when the "
         "worst peak was while loading"),
    _opt("sample_hz", f"Profiling samples per second, {MIN_SAMPLE_HZ:g} to {MAX_SAMPLE_HZ:g} "
         f"(0: only the kernel's peak; default: {_DEFAULTS.sample_hz:g}).", LIMITS,
         kind="float", metavar="HZ", convert=v.sample_rate,
         doc=f"profiling samples per second, {MIN_SAMPLE_HZ:g}–{MAX_SAMPLE_HZ:g} as the "
         "runner takes them (0 = no background sampling, kernel peak only)"),
    _opt("profile", "Also run one extra profiled trial per worker count: cpu (py-spy: top "
         "functions, ~3 % cost), gil (py-spy with native frames: Python / native / GIL-wait "
         "shares, why scaling stops, ~20 % cost) or memory (memray: where the peak comes "
         "from). Kept out of throughput tables.", LIMITS, kind="choice",
         choices=tuple(PROFILE_KINDS), convert=v.profile_kind,
         doc="one extra profiled trial per worker count and grid point (the same trial, the "
         "profiler attached): top functions (py-spy, ~2–3 % cost), why scaling stops (py-spy "
         "with native frames: Python / native / GIL-wait shares, ~22 % cost) or where the "
         "peak comes from (memray); see [Why scaling stops, where the peak comes from]"
         "(../measurement/profiling.md)"),
    _opt("prove_limit", "A --command job: after its trials, run one more per worker count "
         "under a memory cgroup limit equal to the memory request; the report says whether it "
         "ran unchanged or was OOM-killed.", LIMITS, kind="switch", convert=v.boolean,
         doc="a `--command` job: after a machine's trials, one more per worker count with its "
         "process tree in a memory cgroup limited to the report's memory request; the "
         "report's \"Memory request, proven\" table says whether it ran unchanged or was "
         "OOM-killed, with the limit. Kept in `RUN/limits/<machine>-w<N>-limit-<bytes>.json`, "
         "not in the tables. Needs a writable memory cgroup on the host (root, or a delegated "
         "v2 subtree); elsewhere the trial is recorded as not run, with the reason"),
    _opt("find_limit", "As --prove-limit, then bisect the smallest limit the job runs under "
         "(about 5 more trials per worker count).", LIMITS, kind="switch", convert=v.boolean,
         doc="as `--prove-limit`, then bisects the smallest limit the job runs under (between "
         "half its peak and the request, to 3 % or 5 more trials per worker count); the "
         "table shows it, the largest limit that killed it and how far the request is above "
         "it"),
    _opt("report", "Write report.html, report.md and their figures into the results "
         "store at the end (default); --no-report prints the summary alone and leaves "
         "them to `cloudprof report RUN`.", LIMITS, kind="flag", convert=v.boolean,
         doc="write `report.html`, `report.md` and their figures into the results store "
         "when the sweep ends (the default); `--no-report` prints the summary and the "
         "answer alone, and `cloudprof report RUN` writes the files later (the figures "
         "cost about 1.5 s of CPU)"),
    _opt("out", f"Results directory (default: {_DEFAULTS.out}).", LIMITS, kind="path",
         metavar="DIR", convert=v.path_text,
         doc="results directory (default `runs/`); it must be creatable and writable; a "
         "relative one is taken from where you run `cloudprof`"),
)

BY_KEY: dict[str, SweepOption] = {o.key: o for o in SWEEP_OPTIONS}
CONFIG_OPTIONS: tuple[SweepOption, ...] = tuple(o for o in SWEEP_OPTIONS if o.in_config)
CONFIG_KEYS: tuple[str, ...] = tuple(o.key for o in CONFIG_OPTIONS)
ALIASES: dict[str, str] = {a: o.key for o in CONFIG_OPTIONS for a in o.aliases}
PATH_KEYS: tuple[str, ...] = tuple(o.key for o in CONFIG_OPTIONS if o.kind == "path")
WORKLOAD_PARAM_KEYS: tuple[str, ...] = tuple(o.key for o in SWEEP_OPTIONS if o.workload_param)


def flag_name(key: str) -> str:
    """The command-line flag of a config key (``hosts_file`` is ``--hosts``)."""
    return BY_KEY[key].flag


def convert(key: str, value: Any, where: str | None = None) -> Any:
    """``value`` of option ``key`` as the spec holds it, or one UsageError line."""
    converter = BY_KEY[key].convert
    assert converter is not None, f"{key} is not a sweep.toml option"
    return converter(value, where or flag_name(key))


def options_table() -> str:
    """The reference page's table of sweep options, in ``--help``'s order."""
    rows = ["| option | meaning |", "| --- | --- |"]
    for o in SWEEP_OPTIONS:
        names = ", ".join(f"`{n}`" for n in o.names).replace("/", "` / `")
        if o.metavar:
            names += f" `{o.metavar}`"
        elif o.choices:
            names += " `{" + ",".join(o.choices) + "}`"
        rows.append(f"| {names} | {o.text.replace('|', '&#124;')} |")
    return "\n".join(rows)


def config_keys_table() -> str:
    """The reference page's table of ``sweep.toml`` keys: key, aliases, flag."""
    rows = ["| `sweep.toml` key | also | flag |", "| --- | --- | --- |"]
    for o in CONFIG_OPTIONS:
        also = ", ".join(f"`{a}`" for a in o.aliases)
        rows.append(f"| `{o.key}` | {also} | `{o.flag}` |")
    return "\n".join(rows)
