"""From command-line values and an optional ``sweep.toml`` to a validated SweepSpec.

Every sweep option can be written in the TOML file under the flag's name (dashes
or underscores); a flag given on the command line overrides the file. All the
checks that need no cloud call happen here — machine names against the catalog,
worker lists, sizes, durations, hosts, bucket names, the output directory — so a
bad spec fails in a second with one line, before anything is provisioned or paid
for. Paths in the file are relative to the file's directory.
"""

from __future__ import annotations

import json
import math
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.catalog.machines import check_name, load_catalog, lookup, suggest
from orchestrator.errors import BucketError, UsageError
from orchestrator.sdk import aws as sdk_aws
from orchestrator.sdk import gcp as sdk_gcp
from orchestrator.spec.spec import SweepSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MAX_WORKERS = 4096  # a guard against typos such as 1-10000
MAX_REPEATS = 100
# A sweep's trials (machines × grid points × node counts × worker counts × repeats): each
# is a run on a VM and a row; beyond this a plan is a typo (--grid x=1-1000 pasted twice)
# far more often than a study, and its plan alone filled the laptop's memory.
MAX_GRID_POINTS = 1_000
MAX_TRIALS = 10_000
MAX_CONFIG_BYTES = 1 << 20  # a sweep.toml is a few dozen lines
WORKLOAD_PARAM_KEYS = ("frames", "dim", "rows", "cols", "seed", "strategy")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WORKLOAD_TARGET_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# Workload parameters end up in sweep.json, reports and VM command lines, so
# anything that looks like a credential is refused rather than recorded.
_SECRET_KEY_RE = re.compile(
    r"(secret|passw(or)?d|token|credential|api_?key|access_?key|private_?key)", re.I
)
_SECRET_VALUE_RE = re.compile(
    r"(AKIA|ASIA)[0-9A-Z]{16}|-----BEGIN [A-Z ]*PRIVATE KEY-----|ghp_[A-Za-z0-9]{36}"
    r"|xox[baprs]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35}"
)
_PREFIX_RE = re.compile(r"^[A-Za-z0-9._/-]*$")
_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


# ---------------------------------------------------------------- value parsers


def parse_workers(value: Any, where: str = "--workers") -> list[int]:
    """Worker counts from ``1,2,4,8``, ranges and a TOML list; sorted, duplicates dropped.

    Items, comma-separated: ``N``; ``A-B`` (every count from A to B); ``A-B:xF``
    (A, A*F, A*F*F... up to B, e.g. ``1-64:x2`` is 1,2,4,...,64); ``A-B:S``
    (A, A+S, A+2S... up to B, e.g. ``8-32:8`` is 8,16,24,32).
    """
    if isinstance(value, bool):
        raise UsageError(f"{where}: expected worker counts such as 1,2,4,8, got {value!r}")
    if isinstance(value, int):
        items: list[str] = [str(value)]
    elif isinstance(value, str):
        items = [p.strip() for p in value.split(",")]
    elif isinstance(value, list):
        items = [str(v).strip() for v in value]
    else:
        raise UsageError(f"{where}: expected worker counts such as 1,2,4,8, got {value!r}")
    counts: set[int] = set()
    for item in items:
        counts.update(_parse_worker_item(item, where))
    if not counts:
        raise UsageError(f"{where}: no worker counts given")
    return sorted(counts)


def parse_nodes(value: Any, where: str = "--nodes") -> list[int]:
    """Node counts, written like worker counts (``1,2,4``, ``1-8:x2``, a TOML list)."""
    try:
        return parse_workers(value, where)
    except UsageError as exc:
        raise UsageError(str(exc).replace("worker count", "node count")
                         .replace("workers is", "nodes is")) from None


def _parse_worker_item(item: str, where: str) -> list[int]:
    if re.fullmatch(r"-?\d+", item):
        n = int(item)
        if n <= 0:
            raise UsageError(f"{where}: worker counts must be 1 or more, got {n}")
        _check_max(n, where)
        return [n]
    m = re.fullmatch(r"(-?\d+)-(-?\d+)(?::(x?)(\d+))?", item)
    if not m:
        raise UsageError(
            f"{where}: cannot read {item!r}; use counts and ranges such as 1,2,4 or 1-8 or 1-64:x2"
        )
    start, stop = int(m.group(1)), int(m.group(2))
    if start <= 0 or stop <= 0:
        raise UsageError(f"{where}: worker counts must be 1 or more, got {item!r}")
    if stop < start:
        raise UsageError(f"{where}: range {item!r} ends before it starts")
    _check_max(stop, where)
    geometric, step_text = m.group(3) == "x", m.group(4)
    step = int(step_text) if step_text is not None else 1
    if geometric and step < 2:
        raise UsageError(f"{where}: factor in {item!r} must be 2 or more")
    if step < 1:
        raise UsageError(f"{where}: step in {item!r} must be 1 or more")
    if not geometric:
        return list(range(start, stop + 1, step))
    out, n = [], start
    while n <= stop:
        out.append(n)
        n *= step
    return out


def _check_max(n: int, where: str) -> None:
    if n > MAX_WORKERS:
        raise UsageError(f"{where}: {n} workers is more than the {MAX_WORKERS} allowed")


def parse_size(value: Any, where: str = "--max-peak-memory") -> int:
    """Bytes from ``2G``, ``512MiB``, ``1.5GB`` or a number of bytes.

    The runner's own parser (``workloads.limits.parse_size``), so ``2GB`` means
    the same in this gate and in the runner's ``--memory-budget``: K/M/G/T and
    KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000.
    """
    from workloads import limits

    try:
        return limits.parse_size(value)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from None


