"""The engine's side of a host's warm runner (``workloads.warm``): start it, route trials
through it, stop it.

Why: each trial's runner otherwise starts a fresh interpreter and imports
numpy, pyarrow and the runner before its clock (``benchmarks/bench_sweep.py``,
"runner before its clock"); the warm runner pays that once per host and forks
each trial. The server runs as one long command of the host's executor, so it
works wherever ``Executor.run`` does (a local subprocess, an SSH channel) and
ends with the executor when nothing else stops it. Anything that goes wrong
costs only speed: a trial whose client finds no server starts a fresh runner.
A trial's command is the client's command line (``argv``) for every host; a local
host's executor runs it without the client process (``LocalExecutor``).

Not routed through it: profiled trials (py-spy and memray attach to the runner
from its start) and Ray trials (their driver joins a cluster). Set
``CLOUDPROF_WARM_RUNNER=0`` to start every trial as a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator import settings
from orchestrator.providers.base import Executor

if TYPE_CHECKING:
    from orchestrator.plan.planner import TrialPlan

READY_TIMEOUT_S = 60.0
ENV_SWITCH = settings.WARM_RUNNER.name


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "no", "false", "off")


class WarmRunner:
    """One host's server: a thread holds its command; ``ready`` once it has imported."""

    def __init__(self, ex: Executor, preload: str | None,
                 log: Callable[[str], None]) -> None:  # fmt: skip
        self.ex = ex
        self.name = secrets.token_hex(8)  # the abstract socket's name, unique per host
        self.preload = preload
        self.log = log
        self.ready = threading.Event()
        self.root: str | None = None
        self.ended = threading.Event()
        self._thread: threading.Thread | None = None

    def launch(self) -> None:
        """Start the server; it imports while the engine stages (see ``wait_ready``)."""
        argv = [self.ex.python, "-m", "workloads.warm", "serve", self.name]
        if self.preload:
            argv += ["--preload", self.preload]

        def on_line(line: str) -> None:
            if line.split()[:1] == ["ready"]:  # "ready ROOT": where the host has workloads/
                self.root = line.strip()[len("ready "):] or None
                self.ready.set()
            elif line.strip():
                self.log(f"warm runner: {line.strip()}")

        def hold() -> None:
            try:
                self.ex.run(argv, on_line=on_line)
            except Exception as exc:  # trials fall back to fresh runners
                self.log(f"warm runner: {exc}")
            finally:
                self.ended.set()

        self._thread = threading.Thread(target=hold, name="cloudprof-warm-runner", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        """Whether the server is ready (False: trials start fresh)."""
        for _ in range(int(timeout * 10)):
            if self.ready.wait(0.1) or self.ended.is_set():
                break
        return self.ready.is_set() and not self.ended.is_set()

    def argv(self, runner_args: list[str]) -> list[str]:
        """The trial's command: the client, which runs the trial in the server's fork."""
        return [*self._client(self.ex), "run", self.name, "--", *runner_args]

    def _client(self, ex: Executor) -> list[str]:
        from workloads.warm_client import CLIENT

        return ([ex.python, "-S", "-c", CLIENT, self.root] if self.root
                else [ex.python, "-m", "workloads.warm"])  # fmt: skip

    def stop(self, ex: Executor | None = None, timeout: float = 30.0) -> None:
        """Ask the server to exit (after any trial still running), then let its thread end.

        ``ex``: the host's executor now, which after a dropped connection is a new one
        (the server outlives the old one's session, until it notices it is gone)."""
        if self._thread is None:
            return
        ex = ex or self.ex
        with contextlib.suppress(Exception):
            ex.run([*self._client(ex), "stop", self.name], timeout=timeout)
        self.ended.wait(timeout if ex is self.ex else 1.0)


def eligible(trial: TrialPlan) -> bool:
    """Profilers attach from the runner's start; a Ray trial's driver joins a cluster."""
    return not trial.profiled and trial.nodes <= 1


def is_trial_command(argv: list[str]) -> bool:
    """Whether a host's command runs a trial: a fresh runner, or a warm runner's client."""
    return "workloads.run" in argv or ("run" in argv[:7] and any(
        "workloads.warm" in word for word in argv[:6]))
