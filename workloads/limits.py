"""What the trial runner accepts, defined once for the runner and the sweep.

A sweep must refuse before any VM is billed every value that the runner on
that VM would refuse after it. ``workloads`` never imports ``orchestrator``,
so the definitions live here and ``orchestrator.spec.values`` calls them: the
sample-rate range, the longest trial, sizes, and whether ``module:Class``
can be found. Every check raises ``ValueError`` with a message that names the
value; each caller adds its own flag and error type. This module imports only
the standard library: the CLI loads it while parsing options.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path

# 0 = no background sampling: one sample at start and stop, and the kernel's exact peak
# (the agent's baseline). Above 100 Hz the sampler process's reads of /proc cost more
# than the 1% of a core the agent is allowed (docs/benchmarks.md), and a 10 ms interval is
# already below what a busy machine's scheduler keeps.
MIN_SAMPLE_HZ = 0.0
MAX_SAMPLE_HZ = 100.0

# The longest trial. Far beyond any useful profile, and far inside what timers take:
# threading's TIMEOUT_MAX is ~292 years, but 99999999999d used to reach a timer thread
# and fail there with an OverflowError while the trial ran unbounded.
MAX_DURATION_S = 7 * 86400.0

# The cube's generated inputs: the largest of each size, and why (a typo such as
# --frames 10000000000 used to run out of memory on the laptop after up to a minute).
INPUT_LIMITS: dict[str, tuple[int, str]] = {
    "frames": (10_000, "each frame is a file staged in the bucket and fetched by every VM"),
    "rows": (100_000, "one frame of rows × cols float64 is held in memory at once"),
    "cols": (100_000, "one frame of rows × cols float64 is held in memory at once"),
}
MAX_INPUT_BYTES = 1 << 40  # 1 TiB of float64: every trial loads all frames, no VM holds more


def check_input_size(name: str, value: int) -> int:
    """One of ``INPUT_LIMITS``' sizes, within its limit (the message says why)."""
    limit, why = INPUT_LIMITS[name]
    if value > limit:
        raise ValueError(f"{name} must be at most {limit:,} ({why}), got {value:,}")
    return value


def check_input_bytes(frames: int, rows: int, cols: int) -> int:
    """The inputs' size as float64 in memory, at most MAX_INPUT_BYTES."""
    size = frames * rows * cols * 8
    if size > MAX_INPUT_BYTES:
        raise ValueError(
            f"frames × rows × cols is {format_size(size)} of float64, above the "
            f"{format_size(MAX_INPUT_BYTES)} limit (every trial loads all frames)")
    return size


# Sizes: K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024 (as `free`, `ulimit` and
# /proc count memory); KB/MB/GB/TB are powers of 1000 (SI, as disk vendors count).
# A bare number is bytes. Both `cloudprof sweep --max-peak-memory` and
# `python -m workloads.run --memory-budget` read sizes with parse_size.
SIZE_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}  # fmt: skip
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")
SIZE_EXAMPLES = "2G, 512MiB, 1.5GB or a number of bytes"


def parse_size(value: str | int | float) -> int:
    """Bytes from ``2G``, ``512MiB``, ``1.5GB`` or a number of bytes (see SIZE_UNITS)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as {SIZE_EXAMPLES}, got {value!r}")
    if isinstance(value, int | float):
        number, unit = float(value), ""
    else:
        m = _SIZE_RE.fullmatch(str(value))
        if not m or m.group(2).lower() not in SIZE_UNITS:
            raise ValueError(f"expected a size such as {SIZE_EXAMPLES}, got {value!r}")
        number, unit = float(m.group(1)), m.group(2).lower()
    if not math.isfinite(number) or int(number * SIZE_UNITS[unit]) <= 0:
        raise ValueError(f"size must be positive, got {value!r}")
    return int(number * SIZE_UNITS[unit])


def format_size(n: int | float) -> str:
    """``2147483648`` → ``2 GiB`` (binary units, three significant digits) for messages."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            break
        size /= 1024
    if unit == "B":
        return f"{int(size)} B"
    return f"{size:.3g} {unit}" if abs(size) < 1000 else f"{size:,.0f} {unit}"