PEAK_GATES = ("lifetime", "trial")


def parse_peak_gate(value: Any, where: str = "--max-peak-memory") -> tuple[int, str]:
    """``[PHASE:]SIZE`` → (bytes, phase): ``300MiB`` gates the whole lifetime (loading
    included), ``trial:300MiB`` only the trial; ``lifetime:300MiB`` says the default."""
    phase, sep, size = str(value).partition(":") if isinstance(value, str) else ("", "", value)
    if not sep:
        phase, size = "lifetime", value
    phase = phase.strip().lower()
    if phase not in PEAK_GATES:
        raise UsageError(f"{where}: {phase!r} is not a phase; use SIZE, lifetime:SIZE or "
                         f"trial:SIZE, e.g. trial:300MiB")
    return parse_size(size, where), phase


def parse_duration(value: Any, where: str = "--duration") -> float:
    """Seconds from ``5``, ``90s``, ``2m``, ``1.5h`` or ``1d``."""
    if isinstance(value, bool):
        raise UsageError(f"{where}: expected a duration such as 5, 30s, 2m or 1h, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]?)\s*", str(value))
        if not m or m.group(2).lower() not in _DURATION_UNITS:
            raise UsageError(
                f"{where}: expected a duration such as 5, 30s, 2m or 1h, got {value!r}"
            )
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]
    if not seconds > 0 or not math.isfinite(seconds):
        raise UsageError(f"{where}: duration must be positive, got {value!r}")
    return seconds


def parse_warmup(value: Any, where: str = "--warmup") -> float:
    """Like a duration, but 0 (no warm-up, the default) is allowed."""
    if not isinstance(value, bool) and str(value).strip().rstrip("sS").strip() in ("0", "0.0"):
        return 0.0
    return _trial_duration(value, where)


def parse_param(text: str, where: str = "--param") -> tuple[str, str]:
    """``key=value`` for a user's workload (values stay strings; the workload converts)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not _IDENT_RE.match(key):
        raise UsageError(f"{where}: expected key=value with a name as key, got {text!r}")
    return key, value


def parse_host(text: str, where: str = "--host") -> str:
    """Check ``user@address[:port]`` with the ssh provider's own parser; returned unchanged."""
    from orchestrator.providers.ssh import parse_host_spec  # light: paramiko loads on connect

    parse_host_spec(text)
    return text


# bucket URL scheme -> the cloud's naming rules (``orchestrator.sdk``: no SDK is loaded)
_BUCKET_RULES: dict[str, Callable[[str], None]] = {
    "gs": sdk_gcp.validate_bucket_name,
    "s3": sdk_aws.validate_bucket_name,
}


def check_bucket(url: str, where: str = "--bucket") -> str:
    """Refuse bucket URLs the cloud would reject, before any VM is created.

    The naming rules are the ones the buckets themselves check.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme == "file":
        return url  # a local directory (the local provider's bucket)
    if scheme not in _BUCKET_RULES:
        raise BucketError(f"{where}: unsupported bucket URL {url!r}: use gs://, s3:// or a path")
    name, _, prefix = rest.partition("/")
    try:
        _BUCKET_RULES[scheme](name)
    except BucketError as exc:
        raise BucketError(f"{where}: {exc}") from None
    if not _PREFIX_RE.match(prefix):
        raise BucketError(f"{where}: invalid characters in bucket prefix {prefix!r}")
    return url


def check_output_dir(path: Path, where: str = "--out") -> Path:
    """Prove that ``path`` can be created (if missing) and written, without leaving anything.

    A refused spec must leave nothing behind, so the probe file goes into the
    nearest existing ancestor and is removed; the sweep creates ``path`` itself.
    """
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(
            f"{where}: output directory {str(path)!r} cannot be created: "
            f"{str(probe)!r} is not a directory"
        )
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".cloudprof-write-test-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(
            f"{where}: output directory {str(path)!r} is not writable: {reason}"
        ) from None
    return path


# ---------------------------------------------------------------- config keys


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise UsageError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _strings(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise UsageError(f"{where}: expected a string or a list of strings, got {value!r}")
    return list(value)


def _integer(minimum: int, maximum: int | None = None,
             why: str = "") -> Callable[[Any, str], int]:
    """An integer option, ``minimum`` or more and, when given, at most ``maximum``
    (``why`` says what the limit guards)."""
    def convert(value: Any, where: str) -> int:
        if isinstance(value, str) and re.fullmatch(r"-?\d{1,30}", value.strip()):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{where}: expected an integer, got {str(value)[:40]!r}")
        if value < minimum:
            raise UsageError(f"{where}: must be {minimum} or more, got {value}")
        if maximum is not None and value > maximum:
            raise UsageError(f"{where}: must be at most {maximum:,} ({why}), got {value:,}")
        return value

    return convert


def _input_size(name: str) -> Callable[[Any, str], int]:
    """--frames, --rows, --cols: within the cube's input limits (``workloads.limits``)."""
    from workloads.limits import INPUT_LIMITS

    return _integer(1, *INPUT_LIMITS[name])


MIN_DURATION_S = 0.1  # one sampling period at the default 10 Hz


