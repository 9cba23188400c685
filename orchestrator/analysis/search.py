"""Adaptive sweeps: which worker counts to run next on one machine, from what has been measured.

The default grid (powers of two up to the vCPU count, the count, twice it)
spends most of its trials where the answer is already clear. ``--adaptive``
instead starts from four counts that bracket the usual peak (1, v/4, v, 2v for
v vCPUs), fits the USL (``analysis/model.py``) and then adds, one round at a time:

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

``--search`` (:func:`search_step`) does the same one level up, across machine
types: which candidate to create next, from the peak throughput of those tried
so far (a Gaussian process with expected improvement, CherryPick-style), and
how sure the pick is. ``bench_model.py --search`` measures it against trying
as many machines at random.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.analysis.model import SEED, Samples, UslModel, fit_usl_with_intervals, usl
from orchestrator.analysis.usl_batch import peak_workers_each

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
    n_star = peak_workers_each(sigma[:, 0], kappa[:, 0])
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


# ---------------------------------------------------------------- --search: which machine next

OBJECTIVES = ("cost", "throughput")
INITIAL_MACHINES = 3  # spread over the candidates before the GP has anything to say
MODEL_PICKS = 2  # at least this many machines chosen by the model, past the initial spread
EI_STOP = 0.01  # stop when no untried machine is expected to improve the best by ≥ 1 %
CONFIDENCE_SAMPLES = 2000  # joint posterior draws behind "P(the pick is the best)"
# A tried machine's measured peak, in log terms, is its truth within this relative noise
# (the 2-5 % run-to-run scatter of repeats); the confidence draws it so (see _pinned).
PEAK_NOISE = 0.03


@dataclass(frozen=True)
class Candidate:
    """A machine type ``--search`` may try: what the catalog knows before anything runs."""

    name: str
    vcpus: int
    memory_gib: float
    family: str
    price_per_hour: float


@dataclass(frozen=True)
class SearchStep:
    """Where a cross-machine search stands after the machines measured so far."""

    next: str | None  # the machine to try next; None when the search stops
    pick: str | None  # the best machine measured so far
    # P(pick is the best of every candidate): the GP's draws given the tried machines as
    # measured (± PEAK_NOISE); calibrated in benchmarks/bench_search_confidence.py
    confidence: float | None
    expected_gain: float | None  # largest expected improvement of an untried machine (relative)
    stopped: str | None  # why the search stops (None while it goes on)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe_confidence(p: float) -> str:
    """A share of CONFIDENCE_SAMPLES draws, without claiming a certainty they cannot show."""
    if p >= 0.995:
        return "over 99%"
    if p <= 0.005:
        return "under 1%"
    return f"{p:.0%}"


def peak_throughput(samples: Samples) -> float | None:
    """The best median units/s over the worker counts measured on one machine."""
    import numpy as np

    meds = [float(np.median(v)) for v in samples.values() if len(v)]
    meds = [m for m in meds if math.isfinite(m) and m > 0]
    return max(meds) if meds else None


def objective_value(objective: str, price_per_hour: float, units_per_s: float) -> float:
    """USD per million units (cost, lower is better) or units/s (throughput, higher is better)."""
    if objective == "cost":
        return price_per_hour / 3600.0 / units_per_s * 1e6
    return units_per_s


def default_budget(n_candidates: int) -> int:
    """The initial spread plus at least two picks the model makes, growing as √candidates.

    A budget equal to the initial spread (what "a third of 9" gave) ends the
    search before the Gaussian process has chosen anything. The budget is a
    cap: the expected-improvement rule usually stops first. Replayed on
    synthetic worlds (``bench_model.py --search``): with no cap at all the search
    tried 5.7 of 14 machines and 7.9 of 28; this cap (7 and 9) rarely binds,
    where a third of 14 (4) picked within 5 % of the best in 47 % of replays.
    """
    extra = max(MODEL_PICKS, math.ceil(math.sqrt(n_candidates)))
    return min(n_candidates, INITIAL_MACHINES + extra)


def search_step(
    candidates: Sequence[Candidate],
    measured: Mapping[str, float],
    objective: str,
    budget: int,
    *,
    ei_stop: float = EI_STOP,
    seed: int = SEED,
    min_rate: float | None = None,
    whole: Mapping[str, float] | None = None,
    scale_out: int = 1,
) -> SearchStep:
    """Which machine to try next, from the peak throughput (units/s) of those tried so far.

    Bayesian optimisation in the spirit of CherryPick (NSDI'17): a Gaussian
    process over machine features (log vCPUs, log memory per vCPU, log price,
    family) models log(peak units/s per vCPU); the price of every candidate is
    known, so the objective (log cost per unit, or −log units/s) is a known
    offset minus that model. The untried machine with the largest expected
    improvement (in log terms: a relative gain) is tried next, until that gain
    is below ``ei_stop`` or ``budget`` machines have been tried. Before the GP,
    INITIAL_MACHINES machines spread over the feature space (farthest-point).

    ``min_rate`` (units/s) is CherryPick's constraint: a job of N units due within
    a deadline T needs a machine that runs at least N/T. A measured machine below
    it is never the pick (unless none meets it: then the fastest, and the step
    says so), and each untried machine's expected improvement is weighted by the
    GP's probability that it meets it (constrained expected improvement).

    With ``--nodes`` a configuration is (workers, nodes) and the deadline is the
    whole configuration's: ``whole`` holds each tried machine's fastest
    configuration's rate over all its VMs (default: ``measured``), which the
    deadline is checked against, while ``measured`` is what the objective ranks
    (a cost search: the rate per VM of the cheapest configuration that meets the
    deadline, as n VMs cost n prices). ``scale_out``: how many VMs an untried
    machine's rate in ``measured`` may be spread over to meet the deadline (the
    most nodes swept, for a cost search), an optimistic bound (scaling across VMs
    linear) that its measurement then settles.
    """
    import numpy as np

    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    names = [c.name for c in candidates]
    tried = [n for n in names if n in measured and measured[n] > 0]
    feats = _features(candidates)
    offset = _offsets(candidates, objective)  # f = offset − y, lower is better
    pick, conf, gain, short = None, None, None, None
    if tried:
        y_tried = {n: math.log(measured[n] / _vcpus(candidates, n)) for n in tried}
        f_tried = {n: offset[names.index(n)] - y for n, y in y_tried.items()}
        speed = whole if whole is not None else measured
        feasible = {n: f for n, f in f_tried.items()
                    if min_rate is None or speed.get(n, 0.0) >= min_rate}
        if feasible:
            pick = min(feasible, key=feasible.__getitem__)
        else:  # nothing measured meets the deadline: the fastest comes closest
            pick = max(tried, key=lambda n: speed.get(n, 0.0))
            short = f"no machine tried meets the deadline; {pick} comes closest"
    untried = [i for i, n in enumerate(names) if n not in measured]
    spent = len([n for n in names if n in measured])
    if len(tried) >= 2:
        mean, cov = _posterior(feats, names, tried, measured, candidates, seed)
        f_mean, f_sd = offset - mean, np.sqrt(np.clip(np.diag(cov), 1e-12, None))
        need = None if min_rate is None else _needs(candidates, y_tried, speed, min_rate,
                                                    scale_out)
        meets = _meets(mean, f_sd, need)
        if feasible:
            best = min(feasible.values())
            gains = {i: _expected_improvement(best, f_mean[i], f_sd[i]) * meets[i]
                     for i in untried}
        else:  # nothing feasible yet: the machine most likely to be (CherryPick does so)
            gains = {i: float(meets[i]) for i in untried}
        gain = max(gains.values()) if gains else 0.0
        pinned = _pinned(cov, [names.index(n) for n in tried], PEAK_NOISE)
        conf = _confidence(offset, mean, pinned, names.index(pick), seed,
                           need if feasible else None)
    else:
        gains = {}
    def stop(why: str) -> SearchStep:
        return SearchStep(None, pick, conf, gain, f"{why}; {short}" if short else why)

    if not untried:
        return stop("every candidate tried")
    if spent >= budget:
        return stop("budget spent")
    if spent < min(INITIAL_MACHINES, budget) or not gains:
        return SearchStep(names[_spread_pick(feats, names, measured)], pick, conf, gain, None)
    if gain is not None and gain < ei_stop and not short:
        return stop(f"expected gain below {ei_stop:.0%}")
    nxt = max(gains, key=gains.__getitem__)
    return SearchStep(names[nxt], pick, conf, gain, None)


def _needs(candidates: Sequence[Candidate], tried_y: Mapping[str, float],
           speed: Mapping[str, float], min_rate: float, scale_out: int) -> Any:
    """Per candidate, the log(units/s per vCPU) a posterior draw must reach to meet the
    deadline. An untried machine: ``min_rate`` over ``scale_out`` VMs. A tried one, measured
    at ``tried_y``: its fastest configuration (``speed``) stays at ``min_rate`` or above
    while its draw falls short of ``y`` by at most log(speed / min_rate)."""
    import numpy as np

    return np.array([tried_y[c.name] - math.log(speed[c.name] / min_rate)
                     if c.name in tried_y else math.log(min_rate / max(1, scale_out)
                                                        / max(1, c.vcpus))
                     for c in candidates])


def _meets(mean: Any, sd: Any, need: Any) -> Any:
    """P(each candidate meets the deadline) under the GP (1 everywhere without one): the
    GP models y = log(units/s per vCPU), and the deadline needs y >= ``need``."""
    import numpy as np
    from scipy.stats import norm

    return np.ones(len(mean)) if need is None else norm.sf((need - mean) / sd)


def _vcpus(candidates: Sequence[Candidate], name: str) -> float:
    return float(max(1, next(c.vcpus for c in candidates if c.name == name)))


def _features(candidates: Sequence[Candidate]) -> Any:
    """log vCPUs, log memory/vCPU, log price and one column per family, scaled to [0, 1]."""
    import numpy as np

    families = sorted({c.family for c in candidates})
    rows = []
    for c in candidates:
        v = max(1, c.vcpus)
        row = [math.log(v), math.log(max(c.memory_gib, 0.1) / v),
               math.log(max(c.price_per_hour, 1e-9))]
        row += [1.0 if c.family == f else 0.0 for f in families] if len(families) > 1 else []
        rows.append(row)
    x = np.array(rows, dtype=float)
    span = x.max(axis=0) - x.min(axis=0)
    return (x - x.min(axis=0)) / np.where(span > 0, span, 1.0)


def _offsets(candidates: Sequence[Candidate], objective: str) -> Any:
    """The known part of each candidate's log objective: f = offset − log(units/s per vCPU)."""
    import numpy as np

    out = []
    for c in candidates:
        lv = math.log(max(1, c.vcpus))
        out.append(math.log(max(c.price_per_hour, 1e-12)) - lv if objective == "cost" else -lv)
    return np.array(out, dtype=float)


