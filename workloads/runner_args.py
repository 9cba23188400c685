"""The runner's command line: its parser, the checks on its arguments, and the workload
they name (``python -m workloads.run``, whose ``main`` lives in ``workloads.run``).

Kept apart from the trial itself so a warm runner can build the parser once before
it forks (``parser``), and so the sweep's own checks (``workloads.limits``) and the
runner's read the same bounds.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workloads import limits, protocol
from workloads.base import Workload, WorkloadInputError, load_workload

DEFAULT_DURATION_S = 10.0  # a workload's trial, when neither --duration nor --units is given


class UsageError(Exception):
    """Bad arguments or inputs: printed as one ``error:`` line, exit EXIT_USAGE."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, not argparse's usage block
        raise UsageError(message)


def _positive(kind: type) -> Any:
    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return value

    return convert


def _checked(check: Any, convert: Any = float) -> Any:
    """An argparse type from one of ``workloads.limits``' checks (shared with the sweep)."""

    def run_check(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        try:
            return check(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return run_check


def _size(text: str) -> int:
    try:
        return limits.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a size: {exc}") from None


_PARSER: argparse.ArgumentParser | None = None


def parser() -> argparse.ArgumentParser:
    """The runner's parser, built once a process: a warm runner builds it before it forks,
    so that a forked trial only parses. Parsing leaves a parser as it was (argparse
    copies defaults)."""
    global _PARSER
    if _PARSER is None:
        _PARSER = build_parser()
    return _PARSER


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m workloads.run",
        description="Run one trial under the profiling agent and write summary.json "
        "and timeseries.parquet.",
    )
    p.add_argument("--workload", default="cube", help="registered name or module:Class")
    p.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE",
        help="workload parameter (repeatable)",
    )  # fmt: skip
    p.add_argument("--workers", type=_positive(int), default=1)
    length = p.add_mutually_exclusive_group()
    length.add_argument("--duration", type=_checked(limits.check_duration),
                        help="seconds (default 10)")
    length.add_argument("--units", type=_positive(int), help="stop after this many units")
    p.add_argument("--sample-hz", type=_checked(limits.check_sample_hz), default=10.0,
                   help="0 = no background sampling")
    p.add_argument("--memory-budget", type=_size,
                   help="stop the trial above this RSS (2G = 2 GiB, 2GB = 2e9 bytes)")
    p.add_argument("--memory-limit", type=_size, metavar="BYTES",
                   help="with --command: run the tree under this memory cgroup limit, as a "
                   "container would (2G = 2 GiB); an OOM kill there fails the trial")
    p.add_argument("--warmup", type=float, default=0.0, help="untimed warm-up seconds")
    p.add_argument("--out", required=True, type=Path, help="directory for the result files")
    p.add_argument(
        "--put", metavar="MANIFEST",
        help="then put the result files in the bucket: a workloads.transfer put manifest "
        f"(one '{protocol.PUT_PREFIX}' line on stderr says how it went)",
    )  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--profile", choices=protocol.PROFILE_KINDS,
        help="also attribute CPU (py-spy) or memory at the peak (memray); marks the trial profiled",
    )  # fmt: skip
    p.add_argument(
        "--command", action="store_true",
        help="profile the command after -- and its children instead of a workload",
    )  # fmt: skip
    p.add_argument(
        "--job", action="store_true",
        help="with --command: fill {placeholders}, read the cloudprof: protocol on stdout, "
        "keep the output in output.log",
    )  # fmt: skip
    p.add_argument("--shell", action="store_true", help="with --job: the command is one shell line")
    p.add_argument(
        "--var", action="append", default=[], metavar="NAME=VALUE",
        help="a placeholder value for --job (trial, repeat, grid names; repeatable)",
    )  # fmt: skip
    p.add_argument("--chdir", type=Path, help="the job's shipped copy: working directory and "
                   "on PYTHONPATH")
    ray = p.add_argument_group("scale out (workloads.ray_trial; needs ray)")
    ray.add_argument("--ray-nodes", type=_positive(int), default=1,
                     help="run the workload as one actor per node of this many Ray nodes")
    ray.add_argument("--ray-address", help="the Ray cluster's head, HOST:PORT (also RAY_ADDRESS "
                     "for a --command job)")
    ray.add_argument("--ray-node-param", action="append", default=[], metavar="I:KEY=VALUE",
                     help="a workload parameter for node I only (its own inputs' path)")
    ray.add_argument("--ray-node-chdir", action="append", default=[], metavar="I=DIR",
                     help="node I's copy of the job (--chdir on that node)")
    return p


