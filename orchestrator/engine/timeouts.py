"""How long the engine lets one trial run before it stops it and fails it.

A trial that hangs (a deadlock, a job waiting on input that never comes, a
worker pool that lost a child) would otherwise hold its machine, and its bill,
until someone notices. Every trial gets a limit:

* ``--trial-timeout`` (``trial_timeout`` in sweep.toml) when given: the same for
  every trial;
* a trial of known length (the built-in workloads, and ``--command`` with
  ``--duration``): ``MULTIPLE`` times its warm-up plus duration, plus a floor for
  what happens around it (interpreter start, loading inputs, writing results;
  more when a profiler renders its output or a Ray cluster places actors);
* a fixed-work ``--command`` job (no ``--duration``) has no planned length, so the
  limit comes from what the sweep has measured: once a trial of the same
  machine and grid point has finished, ``MULTIPLE`` times the slowest such
  trial, scaled up by how many fewer workers this trial has (a job that scales
  linearly takes that much longer), plus the floor; before any has finished,
  ``FIRST_FIXED_WORK_S``.

When the limit fires the trial is failed with the reason ``timed out after N s
(--trial-timeout)`` and the sweep goes on with the next trial.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.plan.planner import TrialPlan
    from orchestrator.spec.spec import SweepSpec

# The default dry run on a 2-core host at load average ~6 spent about 11 s per 3 s trial,
# start-up and loading its 800 MB of inputs included
# (docs/measurement/sweeps.md, "27 trials ... 303 s"):
# 4 x 3 s + 2 min is ten times that, and still stops a hung trial within minutes.
MULTIPLE = 4.0
FLOOR_S = 120.0
PROFILED_FLOOR_S = 300.0  # py-spy/memray start, then render their output after the trial
CLUSTER_FLOOR_S = 300.0  # a Ray trial places one actor per node first
FIRST_FIXED_WORK_S = 3600.0  # a fixed-work job before anything was measured: an hour


def describe(spec: SweepSpec) -> str:
    """The plan's one line on how long a trial may run."""
    if spec.trial_timeout_s is not None:
        return f"each trial is failed after {spec.trial_timeout_s:g} s (--trial-timeout)"
    if spec.command is not None and spec.stop_after_s is None:
        return (f"a trial is failed after {MULTIPLE:g} x the slowest finished one of its machine "
                f"and grid point + {FLOOR_S:.0f} s ({FIRST_FIXED_WORK_S:.0f} s before the "
                "first); --trial-timeout sets it")
    length = spec.stop_after_s if spec.command is not None else spec.warmup_s + spec.duration_s
    return (f"a trial is failed after {MULTIPLE * length + FLOOR_S:.0f} s "
            f"({MULTIPLE:g} x {length:g} s + {FLOOR_S:.0f} s; more when profiled); "
            "--trial-timeout sets it")


def reason(limit_s: float) -> str:
    """The one line a timed-out trial is failed with."""
    shown = f"{limit_s:.0f}" if limit_s >= 10 else f"{limit_s:g}"
    return f"timed out after {shown} s (--trial-timeout)"


class TrialTimeouts:
    """The limit of each trial of one sweep; fed with the trials that finish (thread-safe)."""

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self._lock = threading.Lock()
        # (machine, grid) -> (seconds, workers) of each trial that finished well
        self._measured: dict[tuple[str, str], list[tuple[float, int]]] = {}

    @staticmethod
    def _key(trial: TrialPlan) -> tuple[str, str]:
        return trial.machine, repr(sorted(trial.grid.items()))

    def _floor(self, trial: TrialPlan) -> float:
        floor = FLOOR_S
        if trial.profiled:
            floor = max(floor, PROFILED_FLOOR_S)
        if trial.nodes > 1:
            floor = max(floor, CLUSTER_FLOOR_S)
        return floor

    def limit(self, trial: TrialPlan) -> float:
        """Seconds this trial may run, in the engine's clock (its runner's start to its end)."""
        spec = self.spec
        if spec.trial_timeout_s is not None:
            return float(spec.trial_timeout_s)
        floor = self._floor(trial)
        if spec.command is None:
            return MULTIPLE * (spec.warmup_s + spec.duration_s) + floor
        if spec.stop_after_s is not None:
            return MULTIPLE * spec.stop_after_s + floor
        with self._lock:
            measured = list(self._measured.get(self._key(trial), ()))
        if not measured:
            return FIRST_FIXED_WORK_S
        longest = max(seconds * max(1.0, workers / max(trial.workers, 1))
                      for seconds, workers in measured)
        return MULTIPLE * longest + floor

    def finished(self, trial: TrialPlan, seconds: float) -> None:
        """A trial that ended well took ``seconds``: the measure for the fixed-work limit."""
        if trial.profiled:  # a profiler slows it: not the job's own time
            return
        with self._lock:
            self._measured.setdefault(self._key(trial), []).append((seconds, trial.workers))