LENGTH_SCALES = (0.1, 0.2, 0.35, 0.6, 1.0, 2.0, 4.0)  # on features scaled to [0, 1]
NOISE_SHARES = (0.01, 0.05, 0.2)  # measurement noise as a share of the signal variance


def _matern52(a: Any, b: Any, length: float) -> Any:
    """Matérn ν = 5/2 correlation: smooth but not analytic, CherryPick's kernel."""
    import numpy as np

    r = np.sqrt(np.maximum(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1), 0.0)) / length
    s5 = math.sqrt(5.0) * r
    return (1.0 + s5 + 5.0 / 3.0 * r * r) * np.exp(-s5)


def _posterior(feats: Any, names: list[str], tried: list[str], measured: Mapping[str, float],
               candidates: Sequence[Candidate], seed: int) -> tuple[Any, Any]:
    """GP posterior mean and covariance of log(units/s per vCPU) at every candidate.

    A zero-mean GP on the standardised targets with a Matérn 5/2 kernel; its
    length scale and noise share are the pair of a small grid with the highest
    marginal likelihood (the signal variance in closed form). A grid of 21
    Cholesky factorisations of at most a few dozen points is microseconds,
    where a gradient fit of an ARD kernel (scikit-learn) took seconds per step
    and seconds more to import, for a handful of points that cannot pin an ARD
    kernel's per-feature scales anyway. ``seed`` is unused: the fit is exact.
    """
    import numpy as np

    idx = [names.index(n) for n in tried]
    y = np.array([math.log(measured[n] / _vcpus(candidates, n)) for n in tried])
    mu, sd = float(y.mean()), float(y.std()) or 1.0
    z = (y - mu) / sd
    x = feats[idx]
    best: tuple[float, Any, float, float] | None = None
    for length in LENGTH_SCALES:
        corr = _matern52(x, x, length)
        for share in NOISE_SHARES:
            k = corr + share * np.eye(len(idx))
            try:
                chol = np.linalg.cholesky(k)
            except np.linalg.LinAlgError:
                continue
            alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, z))
            amp = max(float(z @ alpha) / len(idx), 1e-6)  # the signal variance, profiled out
            loglik = -0.5 * len(idx) * math.log(amp) - float(np.log(np.diag(chol)).sum())
            if best is None or loglik > best[0]:
                best = (loglik, chol, length, amp)
    assert best is not None  # share > 0 keeps every matrix positive definite
    _, chol, length, amp = best
    cross = _matern52(feats, x, length)
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, z))
    v = np.linalg.solve(chol, cross.T)
    mean = mu + sd * (cross @ alpha)
    cov = amp * sd * sd * (_matern52(feats, feats, length) - v.T @ v)
    mean[idx] = y  # a tried machine is what was measured, not the GP's smoothing of it
    return mean, cov


