"""A user's job on the host: its shipped copy, its setup, its command line and its stdout protocol.

The orchestrator ships a user's project directory as one content-hashed archive
(``orchestrator.engine.jobs``); this module is the host's side of it, stdlib only:

    python -m workloads.job unpack ARCHIVE DEST     # once per host and archive hash
    python -m workloads.job setup DEST CMD          # once per host, archive and CMD
                                                    # (DEST: a copy in the host's cache)

and, for the trial runner (``python -m workloads.run --command --job``), the
placeholders of a command (``{workers}``, ``{vcpus}``, ``{trial}``, ``{repeat}``
and grid names), its environment (``CLOUDPROF_WORKERS``...) and the protocol a
job speaks on stdout, which needs no library on the job's side::

    cloudprof:unit row          what one unit is
    cloudprof:units 500         500 more units done
    cloudprof:phase fit         a phase starts (the previous one ends)

Everything else the job prints goes to the trial's log file, kept in the store.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import string
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from workloads import procfs
from workloads.atomic import atomic_directory, remove_directory

PREFIX = "cloudprof:"
LOG_FILE = "output.log"  # a command job's stdout and stderr, next to summary.json
BUILTIN_PLACEHOLDERS = ("workers", "vcpus", "trial", "repeat")
SITE_DIR = ".cloudprof-site"  # setup's pip installs land here (PIP_TARGET), on PYTHONPATH
UNPACKED_MARK = ".cloudprof-unpacked"
SETUP_LOG = ".cloudprof-setup.log"
SETUP_LOCK = ".cloudprof-setup.lock"
KEEP_UNUSED_S = 14 * 86400.0  # a copy (and its setup's environment) unused this long goes
TAIL_LINES = 10


class JobError(Exception):
    """A job cannot run as asked; the message is one line."""


# ------------------------------------------------------------------ placeholders


def placeholders(text: str) -> list[str]:
    """Names of the ``{name}`` placeholders in ``text`` (``{{`` is a literal brace)."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise JobError(f"cannot read the placeholders of {text!r}: {exc}") from None
    names = []
    for _literal, field, spec, conv in parsed:
        if field is None:
            continue
        if not field.isidentifier() or spec or conv:
            raise JobError(f"placeholder {{{field}}} in {text!r} is not a plain {{name}}")
        names.append(field)
    return names


def check_placeholders(text: str, known: Iterable[str]) -> None:
    """Raise JobError naming the first placeholder of ``text`` that is not in ``known``."""
    allowed = set(known)
    for name in placeholders(text):
        if name not in allowed:
            raise JobError(f"unknown placeholder {{{name}}} in {text!r}; known: "
                           + ", ".join(f"{{{n}}}" for n in sorted(allowed)))


def expand(command: Sequence[str], values: Mapping[str, str], shell: bool) -> list[str]:
    """The argv of one trial: each word's placeholders filled in.

    Without ``shell`` the words were split by shlex on the laptop and each is
    filled as is (a value never splits a word); with ``shell`` the one word is a
    shell command, and the values go in shell-quoted.
    """
    check = list(values)
    out = []
    for word in command:
        check_placeholders(word, check)
        filled = {k: shlex.quote(str(v)) if shell else str(v) for k, v in values.items()}
        out.append(word.format(**filled))
    return ["sh", "-c", out[0]] if shell else out


def job_env(values: Mapping[str, str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's environment: ``CLOUDPROF_<NAME>`` for every placeholder value, and the
    runner's own interpreter first on PATH, so a job's ``python`` is the host's venv (with
    numpy, pyarrow and what --setup put there), not whichever python the login shell finds.
    """
    env = dict(os.environ if base is None else base)
    bindir = os.path.dirname(sys.executable)
    rest = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p != bindir]
    env["PATH"] = os.pathsep.join([bindir, *rest])
    for key, value in values.items():
        env[f"CLOUDPROF_{key.upper()}"] = str(value)
    env["PYTHONUNBUFFERED"] = "1"  # protocol lines must arrive when they are printed
    return env


def enter_copy(directory: Path) -> list[str]:
    """Make the shipped copy the working directory and importable here; returns the paths
    a job's processes need on PYTHONPATH (its site dir of setup's installs, then the copy).

    Only this process's ``sys.path`` changes, not its environment: the agent's
    sampler process must keep importing the venv's packages, never a version
    the job's requirements put in its site dir.
    """
    directory = directory.resolve()
    if not directory.is_dir():
        raise JobError(f"job directory {directory} does not exist on this host")
    os.chdir(directory)
    paths = [str(directory)]
    if (directory / SITE_DIR).is_dir():
        paths.insert(0, str(directory / SITE_DIR))
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    return paths


def with_pythonpath(env: Mapping[str, str], paths: Sequence[str]) -> dict[str, str]:
    """``env`` with ``paths`` first on its PYTHONPATH."""
    out = dict(env)
    rest = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    out["PYTHONPATH"] = os.pathsep.join([*paths, *rest])
    return out


# ------------------------------------------------------------------ the stdout protocol


class OutputReader:
    """Reads a job's stdout+stderr: protocol lines counted, every line kept in the log.

    ``units`` is the trial's UnitCounter (the agent records it with each sample);
    ``clock`` gives seconds since the trial's t = 0; ``root`` is the job's pid,
    whose tree is measured when a phase starts; ``on_error`` is called once with
    a one-line message when a protocol line is malformed (the runner then stops
    the job and fails the trial).
    """

    def __init__(self, stream: IO[str], log: Path, units: Any, clock: Callable[[], float],
                 root: int, on_error: Callable[[str], None]) -> None:
        self.stream, self.log_path, self.units = stream, log, units
        self.clock, self.root, self.on_error = clock, root, on_error
        self.unit: str | None = None
        self.units_total = 0.0
        self.reported_units = False
        self.error: str | None = None
        self.phases: list[dict[str, Any]] = []  # {"name", "t", "rss_bytes", "cpu_s"} at start
        self._fraction = 0.0
        self._thread = threading.Thread(target=self._read, name="job-output", daemon=True)

    def start(self) -> OutputReader:
        self._thread.start()
        return self

    def join(self, timeout: float = 10.0) -> None:
        self._thread.join(timeout)

    def _read(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w", encoding="utf-8", errors="replace") as log:
            for n, raw in enumerate(self.stream, 1):
                line = raw.rstrip("\n")
                if line.startswith(PREFIX):
                    self._protocol(n, line)
                else:
                    log.write(raw if raw.endswith("\n") else raw + "\n")
                    log.flush()

    def _protocol(self, n: int, line: str) -> None:
        verb, _, arg = line[len(PREFIX):].strip().partition(" ")
        arg = arg.strip()
        if verb == "units":
            try:
                value = float(arg)
                if not value >= 0 or value == float("inf"):
                    raise ValueError
            except ValueError:
                self._fail(f"line {n} of the job's output, {line.strip()!r}: "
                           "the number of units must be a non-negative number")
                return
            self.reported_units = True
            self.units_total += value
            self._fraction += value
            whole = int(self._fraction)
            if whole:
                self.units.add(whole)
                self._fraction -= whole
        elif verb == "unit" and arg:
            self.unit = arg
        elif verb == "phase" and arg:
            rss, cpu, held = tree_snapshot(self.root)
            self.phases.append({"name": arg, "t": self.clock(), "rss_bytes": held,
                                "rss_sum_bytes": rss, "cpu_s": cpu, "units": self.units_total})
        else:
            self._fail(f"line {n} of the job's output, {line.strip()!r}: unknown protocol line "
                       "(use cloudprof:units N, cloudprof:unit NAME or cloudprof:phase NAME)")

    def fill_summary(self, summary: dict[str, Any], rep: Any, seconds: float,
                     end_t: float) -> None:
        """Units, unit name, kind and phases of the trial into its summary.json.

        ``rep`` is the agent's AgentReport, ``seconds`` the trial's length and
        ``end_t`` its end on the time series' clock.
        """
        summary["unit"] = self.unit or ("unit" if self.reported_units else None)
        summary["units"] = self.units_total if self.reported_units else 0
        summary["units_per_s"] = (self.units_total / seconds
                                  if self.reported_units and seconds > 0 else 0.0)
        # No units: the job is a fixed amount of work and a trial is one complete run.
        summary["job_kind"] = "throughput" if self.reported_units else "fixed_work"
        if not self.reported_units and summary["leak"].get("verdict") != "inconclusive":
            # One complete run grows as it loads and works: growth is not a leak there.
            summary["leak"] = {**summary["leak"], "verdict": "inconclusive",
                               "reason": "a fixed-work job (no units): its growth is its work; "
                                         "the leak test needs a job that loops (reports units)"}
        t, rss = rep.column("t"), rep.column("rss_bytes")
        held = rep.column("held_bytes")
        if any(h is not None for h in held):  # the phases share the headline's basis
            rss = held
        else:  # no held series: the phase starts' readings must be RSS sums too
            for phase in self.phases:
                phase["rss_bytes"] = phase.get("rss_sum_bytes")
        cpu = [u + s for u, s in zip(rep.column("cpu_user_s"), rep.column("cpu_system_s"),
                                     strict=True)]
        summary["phases"] = phase_stats(self.phases, t, rss, cpu, end_t, rep.cpu_seconds_total,
                                        self.units_total)

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
            self.on_error(message)


def tree_snapshot(root: int) -> tuple[int | None, float | None, int | None]:
    """RSS (sum), CPU seconds and held memory of ``root`` and its live descendants, now.

    Held is the headline's basis (``workloads.run``): anonymous memory plus the file pages
    mapped, counted once (the larger of the sum of Pss and the largest process's own)."""
    rss, cpu, seen = 0, 0.0, False
    anon = pss_file = largest_file = 0
    held_seen = False
    for pid in [root, *procfs.descendants(root)]:
        rollup = procfs.read_rollup(pid)
        if rollup is not None:
            held_seen = True
            anon += rollup.anon
            pss_file += rollup.pss_file
            largest_file = max(largest_file, rollup.rss_file)
        try:
            reader = procfs.ProcReader(pid)
        except procfs.ProcGone:
            continue
        try:
            sample = reader.read()
        except procfs.ProcGone:
            continue
        finally:
            reader.close()
        seen = True
        rss += sample.rss_bytes
        cpu += sample.cpu_user_s + sample.cpu_system_s
    held = anon + max(pss_file, largest_file) if held_seen else None
    return (rss, round(cpu, 3), held) if seen else (None, None, None)


def phase_stats(phases: list[dict[str, Any]], t: Sequence[float], rss: Sequence[int],
                cpu: Sequence[float], end_t: float, end_cpu: float | None,
                end_units: float = 0.0) -> list[dict[str, Any]]:
    """Wall time, CPU time and peak RSS per phase, from the samples and the phase starts.

    A phase's peak is the highest of the samples taken while it ran and the
    reading taken when it started (so a phase shorter than the sampling
    interval still has one); its CPU time is the tree's CPU at its end minus at
    its start (the end of the last phase is the reaped tree's total).
    """
    out = []
    for i, phase in enumerate(phases):
        start = phase["t"]
        nxt = phases[i + 1] if i + 1 < len(phases) else None
        stop = nxt["t"] if nxt else end_t
        in_phase = [r for tt, r in zip(t, rss, strict=False)
                    if start <= tt < stop and r is not None]
        peaks = [*in_phase, *([phase["rss_bytes"]] if phase["rss_bytes"] is not None else [])]
        cpu_end = nxt["cpu_s"] if nxt else end_cpu
        if cpu_end is None:  # no reading at the next start: the last sample before it
            before = [c for tt, c in zip(t, cpu, strict=False) if tt < stop and c is not None]
            cpu_end = before[-1] if before else None
        cpu_s = (None if cpu_end is None or phase["cpu_s"] is None
                 else round(max(cpu_end - phase["cpu_s"], 0.0), 3))
        units = (nxt["units"] if nxt else end_units) - phase.get("units", 0.0)
        wall = max(stop - start, 0.0)
        out.append({"name": phase["name"], "start_s": round(start, 4),
                    "wall_s": round(wall, 4), "cpu_s": cpu_s,
                    "peak_rss_bytes": max(peaks) if peaks else None,
                    "units": units, "units_per_s": units / wall if wall > 0 else 0.0,
                    "samples": len(in_phase)})
    return out


# ------------------------------------------------------------------ on the host: unpack, setup


def safe_members(tar: tarfile.TarFile, archive: Path, dest: Path) -> list[tarfile.TarInfo]:
    """Every member of ``tar``, each a plain file or directory that lands inside ``dest``;
    anything else is a JobError naming it. cloudprof packs regular files only, so a link,
    a device, an absolute path or a ``..`` is someone else's archive. Checked here on every
    Python, not left to ``tarfile``'s "data" filter, which older ones lack (where a symlink
    member followed by a file through it writes anywhere)."""
    root = os.path.realpath(dest)
    members = tar.getmembers()
    for member in members:
        name = member.name
        if not (member.isreg() or member.isdir()):
            raise JobError(f"{archive}: {name!r} is a link or a special file; refused")
        target = os.path.realpath(os.path.join(root, name))
        if (name.startswith("/") or ".." in Path(name).parts
                or os.path.commonpath([root, target]) != root):
            raise JobError(f"{archive}: {name!r} would land outside the job's directory; "
                           "refused")
        member.mode &= 0o755  # no setuid, setgid or world-writable bits on the host
    return members


def unpack(archive: Path, dest: Path) -> str:
    """Unpack ``archive`` into ``dest`` once: "unpacked", or "reused" when already there.

    The copies live in the host's cache: each use marks the time, and copies no sweep
    used for ``KEEP_UNUSED_S`` (environments of code edited since) are removed.
    """
    state = _unpack(archive, dest)
    os.utime(dest / UNPACKED_MARK)  # its last use
    prune(dest.parent, keep=dest)
    return state


def prune(root: Path, keep: Path, max_age_s: float = KEEP_UNUSED_S) -> list[str]:
    """Remove the copies in ``root`` unused for ``max_age_s`` (not ``keep``, nor anything
    that is not a copy); the names removed."""
    removed = []
    now = time.time()
    for child in sorted(root.iterdir()):
        mark = child / UNPACKED_MARK
        try:
            idle = now - mark.stat().st_mtime
        except OSError:
            continue  # not a copy (the archives), or one being removed
        if child == keep or idle <= max_age_s:
            continue
        if remove_directory(child):  # gone from its name at once, then deleted
            removed.append(child.name)
    return removed


def _unpack(archive: Path, dest: Path) -> str:
    if (dest / UNPACKED_MARK).is_file():
        return "reused"
    with atomic_directory(dest, lambda d: (d / UNPACKED_MARK).is_file()) as tmp, \
            tarfile.open(archive, "r:gz") as tar:
        members = safe_members(tar, archive, tmp)
        if hasattr(tarfile, "data_filter"):  # the same checks again, by tarfile itself
            tar.extractall(tmp, members=members, filter="data")
        else:  # Python < 3.10.12 (and 3.11.4): what safe_members let through only
            tar.extractall(tmp, members=members)
        (tmp / UNPACKED_MARK).write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
    return "unpacked"


def setup_mark(command: str) -> str:
    return f".cloudprof-setup-{hashlib.sha256(command.encode()).hexdigest()[:12]}.ok"


def setup(dest: Path, command: str) -> str:
    """Run the setup command once in ``dest``: "ran", or "reused" when it already succeeded.

    It runs through ``sh -c`` with the interpreter running this module (the
    host's cloudprof venv) first on PATH, so ``pip`` and ``python`` are that
    venv's; ``PIP_TARGET`` sends pip's installs into ``dest/.cloudprof-site``,
    which trials put on PYTHONPATH — the job's packages live and die with the
    job's copy and never change the venv other jobs use.
    """
    mark = dest / setup_mark(command)
    if mark.is_file():
        return "reused"
    # The copy lives in the host's cache, shared by sweeps: one setup at a time builds
    # it, and one that waited finds it built.
    with open(dest / SETUP_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if mark.is_file():
            return "reused"
        return _run_setup(dest, command, mark)


def _run_setup(dest: Path, command: str, mark: Path) -> str:
    shutil.rmtree(dest / SITE_DIR, ignore_errors=True)  # what a failed attempt left
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "/usr/bin:/bin")])
    env["PIP_TARGET"] = str(dest / SITE_DIR)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(dest / SITE_DIR), str(dest),
                                                    env.get("PYTHONPATH")) if p)
    with open(dest / SETUP_LOG, "w", encoding="utf-8") as log:
        log.write(f"$ {command}\n")
        log.flush()
        proc = subprocess.run(["sh", "-c", command], cwd=dest, env=env, stdin=subprocess.DEVNULL,
                              stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        lines = [ln for ln in (dest / SETUP_LOG).read_text(errors="replace").splitlines()
                 if ln.strip()][1:]
        tail = " | ".join(ln.strip() for ln in lines[-3:]) or "(no output)"
        raise JobError(f"setup command exited {proc.returncode}: {tail}")
    mark.write_text(command + "\n")
    return "ran"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if len(args) == 3 and args[0] == "unpack":
            print(unpack(Path(args[1]), Path(args[2])))
        elif len(args) == 3 and args[0] == "setup":
            print(setup(Path(args[1]), args[2]))
        else:
            print("usage: python -m workloads.job unpack ARCHIVE DEST | setup DEST CMD",
                  file=sys.stderr)
            return 2
    except (JobError, OSError, tarfile.TarError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