def _node_options(pairs: Sequence[str], flag: str, sep: str) -> list[tuple[int, str]]:
    """``I<sep>REST`` items of a per-node flag, as (node index, REST)."""
    out = []
    for pair in pairs:
        index, found, rest = pair.partition(sep)
        if not found or not index.isdigit():
            raise UsageError(f"{flag} wants a node index then {sep!r}, got {pair!r}")
        out.append((int(index), rest))
    return out


def _make_workload(args: argparse.Namespace, params: dict[str, Any]) -> Workload:
    """The workload of this trial: itself, or one actor of it per Ray node."""
    if args.ray_nodes > 1 or args.ray_address:
        if not args.ray_address:
            raise UsageError("--ray-nodes needs --ray-address HOST:PORT")
        from workloads.ray_trial import RayWorkload

        node_params: dict[int, dict[str, str]] = {}
        for i, pair in _node_options(args.ray_node_param, "--ray-node-param", ":"):
            node_params.setdefault(i, {}).update(_parse_params([pair]))
        return RayWorkload(args.workload, params["workload_params"], nodes=args.ray_nodes,
                           address=args.ray_address, node_params=node_params,
                           node_chdirs=dict(_node_options(args.ray_node_chdir, "--ray-node-chdir",
                                                          "=")),
                           sample_hz=args.sample_hz)
    cls = load_workload(args.workload)
    try:
        return cls(**params["workload_params"])
    except TypeError as exc:
        raise WorkloadInputError(f"bad parameters for workload {args.workload!r}: {exc}") from exc


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, None


def _parse_params(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--param wants KEY=VALUE, got {pair!r}")
        out[key.strip()] = value
    return out


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return (
        text
        if isinstance(exc, (WorkloadInputError, UsageError))
        else (f"{type(exc).__name__}: {text}")
    )


def _guess_out(argv: list[str]) -> Path | None:
    """--out from raw argv, so that even a usage error leaves a failed summary.json."""
    for i, arg in enumerate(argv):
        if arg == "--out" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--out="):
            return Path(arg.split("=", 1)[1])
    return None


def _check_args(args: argparse.Namespace, command: list[str] | None) -> None:
    """The runner's own usage errors, found before anything runs."""
    if args.command and not command:
        raise UsageError("--command needs the command after --, e.g. --command -- sleep 1")
    if command is not None and not args.command:
        raise UsageError(f"unexpected arguments after --: {command!r} (add --command)")
    if args.warmup < 0:
        raise UsageError("--warmup must be ≥ 0 seconds")
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {str(args.out)!r} exists and is not a directory")
    if (args.job or args.shell or args.var) and not args.command:
        raise UsageError("--job, --shell and --var go with --command")
    if args.memory_limit is not None and not args.command:
        raise UsageError("--memory-limit goes with --command (a tree in a cgroup)")


def _trial_params(args: argparse.Namespace, command: list[str] | None) -> dict[str, Any]:
    """The trial's parameters as the summary records them (a workload runs for
    DEFAULT_DURATION_S when neither a duration nor a number of units is given)."""
    duration = args.duration
    if duration is None and args.units is None and not args.command:
        duration = DEFAULT_DURATION_S
    return {
        "workload": None if args.command else args.workload,
        "workload_params": _parse_params(args.param),
        "workers": args.workers,
        "duration_s": duration,
        "units_target": args.units,
        "sample_hz": args.sample_hz,
        "memory_budget_bytes": args.memory_budget,
        "memory_limit_bytes": args.memory_limit,
        "warmup_s": args.warmup,
        "command": command if args.command else None,
        "profile": args.profile,
    }