def check_sample_hz(value: float) -> float:
    """The agent's sampling rate, MIN_SAMPLE_HZ..MAX_SAMPLE_HZ samples per second."""
    if not MIN_SAMPLE_HZ <= value <= MAX_SAMPLE_HZ:  # also refuses NaN
        raise ValueError(
            f"must be between {MIN_SAMPLE_HZ:g} and {MAX_SAMPLE_HZ:g} Hz "
            f"(0 = no background sampling), got {value:g}"
        )
    return float(value)


def check_duration(seconds: float) -> float:
    """A trial's length: positive, at most MAX_DURATION_S."""
    if not seconds > 0 or not math.isfinite(seconds):
        raise ValueError(f"duration must be positive, got {seconds:g}")
    if seconds > MAX_DURATION_S:
        raise ValueError(
            f"{seconds:g} s is longer than the {MAX_DURATION_S / 86400:g} days a trial may last"
        )
    return seconds


def check_workload_target(target: str, search_path: Sequence[str | Path] = ()) -> None:
    """Refuse a ``module:Class`` that cannot be imported, without running any of its code.

    The module is looked for in ``search_path`` (e.g. a job's working directory,
    which is shipped to the VM), then where this Python finds modules. Its source
    is parsed, not executed — it may need libraries only the VM has — and must
    bind ``Class`` at top level (a class, an assignment or an import), unless it
    star-imports or defines ``__getattr__``, where only importing would tell.
    """
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"expected module:Class, got {target!r}")
    where = [str(Path(p)) for p in search_path]
    spec = _find_module(module, where)
    if spec is None:
        places = f"{', '.join(where)} or " if where else ""
        raise ValueError(f"cannot import {module!r}: no such module in {places}this Python's path")
    origin = spec.origin
    if not origin or not origin.endswith(".py"):
        return  # an extension or namespace module: only importing it would tell
    try:
        tree = ast.parse(Path(origin).read_bytes(), filename=origin)
    except (OSError, SyntaxError, ValueError) as exc:
        raise ValueError(f"cannot import {module!r} ({origin}): {exc}") from None
    names = _top_level_names(tree)
    if attr not in names and "*" not in names:
        raise ValueError(f"module {module!r} ({origin}) defines no {attr!r}")


def _find_module(module: str, where: list[str]) -> importlib.machinery.ModuleSpec | None:
    """Where ``module`` would come from: ``where`` first, then sys.path (without importing it).

    Dotted names are walked package by package with PathFinder, which imports
    nothing; what only an import hook finds (e.g. an editable install) falls
    back to importlib's own search, which imports the parent packages.
    """
    locations: list[str] | None = [*where, *sys.path]
    parts = module.split(".")
    spec = None
    for i in range(len(parts)):
        if locations is None:
            return None  # a parent is a module, not a package
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), locations)
        if spec is None:
            if i > 0:
                return None  # the package is there, the submodule is not
            break
        locations = list(spec.submodule_search_locations or []) or None
    if spec is not None:
        return spec
    try:
        if importlib.util.find_spec(parts[0]) is None:  # a top-level name imports nothing
            return None
        return importlib.util.find_spec(module)
    except Exception as exc:  # the user's package __init__ failed: say so, in one line
        raise ValueError(f"cannot import {module!r}: {type(exc).__name__}: {exc}") from None


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at top level; "*" means any (star import or module __getattr__)."""
    names: set[str] = set()
    for node in _top_level(tree.body):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
            if node.name == "__getattr__":
                return {"*"} | names
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return {"*"}
                names.add(alias.asname or alias.name.split(".")[0])
    return names


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements at module level, looking inside if/try/with blocks (still module level)."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(node, field, None)
            if isinstance(node, ast.If | ast.Try | ast.With) and isinstance(inner, list):
                out.extend(_top_level(inner))
        for handler in getattr(node, "handlers", []) or []:
            out.extend(_top_level(handler.body))
    return out