def _trial_duration(value: Any, where: str) -> float:
    """A trial's length, within what the runner accepts (``workloads.limits``)."""
    from workloads import limits

    seconds = parse_duration(value, where)
    if seconds < MIN_DURATION_S:  # it would end before its first sample: an "ok" of nothing
        raise UsageError(f"{where}: {value!r} is too short to measure (one sampling period "
                         f"at the default 10 Hz is {MIN_DURATION_S:g} s); give at least "
                         f"{MIN_DURATION_S:g} s")
    try:
        return limits.check_duration(seconds)
    except ValueError as exc:
        raise UsageError(f"{where}: {value!r} is too long: {exc}") from None


def _number(value: Any) -> float:
    """A TOML or command-line value as a float; NaN for what is not one (booleans too), so
    every range check refuses it."""
    try:
        return float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        return math.nan


def _sample_hz(value: Any, where: str) -> float:
    """The agent's sampling rate, within what the runner accepts (``workloads.limits``)."""
    from workloads import limits

    number = _number(value)
    if math.isnan(number):
        raise UsageError(f"{where}: expected a number of samples per second, got {value!r}")
    try:
        return limits.check_sample_hz(number)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from None


def _positive_number(value: Any, where: str) -> float:
    number = _number(value)
    if not number > 0 or not math.isfinite(number):
        raise UsageError(f"{where}: expected a positive number, got {value!r}")
    return number