def _expected_improvement(best: float, mean: float, sd: float) -> float:
    """E[max(0, best − f)] for f ~ N(mean, sd²): lower is better."""
    from scipy.stats import norm

    if sd <= 0:
        return max(0.0, best - mean)
    z = (best - mean) / sd
    return float(sd * (z * norm.cdf(z) + norm.pdf(z)))


def _pinned(cov: Any, tried: list[int], noise: float) -> Any:
    """The posterior covariance with each tried machine at what was measured, ± ``noise``.

    The GP's own posterior keeps a tried machine as uncertain as its fitted noise
    share says (up to a fifth of the spread across machines, ±10 % and more),
    and draws the untried ones as if that were so: its "P(the pick is the best)"
    said 73 % on average over 300 replays of known surfaces where the pick was
    the best in 85 %, and 96 % of the picks it gave 70-90 % were the best
    (``benchmarks/bench_search_confidence.py``). Here the untried machines are
    drawn given the tried ones at their measured values, and each tried one
    independently within the measurement noise: 88 % said where 85 % were, a
    calibration error of 0.037 against 0.116.
    """
    import numpy as np

    keep = [i for i in range(len(cov)) if i not in set(tried)]
    out = np.zeros_like(cov)
    if keep:
        cross = cov[np.ix_(keep, tried)]
        out[np.ix_(keep, keep)] = cov[np.ix_(keep, keep)] - cross @ np.linalg.pinv(
            cov[np.ix_(tried, tried)], hermitian=True) @ cross.T
    out[tried, tried] = noise * noise
    return out


