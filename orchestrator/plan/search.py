"""Adaptive sweeps: which worker counts to run next on one machine, from what has been measured.

The default grid (powers of two up to the vCPU count, the count, twice it)
spends most of its trials where the answer is already clear. ``--adaptive``
instead starts from four counts that bracket the usual peak (1, v/4, v, 2v for
v vCPUs), fits the USL (``plan/model.py``) and then adds, one round at a time:

- one count past the predicted peak N* whenever none has been tested there:
  without it the fitted peak is an extrapolation;
- the count whose throughput the bootstrap refits disagree on in the way that
  most moves N*: for each candidate n, the share of N*'s variance that
  measuring X(n) (with the measured noise) would explain,
  Cov(log N*, log X(n))² / (Var(log X(n)) + noise²). This is the linear-Gaussian
  (Kalman) update computed on the bootstrap ensemble, which costs nothing more
  than the bootstrap the report already needs;

until N*'s 95 % interval is within ±``target`` of N* with a tested count past it
(and at least MIN_TRIALS_TO_STOP trials, so the interval rests on some measured
noise), or the trial budget is spent. Each proposal is one trial: a count
already tested can come back, when a repeat there narrows N* most. Pure: no
I/O, the engine (or a benchmark) runs the counts and calls again.
``benchmarks/bench_model.py`` measures it against the default grid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestrator.plan.model import SEED, Samples, UslModel, fit_usl_with_intervals, usl

TARGET = 0.10  # stop when N*'s 95 % interval is within ±10 % of N*
PAST_PEAK = 1.5  # "one past the peak": this far beyond N*, so the drop is measured, not assumed
MAX_OVERSUBSCRIBE = 4  # never propose more than 4 workers per vCPU
MIN_TRIALS_TO_STOP = 6  # 4 trials leave one residual per fitted parameter +1: too few to trust
ADAPTIVE_BOOT = 100  # bootstrap refits per round: the planner needs the ranking, not 3 decimals


def initial_points(vcpus: int) -> list[int]:
    """1, v/4, v and 2v: single-worker speed, the rising part, the core count, oversubscription."""
    if vcpus < 1:
        raise ValueError(f"vcpus must be >= 1, got {vcpus}")
    return sorted({1, max(1, vcpus // 4), vcpus, 2 * vcpus})


def converged(model: UslModel, target: float = TARGET) -> bool:
    """N* known within ±target, a tested count past it, and a fit that is not poor."""
    return (
        not model.fit.poor
        and model.fit.peak_tested
        and model.n_star_rel_halfwidth <= target
    )


def trials_spent(measured: Samples) -> int:
    return sum(len(v) for v in measured.values())


def next_points(
    measured: Samples,
    vcpus: int,
    budget: int,
    *,
    target: float = TARGET,
    n_boot: int = ADAPTIVE_BOOT,
    seed: int = SEED,
) -> list[int]:
    """The worker counts to run next, one trial each; [] when done or out of budget.

    ``budget`` counts trials, including those already in ``measured``. A count
    may come back that was tested before: another repeat there is then what
    narrows N* most. Repeats are spent where they inform, not on every count.
    """
    left = budget - trials_spent(measured)
    if left <= 0:
        return []
    start = [n for n in initial_points(vcpus) if n not in measured]
    if start:
        return start[:left]
    model = fit_usl_with_intervals(measured, n_boot=n_boot, seed=seed)
    if model is None:
        return []
    if trials_spent(measured) >= MIN_TRIALS_TO_STOP and converged(model, target):
        return []
    cap = MAX_OVERSUBSCRIBE * vcpus
    picks: list[int] = []
    beyond = _past_peak(model, measured, cap)
    if beyond is not None:
        picks.append(beyond)
    best = _most_informative(model, cap, exclude=picks)
    if best is not None:
        picks.append(best)
    return picks[:left]


def _past_peak(model: UslModel, measured: Samples, cap: int) -> int | None:
    """A count PAST_PEAK × N* out when nothing tested lies that far; None when one does."""
    n_star = model.fit.n_star
    top = max(measured)
    if math.isfinite(n_star):
        if top >= PAST_PEAK * n_star:
            return None
        want = math.ceil(PAST_PEAK * n_star)
    else:
        want = 2 * top  # no peak seen yet: look further out
    want = min(want, cap)
    return want if want > top else None


def _most_informative(model: UslModel, cap: int, exclude: Sequence[int]) -> int | None:
    """The count whose measurement would most shrink the bootstrap variance of log N*."""
    import numpy as np

    if len(model.boot) < 10:
        return None
    params = np.array(model.boot)
    lam, sigma, kappa = params[:, 0:1], params[:, 1:2], params[:, 2:3]
    with np.errstate(divide="ignore"):
        n_star = np.maximum(1.0, np.sqrt(np.clip(1.0 - sigma[:, 0], 0.0, None) / kappa[:, 0]))
    y = np.log(np.minimum(n_star, 10.0 * cap))  # κ = 0 refits: "far out", not inf
    cand = np.arange(1, cap + 1, dtype=float)
    logx = np.log(usl(cand[None, :], lam, sigma, kappa))
    noise2 = _noise_variance(model)
    yc = y - y.mean()
    xc = logx - logx.mean(axis=0)
    cov = (yc[:, None] * xc).mean(axis=0)
    score = cov * cov / (xc.var(axis=0) + noise2)
    for n in exclude:
        score[int(n) - 1] = -1.0
    best = int(np.argmax(score))
    return best + 1 if score[best] > 0 else None


def _noise_variance(model: UslModel) -> float:
    """Variance of one new trial in log terms: the repeats' relative scatter around the fit."""
    return max(model.fit.rel_rmse, 1e-3) ** 2