def _choice(value: Any, where: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise UsageError(f"{where}: expected one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _vcpu_range(value: Any, where: str) -> list[int]:
    """``8-80`` (a range), ``16`` (exactly) or a [min, max] list from a config file."""
    if isinstance(value, list) and len(value) == 2:
        low, high = (_integer(1)(v, where) for v in value)
    else:
        text = str(value).strip()
        match = re.fullmatch(r"(\d+)\s*(?:-\s*(\d+))?", text)
        if not match:
            raise UsageError(f"{where}: expected a vCPU count or range like 8-80, got {value!r}")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
    if low < 1 or low > high:
        raise UsageError(f"{where}: expected 1 <= min <= max, got {value!r}")
    return [low, high]


def _boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{where}: expected true or false, got {value!r}")
    return value


def _params(value: Any, where: str) -> dict[str, str]:
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list | str):
        items = [parse_param(p, where) for p in _strings(value, where)]
    else:
        raise UsageError(f"{where}: expected a table of key = value, got {value!r}")
    out: dict[str, str] = {}
    for key, raw in items:
        if not _IDENT_RE.match(key) or isinstance(raw, dict | list):
            raise UsageError(f"{where}: expected name = scalar value, got {key!r}")
        out[key] = str(raw).lower() if isinstance(raw, bool) else str(raw)
    return out


def _path(value: Any, where: str) -> str:
    return _string(str(value) if isinstance(value, Path) else value, where)


def _strategy(value: Any, where: str) -> str:
    value = _string(value, where)
    if not _IDENT_RE.match(value):
        raise UsageError(f"{where}: invalid strategy name {value!r}")
    return value


def _profile(value: Any, where: str) -> str:
    from workloads.protocol import PROFILE_KINDS  # light: constants only

    value = _string(value, where)
    if value not in PROFILE_KINDS:
        kinds = " or ".join(PROFILE_KINDS)
        raise UsageError(f"{where}: {value!r} is not a profile (choose {kinds})")
    return value


def _workload(value: Any, where: str) -> str:
    from workloads.base import REGISTRY  # light: no numpy

    value = _string(value, where)
    if value in REGISTRY or _WORKLOAD_TARGET_RE.match(value):
        return value
    close = suggest(value, REGISTRY)
    hint = f"did you mean {', '.join(close)}?" if close else f"use one of {', '.join(REGISTRY)}"
    raise UsageError(f"{where}: unknown workload {value!r}; {hint} (or module:Class)")


def _grid(value: Any, where: str) -> dict[str, list[str]]:
    """``name=v1,v2`` (repeatable) or a TOML table ``[grid] name = [v1, v2]``."""
    if isinstance(value, dict):
        items = list(value.items())
    else:
        items = []
        for text in _strings(value, where):
            name, sep, values = text.partition("=")
            if not sep:
                raise UsageError(f"{where}: expected name=v1,v2,... got {text!r}")
            items.append((name.strip(), values.split(",")))
    out: dict[str, list[str]] = {}
    for name, raw in items:
        if not _IDENT_RE.match(str(name)):
            raise UsageError(f"{where}: grid name {name!r} is not a name like rows")
        if name in ("workers", "vcpus", "trial", "repeat"):
            raise UsageError(f"{where}: {name!r} is a built-in placeholder, not a grid name")
        values = raw if isinstance(raw, list) else str(raw).split(",")
        if any(isinstance(v, dict | list) for v in values):
            raise UsageError(f"{where}: grid {name!r} wants a list of scalar values")
        clean = [str(v).lower() if isinstance(v, bool) else str(v).strip() for v in values]
        if not clean or any(not v for v in clean):
            raise UsageError(f"{where}: grid {name!r} has an empty value")
        if len(set(clean)) != len(clean):
            raise UsageError(f"{where}: grid {name!r} lists a value twice")
        if name in out:
            raise UsageError(f"{where}: grid {name!r} given twice")
        out[str(name)] = clean
    return out


def _provider(value: Any, where: str) -> str:
    from orchestrator.providers import PROVIDERS  # light: no SDK

    value = _string(value, where)
    if value not in PROVIDERS:
        raise UsageError(
            f"{where}: unknown provider {value!r}; choose one of {', '.join(PROVIDERS)}"
        )
    return value


# canonical key -> converter(value, where). Keys are the long flag names with "_".
# "machines" and "hosts" are the repeatable --machine and --host flags, "hosts_file"
# is --hosts, "duration" is SweepSpec.duration_s, "params" is --param.
_CONVERTERS: dict[str, Callable[[Any, str], Any]] = {
    "machines": _strings,
    "workers": parse_workers,
    "repeats": _integer(1, MAX_REPEATS, "each repeat runs every trial again; the spread is "
                        "known well from 3 to 10"),
    "nodes": lambda v, w: parse_nodes(v, w),
    "duration": _trial_duration,
    "warmup": parse_warmup,
    "trial_timeout": parse_duration,
    "workload": _workload,
    "frames": _input_size("frames"),
    "dim": _integer(1),
    "rows": _input_size("rows"),
    "cols": _input_size("cols"),
    "strategy": _strategy,
    "seed": _integer(0),
    "params": _params,
    "provider": _provider,
    "region": lambda v, w: check_name(_string(v, w), "region"),
    "zone": lambda v, w: check_name(_string(v, w), "zone"),
    "project": lambda v, w: check_name(_string(v, w), "project"),
    "bucket": lambda v, w: check_bucket(_string(v, w), w),
    "spot": _boolean,
    "max_cost": _positive_number,
    "max_peak_memory": parse_peak_gate,
    "sample_hz": _sample_hz,
    "profile": _profile,
    "prove_limit": _boolean,
    "find_limit": _boolean,
    "out": _path,
    "dry_run": _boolean,
    "adaptive": _boolean,
    "search": lambda v, w: _choice(v, w, ("cost", "throughput")),
    "budget": _integer(1),
    "family": lambda v, w: [f.strip() for item in _strings(v, w) for f in item.split(",")
                            if f.strip()],
    "vcpus": lambda v, w: _vcpu_range(v, w),
    "max_price": _positive_number,
    "hosts_file": _path,
    "hosts": lambda v, w: [parse_host(h, w) for h in _strings(v, w)],
    "ssh_key": _path,
    "workdir": _path,
    "setup": _string,
    "command": _string,
    "shell": _boolean,
    "grid": _grid,
}
CONFIG_KEYS = tuple(_CONVERTERS)
_ALIASES = {
    "machine": "machines",
    "host": "hosts",
    "param": "params",
    "duration_s": "duration",
    "warmup_s": "warmup",
    "trial_timeout_s": "trial_timeout",
}
_PATH_KEYS = ("out", "hosts_file", "ssh_key", "workdir")
_FLAG_NAMES = {"machines": "machine", "hosts": "host", "hosts_file": "hosts", "params": "param"}


def flag_name(key: str) -> str:
    """The command-line flag of a config key (``hosts_file`` is ``--hosts``)."""
    return "--" + _FLAG_NAMES.get(key, key).replace("_", "-")


def read_config(path: Path) -> dict[str, Any]:
    """The options of a ``sweep.toml``, converted; paths made relative to its directory.

    Only a regular file is read: a FIFO or a terminal would block the read forever, a
    device never end it."""
    import stat

    try:
        st = path.stat()
    except OSError as exc:
        raise UsageError(f"--config: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a pipe, device or socket"
        raise UsageError(f"--config: {str(path)!r} is {kind}, not a sweep.toml file")
    if st.st_size > MAX_CONFIG_BYTES:
        raise UsageError(f"--config: {str(path)!r} is {st.st_size:,} bytes; a sweep.toml "
                         f"is at most {MAX_CONFIG_BYTES:,}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--config: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--config: {str(path)!r} is not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once per level of nesting
        raise UsageError(f"{path}: invalid TOML: nested too deeply") from None
    out: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        key = _ALIASES.get(key, key)
        if key != "params":  # workload parameters are checked by name too, later
            refuse_secrets(value, f"{path}: {raw_key}")
        if key not in _CONVERTERS:
            close = suggest(key, [*CONFIG_KEYS, *_ALIASES])
            hint = (
                f"; did you mean {close[0]!r}?"
                if close
                else f"; valid keys: {', '.join(CONFIG_KEYS)}"
            )
            raise UsageError(f"{path}: unknown key {raw_key!r}{hint}")
        if key in out:
            raise UsageError(f"{path}: {raw_key!r} given twice (as {key!r} and an alias)")
        out[key] = _CONVERTERS[key](value, f"{path}: {raw_key}")
    for key in _PATH_KEYS:
        if key in out:
            out[key] = str(path.parent / Path(out[key]).expanduser())
    return out


def refuse_secrets(value: Any, where: str) -> None:
    """Refuse an option value that looks like a credential, without echoing it.

    Options end up in sweep.json, error messages and VM command lines; a key
    pasted into the wrong field must stop the sweep before any of those sees it.
    """
    if isinstance(value, dict):
        for item in value.values():
            refuse_secrets(item, where)
    elif isinstance(value, list | tuple):
        for item in value:
            refuse_secrets(item, where)
    elif isinstance(value, str | Path) and _SECRET_VALUE_RE.search(str(value)):
        raise UsageError(f"{where}: the value looks like a credential; cloudprof records its "
                         "options, so it refuses secrets in them (not shown here)")


# ---------------------------------------------------------------- the spec


def build_spec(cli: dict[str, Any], config: Path | None = None) -> SweepSpec:
    """A validated SweepSpec from the values given on the command line and the file.

    ``cli`` maps CONFIG_KEYS to what was given; None (or an empty list) means
    "not given", so the file's value, then the SweepSpec default, applies.
    """
    unknown = set(cli) - set(_CONVERTERS)
    if unknown:  # a programming error in the caller, not a user error
        raise ValueError(f"unknown option keys {sorted(unknown)}")
    values = read_config(config) if config is not None else {}
    file_params = values.pop("params", {})
    for key, value in cli.items():
        if key != "params":  # workload parameters are checked by name too, later
            refuse_secrets(value, flag_name(key))
    given = {
        key: _CONVERTERS[key](value, flag_name(key))
        for key, value in cli.items()
        if value is not None and value != [] and value != {}
    }
    cli_params = given.pop("params", {})
    values.update(given)

    params: dict[str, Any] = {**file_params}
    for key in WORKLOAD_PARAM_KEYS:
        if key in values and key not in given:
            params[key] = values.pop(key)
    params.update(cli_params)
    for key in WORKLOAD_PARAM_KEYS:
        if key in given:
            params[key] = values.pop(key)

    spec = SweepSpec(machines=values.pop("machines", []), workload_params=params)
    renamed = {"duration": "duration_s", "warmup": "warmup_s",
               "trial_timeout": "trial_timeout_s"}
    for key, value in values.items():
        if key in _PATH_KEYS:
            value = Path(value).expanduser()
        if key == "max_peak_memory":
            value, spec.peak_gate = value
        setattr(spec, renamed.get(key, key), value)
    if spec.command is not None and "duration" in values:
        spec.stop_after_s = spec.duration_s  # a job runs to completion unless --duration says
    if spec.adaptive and spec.grid:
        raise UsageError("--adaptive picks worker counts for one workload: drop --grid (or "
                         "run one adaptive sweep per grid point)")
    return validate_spec(spec)


def _region_of_zone(zone: str, provider: str) -> str:
    if provider == "aws":  # us-east-1a -> us-east-1
        return zone.rstrip("abcdefghijklmnopqrstuvwxyz")
    return zone.rsplit("-", 1)[0]  # us-central1-a -> us-central1


CLOUDS = ("gcp", "aws")


def machine_owners(spec: SweepSpec) -> dict[str, list[str]]:
    """The machines of a sweep without ``--provider``, by provider, in the order given.

    An SSH host's (or hosts-file group's) name is the ssh provider's; any other
    name is its catalog row's provider. When the hosts are given but no
    ``--machine`` names one of them, every host joins (``ssh`` maps to []), as
    in a sweep of the hosts alone.
    """
    from orchestrator.errors import UnknownMachineError

    ssh_machines: list[str] = []  # what --machine selects from
    ssh_names: list[str] = []  # and the hosts of groups, which name their group in errors
    if spec.hosts or spec.hosts_file:
        from orchestrator.providers.base import ProviderOptions
        from orchestrator.providers.ssh import SshProvider

        _existing_file(spec.hosts_file, "--hosts")
        provider = SshProvider(ProviderOptions(hosts_file=spec.hosts_file,
                                               hosts=list(spec.hosts)))
        ssh_machines = provider.machines()
        ssh_names = ssh_machines + [n for n in provider.hosts if n not in ssh_machines]
    owners: dict[str, list[str]] = {}
    for name in spec.machines:
        if name in ssh_names:
            owner = "ssh"
        else:
            try:
                owner = lookup(name).provider
            except UnknownMachineError:
                if not ssh_names:
                    raise
                raise UsageError(f"--machine {name!r} is not one of the ssh hosts: "
                                 f"{', '.join(ssh_machines)} "
                                 "(nor a machine type in the catalog)") from None
        owners.setdefault(owner, []).append(name)
    if ssh_names and "ssh" not in owners:
        owners["ssh"] = []
    return owners


def resolve_provider(spec: SweepSpec) -> str | None:
    """The spec's provider, defaulting to the machines' provider in the catalog (ssh for
    the --host/--hosts names); None when the machines span several providers."""
    if spec.provider is not None:
        return spec.provider
    owners = machine_owners(spec)
    return next(iter(owners)) if len(owners) == 1 else None


def machine_providers(spec: SweepSpec) -> dict[str, str]:
    """Each machine of a validated spec -> the provider it runs on."""
    if spec.provider is not None:
        return dict.fromkeys(spec.machines, spec.provider)
    owners = machine_owners(spec)
    out = {name: provider for provider, names in owners.items() for name in names}
    return {name: out.get(name, "ssh") for name in spec.machines}  # the hosts named by none


def _check_location(spec: SweepSpec, provider: str) -> None:
    """--zone sets --region, and must lie in it (``provider``: the sweep's one cloud)."""
    if spec.zone and not spec.region:
        spec.region = _region_of_zone(spec.zone, provider)
    if spec.zone and spec.region and not spec.zone.startswith(spec.region):
        raise UsageError(f"--zone {spec.zone} is not in --region {spec.region}")


def _check_mixed(spec: SweepSpec) -> None:
    """A sweep whose machines span providers (GCP, AWS, the SSH hosts): one plan.

    ``--region``/``--zone`` name one cloud's location, so they apply only when one cloud
    is in the sweep (beside the SSH hosts); with both clouds each machine runs in its
    catalog's default region, which the plan shows."""
    owners = machine_owners(spec)
    clouds = [p for p in CLOUDS if p in owners]
    if len(clouds) > 1 and (spec.region or spec.zone):
        flag = "--region" if spec.region else "--zone"
        raise UsageError(f"{flag} names one cloud's location and this sweep spans "
                         f"{' and '.join(clouds)}: drop it (each machine runs in its "
                         "catalog's default region, shown by --plan) or run one sweep per "
                         "cloud")
    if clouds and len(clouds) == 1:
        _check_location(spec, clouds[0])
    for provider in clouds:
        for name in owners[provider]:
            _check_cloud_machine(name, spec, provider)
    machines = [n for p in clouds for n in owners[p]]
    if "ssh" in owners:
        if spec.spot:
            raise UsageError("--spot applies to gcp and aws, not the ssh hosts: drop --spot "
                             "or run the hosts in a sweep of their own")
        machines += _check_ssh_machines(spec, owners["ssh"])
    spec.machines = [n for n in spec.machines if n in machines] + [
        n for n in machines if n not in spec.machines]


def _check_cloud_machine(name: str, spec: SweepSpec, provider: str | None = None) -> None:
    provider = provider or spec.provider
    assert provider is not None
    known = [m for m in load_catalog() if m.name == name]
    if known and all(m.provider != provider for m in known):
        raise UsageError(
            f"{name!r} is an {known[0].provider} machine type, not {provider}; "
            f"drop --provider or use --provider {known[0].provider}"
        )
    machine = lookup(name, provider, spec.region)
    if spec.spot and machine.price_spot is None:
        raise UsageError(f"{name!r} has no spot price in the catalog; drop --spot")


def _existing_file(path: Path | None, flag: str) -> None:
    if path is not None and not path.is_file():
        raise UsageError(f"{flag}: no such file {str(path)!r}")


def _check_workload_params(spec: SweepSpec) -> None:
    """Refuse secrets, and let a registered workload reject its parameters now.

    Constructing a workload only parses its parameters (``prepare`` does the
    work). A user's ``module:Class`` must be findable here, with the class
    defined in it; its code is not run (it may need what only the VM has).
    """
    from workloads.base import REGISTRY, WorkloadInputError, load_workload
    from workloads.limits import check_workload_target

    for key, value in spec.workload_params.items():
        if _SECRET_KEY_RE.search(key) or _SECRET_VALUE_RE.search(str(value)):
            raise UsageError(
                f"workload parameter {key!r} looks like a credential; parameters are recorded "
                "in the results store and on VM command lines, so cloudprof refuses them"
            )

    if spec.workload not in REGISTRY:
        try:
            check_workload_target(spec.workload, [spec.workdir] if spec.workdir else ())
        except ValueError as exc:
            raise UsageError(f"--workload {spec.workload}: {exc}") from None
        _check_installed_workload(spec)
        return
    try:
        load_workload(spec.workload)(**{k: str(v) for k, v in spec.workload_params.items()})
    except WorkloadInputError as exc:
        raise UsageError(str(exc)) from None


def _check_installed_workload(spec: SweepSpec) -> None:
    """A ``module:Class`` must name a ``workloads.base.Workload`` subclass: ``os:system`` is
    refused here, not by the runner on a VM that was paid for.

    A module of the standard library or of cloudprof's ``workloads`` (or one already
    imported) is imported and the class checked. A user's module is not run here (it
    may need what only the VM has): its source is read, and a function, or a class with
    no base at all, is refused; anything else only the import on the VM can tell.
    """
    import ast
    import importlib

    from workloads.base import Workload
    from workloads.limits import _find_module

    module, _, attr = spec.workload.partition(":")
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top == "workloads" or module in sys.modules:
        try:
            found = getattr(importlib.import_module(module), attr, None)
        except Exception:  # the VM's Python may differ; its runner says so
            return
        if not (isinstance(found, type) and issubclass(found, Workload)):
            raise UsageError(f"--workload {spec.workload}: {attr!r} is not a subclass of "
                             "workloads.base.Workload")
        return
    found_spec = _find_module(module, [str(spec.workdir)] if spec.workdir else [])
    origin = found_spec.origin if found_spec is not None else None
    if not origin or not origin.endswith(".py"):
        return
    try:
        tree = ast.parse(Path(origin).read_bytes(), filename=origin)
    except (OSError, SyntaxError, ValueError):
        return  # check_workload_target has said so already
    for node in tree.body:
        plain_class = isinstance(node, ast.ClassDef) and not node.bases and not node.keywords
        function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if getattr(node, "name", None) == attr and (plain_class or function):
            what = "a function" if function else "a class with no base"
            raise UsageError(f"--workload {spec.workload}: {attr!r} is {what} in {origin}, "
                             "not a subclass of workloads.base.Workload")


def _check_job(spec: SweepSpec) -> None:
    """--workdir, --setup, --command, --shell and --grid, checked before anything is paid for."""
    if spec.workdir is not None and not spec.workdir.is_dir():
        raise UsageError(f"--workdir: {str(spec.workdir)!r} is not a directory")
    if spec.setup is not None and spec.workdir is None:
        raise UsageError("--setup runs in the job's copy: give --workdir too")
    if spec.shell and spec.command is None:
        raise UsageError("--shell applies to --command")
    if spec.command is not None:
        from orchestrator.spec.job import check_command

        check_command(spec.command, spec.shell, spec.grid)
        _check_grid_used(spec)
        for key, value in spec.grid.items():
            if _SECRET_VALUE_RE.search(key) or any(_SECRET_VALUE_RE.search(v) for v in value):
                raise UsageError(f"--grid {key}: a value looks like a credential")
    clash = sorted(set(spec.grid) & set(spec.workload_params))
    if clash and spec.command is None:
        raise UsageError(f"--grid {clash[0]} is also given as a workload parameter; give it once")


GRID_SCAN_BYTES = 64 * 2**20  # how much of --workdir is read looking for $CLOUDPROF_<NAME>


def _check_grid_used(spec: SweepSpec) -> None:
    """Each --grid name must reach the job: as ``{name}`` in --command or --setup, or as
    ``CLOUDPROF_<NAME>`` (the job's environment) in the command or the job's files; else
    every value runs the same trial and the sweep reports differences that are noise.
    A workdir too big to read through is given the benefit of the doubt."""
    from workloads.job import placeholders

    used = set(placeholders(spec.command or "")) | set(placeholders(spec.setup or ""))
    unused = [name for name in spec.grid if name not in used
              and f"CLOUDPROF_{name.upper()}" not in (spec.command or "")]
    if not unused or (spec.workdir is not None and _mentioned(spec.workdir, unused)):
        return
    name = unused[0]
    raise UsageError(f"--grid {name}: the command never uses it ({{{name}}} or "
                     f"$CLOUDPROF_{name.upper()}), so every {name} would run the same trial")


def _mentioned(root: Path, names: list[str]) -> bool:
    """Whether some file under ``root`` names ``CLOUDPROF_<NAME>`` of every one of
    ``names`` (or the files are too many to tell)."""
    wanted = {f"CLOUDPROF_{n.upper()}".encode() for n in names}
    budget = GRID_SCAN_BYTES
    for path in sorted(root.rglob("*")):
        try:
            if not path.is_file() or path.is_symlink():
                continue
            data = path.read_bytes()[:budget]
        except OSError:
            continue
        budget -= len(data)
        wanted = {w for w in wanted if w not in data}
        if not wanted or budget <= 0:
            return True
    return False


def _check_trial_count(spec: SweepSpec) -> None:
    """At most MAX_GRID_POINTS grid points and MAX_TRIALS trials, counted, not listed."""
    points = math.prod(len(values) for values in spec.grid.values())
    if points > MAX_GRID_POINTS:
        sizes = " × ".join(f"{len(v)} {k}" for k, v in spec.grid.items())
        raise UsageError(f"--grid: {sizes} is {points:,} grid points, above the "
                         f"{MAX_GRID_POINTS:,} a sweep may have (each is a curve of its own)")
    machines = max(len(spec.machines or []), 1)
    workers = max(len(spec.workers or []), 1)  # none given: the machine's default, counted 1
    nodes = max(len(spec.nodes or []), 1)
    trials = machines * points * nodes * workers * spec.repeats
    if trials > MAX_TRIALS:
        raise UsageError(
            f"{machines} machine(s) × {points:,} grid point(s) × {nodes} node "
            f"count(s) × {workers} worker count(s) × {spec.repeats} repeat(s) is {trials:,} "
            f"trials, above the {MAX_TRIALS:,} a sweep may run (each is a run on a VM); "
            "split it into several sweeps")


def _check_trial_ids(spec: SweepSpec) -> None:
    """Every trial gets an id of its own: two --grid values that slug to one id would make
    one trial silently overwrite the other's row and files."""
    if not spec.grid:
        return
    from orchestrator.plan.planner import trial_id_clash

    clash = trial_id_clash(spec.grid, spec.nodes)
    if clash is not None:
        first, second, tid = clash
        raise UsageError(f"--grid: {first} and {second} give the same trial id "
                         f"(<machine>-{tid}-w<workers>-r<repeat>), "
                         "which names each trial's row and files; make the values differ "
                         "in letters, digits, '.', '_' or '-'")


def _check_ssh_machines(spec: SweepSpec, names: list[str] | None = None) -> list[str]:
    """The ssh machines the sweep runs on, of ``names`` (default --machine; all of the
    hosts' when it names none): hosts, and groups of hosts (hosts file ``machine``) with
    enough hosts for --nodes."""
    from orchestrator.providers.base import ProviderOptions
    from orchestrator.providers.ssh import SshProvider

    provider = SshProvider(ProviderOptions(hosts_file=spec.hosts_file, hosts=list(spec.hosts)))
    known = provider.machines()
    names = spec.machines if names is None else names
    for name in names:
        if name not in known:
            if name in provider.hosts:
                provider.machine_hosts(name)  # a group's node: the error names its machine
            raise UsageError(f"--machine {name!r} is not one of the ssh hosts: "
                             f"{', '.join(known)}")
    machines = names or known
    for name in machines:
        provider.check_node_count(name, max(spec.nodes, default=1))
    _check_host_keys(spec, [h for m in machines for h in provider.machine_hosts(m)])
    return machines


def _check_host_keys(spec: SweepSpec, hosts: list[Any]) -> None:
    """Each host's own ``key_file`` readable, a private key, not encrypted: found now, not
    when the first trial logs in."""
    from orchestrator.providers.remote import public_line

    for host in hosts:
        if host.key_file is None:
            continue
        try:
            public_line(Path(host.key_file))
        except UsageError as exc:
            where = f"hosts file {spec.hosts_file}, " if spec.hosts_file else ""
            raise UsageError(f"{where}host {host.name}: {exc}") from None


def search_candidates(spec: SweepSpec) -> list[str]:
    """``--search``'s machine types: the --machine names plus the catalog rows matching
    --family, --vcpus and --max-price (provider and region as given), once each."""
    from orchestrator.catalog.machines import filter_catalog, sort_catalog

    names = list(spec.machines)
    if spec.family or spec.vcpus or spec.max_price is not None:
        rows = load_catalog(spec.provider if spec.provider in ("gcp", "aws") else None)
        low, high = spec.vcpus or (None, None)
        for family in spec.family or [None]:
            if family is not None and not filter_catalog(rows, family=family):
                close = suggest(family, {m.family for m in rows}
                                | {m.name.rsplit("-", 1)[0] for m in rows})
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise UsageError(f"--family: {family!r} is not in the catalog{hint}")
            found = filter_catalog(rows, family=family, region=spec.region, min_vcpus=low,
                                   max_vcpus=high, max_price=spec.max_price, spot=spec.spot)
            names += [m.name for m in sort_catalog(found, "vcpus", spot=spec.spot)]
    return list(dict.fromkeys(names))


def _check_search(spec: SweepSpec) -> None:
    """--search and its candidate filters, resolved into ``spec.machines`` before the plan."""
    filters = [flag for flag, given in (("--family", spec.family), ("--vcpus", spec.vcpus),
                                        ("--max-price", spec.max_price is not None),
                                        ("--budget", spec.budget is not None)) if given]
    if spec.search is None:
        if filters:
            raise UsageError(f"{filters[0]} selects the machines --search tries: add "
                             "--search cost|throughput (or name machines with --machine)")
        return
    if spec.provider in ("ssh", "local") or spec.hosts or spec.hosts_file:
        raise UsageError("--search picks machine types from the catalog (gcp or aws; with "
                         "--dry-run it runs on this machine): drop --provider ssh/local")
    if spec.grid:
        raise UsageError("--search compares machines on one workload: drop --grid")
    spec.machines = search_candidates(spec)
    if len(spec.machines) < 2:
        raise UsageError(f"--search needs at least 2 candidate machines, found "
                         f"{len(spec.machines)}: widen --family/--vcpus/--max-price or add "
                         "--machine (see `cloudprof catalog`)")


def _check_nodes(spec: SweepSpec) -> None:
    """--nodes above 1 needs Ray here (refused before anything is paid for) and trials
    that a Ray cluster can run: the adaptive loop and profiled trials are one-VM."""
    if max(spec.nodes, default=1) <= 1:
        return
    if spec.adaptive:
        raise UsageError("--adaptive searches worker counts on one VM: drop --nodes (or "
                         "--adaptive)")
    if spec.profile:
        raise UsageError("--profile attributes one process: drop --nodes (or --profile)")
    from orchestrator.ray_support import require_ray

    require_ray(max(spec.nodes))


def _check_limits(spec: SweepSpec) -> None:
    """--prove-limit/--find-limit put a command's process tree under a cgroup limit: a
    workload in the runner's own process would take the runner down with it."""
    flag = "--find-limit" if spec.find_limit else "--prove-limit" if spec.prove_limit else None
    if flag is None:
        return
    if spec.command is None:
        raise UsageError(f"{flag} runs a --command job under a memory limit: add --command")
    if max(spec.nodes, default=1) > 1:
        raise UsageError(f"{flag} limits one host's process tree: drop --nodes")
    if spec.adaptive or spec.search:
        raise UsageError(f"{flag} proves a plain sweep's memory request: drop --adaptive/--search")


def validate_spec(spec: SweepSpec) -> SweepSpec:
    """Cross-option checks; fills in the provider, the region (from the zone), ssh machines."""
    from orchestrator.spec.environment import check_environment

    check_environment()
    _check_search(spec)
    for name in spec.machines:
        check_name(name)
    if len(set(spec.machines)) != len(spec.machines):
        raise UsageError("a machine is given twice; list each machine once")
    if not spec.machines and spec.provider != "ssh" and not (spec.hosts or spec.hosts_file):
        raise UsageError("no machine given: use --machine NAME (see `cloudprof catalog`)")
    spec.provider = resolve_provider(spec)
    if spec.provider is None:
        _check_mixed(spec)
    elif spec.provider in CLOUDS:
        _check_location(spec, spec.provider)
        for name in spec.machines:
            _check_cloud_machine(name, spec)
        if spec.hosts or spec.hosts_file:
            raise UsageError(f"--host/--hosts are for --provider ssh, not {spec.provider}")
    else:
        if spec.spot:
            raise UsageError(f"--spot applies to gcp and aws, not --provider {spec.provider}")
        if spec.provider == "ssh":
            if not (spec.hosts or spec.hosts_file):
                raise UsageError("--provider ssh needs --host user@address or --hosts hosts.toml")
            _existing_file(spec.hosts_file, "--hosts")
            spec.machines = _check_ssh_machines(spec)
        elif not spec.machines:
            raise UsageError("no machine given: use --machine NAME (see `cloudprof catalog`)")
    _check_workload_params(spec)
    _check_job(spec)
    _check_nodes(spec)
    _check_trial_count(spec)
    _check_trial_ids(spec)
    _check_limits(spec)
    _existing_file(spec.ssh_key, "--ssh-key")
    if spec.ssh_key is not None:
        from orchestrator.providers.remote import public_line

        public_line(Path(spec.ssh_key).expanduser())  # a private key, and not encrypted
    check_output_dir(spec.out)
    return spec


def load_run_spec(run_dir: Path) -> SweepSpec:
    """The spec recorded in ``RUN/sweep.json`` (for ``--resume``)."""
    from orchestrator.results.store import SWEEP_FILE

    path = run_dir / SWEEP_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        spec = SweepSpec.from_dict(data["spec"])
    except FileNotFoundError:
        raise UsageError(
            f"--resume: {str(run_dir)!r} is not a run directory (no {SWEEP_FILE})"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--resume: cannot read the spec in {path}: {exc}") from None
    return spec
