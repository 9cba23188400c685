"""What each sweep option's value may be: the parsers and converters of flags and TOML keys.

One converter per option turns what a user typed (a string from the command
line, or a TOML value) into the spec's value, or refuses it with one line that
names the flag. The table of options (``spec/options.py``) says which
converter each option uses; the runner's own limits (``workloads.limits``) are
reused so that the sweep refuses what a VM would.
"""

from __future__ import annotations

import math
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.catalog.machines import check_name, suggest
from orchestrator.errors import BucketError, UsageError
from orchestrator.providers import PROVIDERS as PROVIDER_NAMES  # light: no SDK
from orchestrator.sdk import aws as sdk_aws
from orchestrator.sdk import gcp as sdk_gcp

SEARCH_GOALS = ("cost", "throughput")  # --search: what the pick minimises / maximises
MAX_WORKERS = 4096  # a guard against typos such as 1-10000
MAX_REPEATS = 100
# A sweep's trials (machines × grid points × node counts × worker counts × repeats): each
# is a run on a VM and a row; beyond this a plan is a typo (--grid x=1-1000 pasted twice)
# far more often than a study, and its plan alone filled the laptop's memory.
MAX_GRID_POINTS = 1_000
MAX_TRIALS = 10_000
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WORKLOAD_TARGET_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# Workload parameters end up in sweep.json, reports and VM command lines, so
# anything that looks like a credential is refused rather than recorded.
SECRET_KEY_RE = re.compile(
    r"(secret|passw(or)?d|token|credential|api_?key|access_?key|private_?key)", re.I
)
SECRET_VALUE_RE = re.compile(
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
    return trial_duration(value, where)


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


def string_value(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise UsageError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def string_list(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise UsageError(f"{where}: expected a string or a list of strings, got {value!r}")
    return list(value)


def integer(minimum: int, maximum: int | None = None,
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


def input_size(name: str) -> Callable[[Any, str], int]:
    """--frames, --rows, --cols: within the cube's input limits (``workloads.limits``)."""
    from workloads.limits import INPUT_LIMITS

    return integer(1, *INPUT_LIMITS[name])


MIN_DURATION_S = 0.1  # one sampling period at the default 10 Hz


def trial_duration(value: Any, where: str) -> float:
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


def sample_rate(value: Any, where: str) -> float:
    """The agent's sampling rate, within what the runner accepts (``workloads.limits``)."""
    from workloads import limits

    number = _number(value)
    if math.isnan(number):
        raise UsageError(f"{where}: expected a number of samples per second, got {value!r}")
    try:
        return limits.check_sample_hz(number)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from None


def positive_number(value: Any, where: str) -> float:
    number = _number(value)
    if not number > 0 or not math.isfinite(number):
        raise UsageError(f"{where}: expected a positive number, got {value!r}")
    return number


def choice(value: Any, where: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise UsageError(f"{where}: expected one of {', '.join(choices)}, got {value!r}")
    return str(value)


def vcpu_range(value: Any, where: str) -> list[int]:
    """``8-80`` (a range), ``16`` (exactly) or a [min, max] list from a config file."""
    if isinstance(value, list) and len(value) == 2:
        low, high = (integer(1)(v, where) for v in value)
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


def boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{where}: expected true or false, got {value!r}")
    return value


def param_table(value: Any, where: str) -> dict[str, str]:
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list | str):
        items = [parse_param(p, where) for p in string_list(value, where)]
    else:
        raise UsageError(f"{where}: expected a table of key = value, got {value!r}")
    out: dict[str, str] = {}
    for key, raw in items:
        if not _IDENT_RE.match(key) or isinstance(raw, dict | list):
            raise UsageError(f"{where}: expected name = scalar value, got {key!r}")
        out[key] = str(raw).lower() if isinstance(raw, bool) else str(raw)
    return out


def path_text(value: Any, where: str) -> str:
    return string_value(str(value) if isinstance(value, Path) else value, where)


def strategy_name(value: Any, where: str) -> str:
    value = string_value(value, where)
    if not _IDENT_RE.match(value):
        raise UsageError(f"{where}: invalid strategy name {value!r}")
    return value


def profile_kind(value: Any, where: str) -> str:
    from workloads.protocol import PROFILE_KINDS  # light: constants only

    value = string_value(value, where)
    if value not in PROFILE_KINDS:
        kinds = " or ".join(PROFILE_KINDS)
        raise UsageError(f"{where}: {value!r} is not a profile (choose {kinds})")
    return value


def workload_name(value: Any, where: str) -> str:
    from workloads.base import REGISTRY  # light: no numpy

    value = string_value(value, where)
    if value in REGISTRY or _WORKLOAD_TARGET_RE.match(value):
        return value
    close = suggest(value, REGISTRY)
    hint = f"did you mean {', '.join(close)}?" if close else f"use one of {', '.join(REGISTRY)}"
    raise UsageError(f"{where}: unknown workload {value!r}; {hint} (or module:Class)")


def grid_table(value: Any, where: str) -> dict[str, list[str]]:
    """``name=v1,v2`` (repeatable) or a TOML table ``[grid] name = [v1, v2]``."""
    if isinstance(value, dict):
        items = list(value.items())
    else:
        items = []
        for text in string_list(value, where):
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


def provider_name(value: Any, where: str) -> str:
    value = string_value(value, where)
    if value not in PROVIDER_NAMES:
        raise UsageError(
            f"{where}: unknown provider {value!r}; choose one of {', '.join(PROVIDER_NAMES)}"
        )
    return value


def location_name(kind: str) -> Callable[[Any, str], str]:
    """--region, --zone, --project: a name that can reach no command line but as itself."""
    return lambda value, where: check_name(string_value(value, where), kind)


def bucket_url(value: Any, where: str) -> str:
    return check_bucket(string_value(value, where), where)


def family_list(value: Any, where: str) -> list[str]:
    """--family n2-highcpu,c3 (repeatable) or a TOML list: one family per item."""
    return [f.strip() for item in string_list(value, where) for f in item.split(",") if f.strip()]


def host_list(value: Any, where: str) -> list[str]:
    return [parse_host(h, where) for h in string_list(value, where)]