def _confidence(offset: Any, mean: Any, cov: Any, pick: int, seed: int,
                need: Any = None) -> float:
    """Share of joint posterior draws in which ``pick`` has the lowest objective; under a
    deadline (``need``: see :func:`_needs`), the lowest of the draws that meet it, the pick
    meeting it too."""
    import numpy as np

    rng = np.random.default_rng(seed)
    draws = rng.multivariate_normal(mean, cov, size=CONFIDENCE_SAMPLES, method="eigh")
    f = offset[None, :] - draws
    if need is not None:
        f = np.where(draws >= need[None, :], f, np.inf)
    return float(np.mean((np.argmin(f, axis=1) == pick) & np.isfinite(f[:, pick])))


def _spread_pick(feats: Any, names: list[str], measured: Mapping[str, object]) -> int:
    """The untried candidate farthest from every tried one (the most central one first)."""
    import numpy as np

    done = [i for i, n in enumerate(names) if n in measured]
    untried = [i for i, n in enumerate(names) if n not in measured]
    if not done:
        centre = feats.mean(axis=0)
        return min(untried, key=lambda i: (float(np.sum((feats[i] - centre) ** 2)), i))
    dist = {i: min(float(np.sum((feats[i] - feats[j]) ** 2)) for j in done) for i in untried}
    return max(untried, key=lambda i: (dist[i], -i))
