"""How sure is each answer: spread, the knee's range, and a scaling model (USL) per machine.

Pure functions, no I/O: the report, ``compare``, the adaptive planner and the
benchmarks all call these with plain numbers, so one figure means the same
thing everywhere. Inputs are *samples*: ``{workers: [units/s of each repeat]}``
for one machine.

Why these methods:

- **Spread** — a median alone hides that repeats on a shared host ranged
  9,030–13,659 units/s. :func:`spread` gives the IQR always and a bootstrap 95 %
  interval of the median once there are enough repeats for one to mean something
  (``MIN_REPEATS_FOR_CI``).
- **Knee** — "the smallest count no larger count beats by 10 %" can be moved by
  one noisy repeat, so :func:`knee_range` re-finds it on bootstrap resamples of
  the repeats and reports the range it lands in.
- **USL** — Gunther's Universal Scalability Law,
  ``X(N) = λN / (1 + σ(N−1) + κN(N−1))``, is the standard three-parameter model
  of throughput against concurrency: σ is contention (serial fraction), κ is
  coherency (cross-talk that makes throughput *fall* past a peak at
  ``N* = √((1−σ)/κ)``). It is fitted by bounded nonlinear least squares
  (σ, κ ∈ [0, 1], λ > 0) on relative errors, since run-to-run noise is a
  fraction of the rate (``scipy.optimize.least_squares``, what ``curve_fit``
  calls), and bootstrapped for intervals: the refits of a whole report run as
  one numpy batch (``usl_batch``).

scipy and numpy are imported inside functions: this module is imported by the
CLI's report path and must not slow ``cloudprof --help``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Samples = Mapping[int, Sequence[float]]
"""One machine's measurements: worker count → units/s of each repeat."""

KNEE_GAIN = 0.10
"""Scaling has stopped at worker count w when no larger tested count gives more
than this fraction more throughput than w (median over repeats)."""

CONFIDENCE = 0.95
N_BOOT = 200  # bootstrap resamples: enough for stable 2.5/97.5 % percentiles of a 3-parameter fit
MIN_REPEATS_FOR_CI = 4  # with 2–3 repeats a bootstrap interval is just [min, max]: show the IQR
MIN_DISTINCT_WORKERS = 3  # the USL has three parameters
POOR_FIT_R2 = 0.90
POOR_FIT_MAX_REL_ERROR = 0.15
"""A fit is called poor when R² < POOR_FIT_R2 or its curve misses the median of
any tested worker count by more than POOR_FIT_MAX_REL_ERROR (relative): the
curve is then not a trustworthy summary, and the report says so instead of
drawing it as if it were."""
KAPPA_ZERO = 1e-6  # see _fit_arrays: a coherency term this small is κ = 0
SEED = 20261122  # fixed: the same store gives the same intervals on every report


# ---------------------------------------------------------------- spread


def _np() -> Any:
    import numpy as np

    return np


def _median(values: Sequence[float]) -> float:
    return float(_np().median(_np().asarray(values, dtype=float)))


def _median_of_finite(values: Sequence[float]) -> float:
    """The median of a few finite floats without numpy: ``knee_range`` takes 2 × 1000 of them,
    and ``np.median``'s per-call overhead made that ~0.3 s of every report. Same value as
    ``np.median`` (the middle one, or the mean of the two middle ones)."""
    ordered = sorted(values)
    k = len(ordered) // 2
    return float(ordered[k]) if len(ordered) % 2 else (ordered[k - 1] + ordered[k]) / 2


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


@dataclass(frozen=True)
class Spread:
    """A median with how far the repeats spread around it."""

    median: float
    n: int
    q1: float  # interquartile range of the repeats
    q3: float
    ci: tuple[float, float] | None = None  # bootstrap 95 % interval of the median, when n allows

    @property
    def low(self) -> float:
        """Lower end of the interval shown: the CI when there is one, else Q1."""
        return self.ci[0] if self.ci else self.q1

    @property
    def high(self) -> float:
        return self.ci[1] if self.ci else self.q3

    @property
    def method(self) -> str:
        return "95% CI" if self.ci else "IQR"

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "n": self.n, "q1": self.q1, "q3": self.q3,
                "ci95": list(self.ci) if self.ci else None}


def bootstrap_ci(
    values: Sequence[float],
    stat: Callable[[Any], Any] | None = None,
    level: float = CONFIDENCE,
    n_boot: int = 2000,
    seed: int = SEED,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` (default: the median) over ``values``."""
    np = _np()
    x = np.asarray(_finite(values), dtype=float)
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one finite value")
    if stat is None:
        low, high = _median_cis(x[None, :], level, n_boot, seed)[:, 0]
        return float(low), float(high)
    rng = np.random.default_rng(seed)
    stats = np.apply_along_axis(stat, 1, x[rng.integers(0, x.size, size=(n_boot, x.size))])
    alpha = (1.0 - level) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return float(low), float(high)


def _median_cis(x: Any, level: float, n_boot: int, seed: int) -> Any:
    """Bootstrap intervals of the median of each row of ``x`` (rows of one length).

    Every row draws the same indices (one generator from ``seed``, as one row alone
    would), so rows of a length share one draw. The median of each resample is the
    middle of its sorted row (``_row_medians``)."""
    np = _np()
    size = x.shape[1]
    idx = np.random.default_rng(seed).integers(0, size, size=(n_boot, size))
    alpha = (1.0 - level) / 2
    return np.concatenate([  # 64 rows of 2,000 resamples at a time: ~8 MB
        np.quantile(_row_medians(x[at:at + 64][:, idx]), [alpha, 1 - alpha], axis=1)
        for at in range(0, len(x), 64)], axis=1)


def _row_medians(draws: Any) -> Any:
    """The median along the last axis, sorting ``draws`` in place: the middle value or the
    mean of the two middle ones, as ``np.median`` gives to the last bit, several times
    faster for a few values a row (its partition's overhead)."""
    draws.sort(axis=-1)
    k = draws.shape[-1] // 2
    return draws[..., k] if draws.shape[-1] % 2 else (draws[..., k - 1] + draws[..., k]) / 2


def spread(values: Sequence[float], seed: int = SEED) -> Spread | None:
    """Median, IQR and (from MIN_REPEATS_FOR_CI repeats on) a bootstrap 95 % CI; None if empty."""
    return spreads([values], seed)[0]


def spreads(groups: Sequence[Sequence[float]], seed: int = SEED) -> list[Spread | None]:
    """:func:`spread` of each group, those of one size at once (a report's 1,200 groups
    made 1,200 calls of numpy's small-array overhead each)."""
    np = _np()
    finite = [_finite(v) for v in groups]
    out: list[Spread | None] = [None] * len(finite)
    by_size: dict[int, list[int]] = {}
    for i in (i for i, x in enumerate(finite) if x):
        by_size.setdefault(len(finite[i]), []).append(i)
    for size, rows in by_size.items():
        x = np.array([finite[i] for i in rows], dtype=float)
        q1, med, q3 = np.quantile(x, [0.25, 0.5, 0.75], axis=1).tolist()
        ci = (_median_cis(x, CONFIDENCE, 2000, seed).T.tolist()
              if size >= MIN_REPEATS_FOR_CI else [None] * len(rows))
        for j, i in enumerate(rows):
            out[i] = Spread(median=med[j], n=size, q1=q1[j], q3=q3[j],
                            ci=None if ci[j] is None else (ci[j][0], ci[j][1]))
    return out


@dataclass(frozen=True)
class Comparison:
    """Ratio of two groups' medians (b / a) with its bootstrap interval."""

    ratio: float
    low: float
    high: float
    n_a: int
    n_b: int

    @property
    def clear(self) -> bool:
        """False when the interval contains 1: the two are within noise of each other."""
        return not (self.low <= 1.0 <= self.high)

    def describe(self) -> str:
        words = "higher" if self.ratio > 1 else "lower"
        if not self.clear:
            words = "no clear difference"
        return f"{self.ratio:.2f}x [{self.low:.2f}–{self.high:.2f}] ({words})"

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "ci95": [self.low, self.high], "n_a": self.n_a,
                "n_b": self.n_b, "clear_difference": self.clear}


def compare_groups(
    a: Sequence[float], b: Sequence[float], n_boot: int = 2000, seed: int = SEED
) -> Comparison | None:
    """Is ``b`` different from ``a``? Ratio of medians, resampling each group's repeats.

    With one repeat per side there is no spread to resample: the interval is the
    ratio itself and ``clear`` is True, which a caller should show with n=1 so a
    reader is not misled; :func:`within_noise` refuses to call that "clear".
    """
    np = _np()
    xa, xb = np.asarray(_finite(a)), np.asarray(_finite(b))
    if xa.size == 0 or xb.size == 0 or np.median(xa) <= 0:
        return None
    rng = np.random.default_rng(seed)
    ma = _row_medians(xa[rng.integers(0, xa.size, size=(n_boot, xa.size))])
    mb = _row_medians(xb[rng.integers(0, xb.size, size=(n_boot, xb.size))])
    ratios = mb / np.where(ma > 0, ma, np.nan)
    ratios = ratios[np.isfinite(ratios)]
    alpha = (1.0 - CONFIDENCE) / 2
    return Comparison(
        ratio=float(np.median(xb) / np.median(xa)),
        low=float(np.quantile(ratios, alpha)),
        high=float(np.quantile(ratios, 1 - alpha)),
        n_a=int(xa.size),
        n_b=int(xb.size),
    )


def within_noise(a: Sequence[float], b: Sequence[float], seed: int = SEED) -> bool:
    """True when the runner-up ``b`` cannot be told apart from the best ``a``.

    A single repeat on either side has no measured noise, so it can never show a
    clear difference: that is reported as within noise rather than as a win.
    """
    cmp = compare_groups(a, b, seed=seed)
    if cmp is None:
        return True
    if min(cmp.n_a, cmp.n_b) < 2:
        return True
    return not cmp.clear


# ---------------------------------------------------------------- knee


def knee_point(
    workers: Sequence[int], units_per_s: Sequence[float], gain: float = KNEE_GAIN
) -> int | None:
    """The smallest worker count that no larger tested count beats by more than ``gain``.

    Comparing against every larger count (not only the next one) keeps one noisy
    step from hiding a later jump. None when only the largest count qualifies
    (the last step still gained more than ``gain``: scaling had not stopped) or
    fewer than two counts have a finite rate.
    """
    points = sorted(
        (int(w), float(u)) for w, u in zip(workers, units_per_s, strict=True) if math.isfinite(u)
    )
    for i, (w, ups) in enumerate(points[:-1]):
        if all(u <= ups * (1.0 + gain) for _, u in points[i + 1 :]):
            return w
    return None


@dataclass(frozen=True)
class KneeRange:
    """The knee on the medians and where it lands across bootstrap resamples of the repeats."""

    workers: int | None  # on the medians (what a single-number report would say)
    low: int | None  # 2.5 % / 97.5 % of the resampled knees (None: not reached in that tail)
    high: int | None
    share: dict[int | None, float] = field(default_factory=dict)  # knee → fraction of resamples

    @property
    def stable(self) -> bool:
        """True when every resample finds the same knee (or there is no spread to resample)."""
        return len(self.share) <= 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "range95": [self.low, self.high],
            "share": {("not reached" if k is None else str(k)): v for k, v in self.share.items()},
        }


def _clean(samples: Samples) -> dict[int, list[float]]:
    out = {int(n): _finite(v) for n, v in samples.items()}
    return {n: v for n, v in sorted(out.items()) if v}


def knee_range(
    samples: Samples, gain: float = KNEE_GAIN, n_boot: int = 1000, seed: int = SEED
) -> KneeRange:
    """The knee with its bootstrap range: re-found on resampled repeats of every worker count.

    A knee that one noisy repeat can move shows up as a wide range (or a split
    between two counts in ``share``); a robust one as a single count.
    """
    np = _np()
    data = _clean(samples)
    ns = list(data)
    point = knee_point(ns, [_median_of_finite(data[n]) for n in ns], gain)
    found = _bootstrap_knees(data, gain, n_boot, np.random.default_rng(seed))
    if not found:
        return KneeRange(point, None, None, {})
    share: dict[int | None, float] = {}
    step = 1.0 / max(1, len(found))
    for k in found:
        share[k] = share.get(k, 0.0) + step
    # "Not reached" ranks above every count: scaling went on past the largest one tested.
    big = (max(ns) + 1) if ns else 1
    ranked = sorted((big if k is None else k) for k in found)
    lo = ranked[int(0.025 * (len(ranked) - 1))]
    hi = ranked[math.ceil(0.975 * (len(ranked) - 1))]
    return KneeRange(
        workers=point,
        low=None if lo == big else lo,
        high=None if hi == big else hi,
        share={k: round(v, 4) for k, v in sorted(share.items(), key=lambda kv: -kv[1])},
    )


def _bootstrap_knees(
    data: dict[int, list[float]], gain: float, n_boot: int, rng: Any
) -> list[int | None]:
    """``knee_point`` on the medians of ``n_boot`` stratified resamples, in numpy.

    The same figures as drawing one resample at a time, to the last bit, in a
    fraction of the time (a Python loop of 1000 resamples was ~0.1 s of every
    report; tests/test_model.py pins the equality). A resample draws each worker
    count's repeats with replacement; one ``integers`` call with
    per-element bounds takes the generator's draws in the order the loop did
    (resample by resample, worker count by worker count, repeat by repeat); the
    median is the middle value or the mean of the two middle ones, as
    ``_median_of_finite``; and "no larger count beats this one by more than
    ``gain``" is "the largest of the larger counts' medians does not" (the
    medians are finite).
    """
    np = _np()
    if n_boot <= 0:
        return []
    ns = list(data)
    if not ns:
        return [None] * n_boot
    values = [np.asarray(data[n], dtype=float) for n in ns]
    sizes = np.array([len(v) for v in values], dtype=np.int64)
    idx = rng.integers(0, np.tile(np.repeat(sizes, sizes), n_boot)).reshape(n_boot, -1)
    medians = np.empty((n_boot, len(ns)))
    start = 0
    for j, v in enumerate(values):
        draw = np.sort(v[idx[:, start:start + len(v)]], axis=1)
        k = len(v) // 2
        medians[:, j] = draw[:, k] if len(v) % 2 else (draw[:, k - 1] + draw[:, k]) / 2
        start += len(v)
    if len(ns) < 2:
        return [None] * n_boot
    # the largest median of the counts after each one (the last count has none to compare)
    after = np.maximum.accumulate(medians[:, :0:-1], axis=1)[:, ::-1]
    knee = after <= medians[:, :-1] * (1.0 + gain)
    labels = np.array([*ns, None], dtype=object)  # None: no count qualified
    return labels[np.where(knee.any(axis=1), knee.argmax(axis=1), len(ns))].tolist()


# ---------------------------------------------------------------- USL


def usl(n: Any, lam: float, sigma: float, kappa: float) -> Any:
    """Gunther's Universal Scalability Law: throughput at ``n`` workers (scalar or array)."""
    return lam * n / (1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0))


def peak_workers(sigma: float, kappa: float) -> float:
    """N* = √((1−σ)/κ), where the USL curve peaks; inf when κ = 0 (no retrograde scaling).

    At least 1: when the formula gives less (σ near 1), throughput falls from the
    first worker on, and the best count is one worker, not zero.
    """
    if kappa <= 0:
        return math.inf
    return max(1.0, math.sqrt(max(0.0, 1.0 - sigma) / kappa))


@dataclass(frozen=True)
class UslFit:
    """One least-squares USL fit: parameters, the predicted peak and how well it fits."""

    lam: float  # units/s of one worker, as the model sees it
    sigma: float  # contention: 0 = none, 1 = fully serial
    kappa: float  # coherency: > 0 makes throughput fall past N*
    n_star: float  # predicted peak worker count (inf when κ = 0)
    x_star: float  # predicted throughput at N* (λ/σ as N → ∞ when κ = 0)
    r2: float  # on the individual repeats
    max_rel_error: float  # worst |fit − median| / median over the tested worker counts
    rel_rmse: float  # root mean square of (repeat / fit − 1): the noise around the curve
    points: int
    tested: tuple[int, ...]

    def predict(self, n: Any) -> Any:
        return usl(n, self.lam, self.sigma, self.kappa)

    @property
    def poor(self) -> bool:
        return self.r2 < POOR_FIT_R2 or self.max_rel_error > POOR_FIT_MAX_REL_ERROR

    @property
    def peak_tested(self) -> bool:
        """True when a tested count lies beyond N*: the peak is interpolated, not extrapolated."""
        return math.isfinite(self.n_star) and max(self.tested) > self.n_star

    def verdict(self) -> str:
        """One line a user reads next to the fit."""
        if self.poor:
            return (
                f"poor fit (R² {self.r2:.2f}, worst miss {self.max_rel_error:.0%}): "
                "the USL does not describe these points; trust the measured medians"
            )
        if not math.isfinite(self.n_star):
            return f"good fit (R² {self.r2:.2f}); no peak predicted (κ = 0)"
        where = "within" if self.peak_tested else "beyond (extrapolated)"
        return f"good fit (R² {self.r2:.2f}); peak {where} the tested range"


def _initial_guess(n: Any, x: Any) -> tuple[float, float, float]:
    """Start values from the USL's linear form: N/X = ((1−σ) + (σ−κ)N + κN²)/λ.

    A least-squares quadratic in N through N/X gives all three parameters
    directly; they are clipped into the bounds and refined by curve_fit.
    """
    np = _np()
    try:
        c0, c1, c2 = np.linalg.lstsq(np.vstack([np.ones_like(n), n, n * n]).T, n / x, rcond=None)[
            0
        ]
        lam = 1.0 / (c0 + c1 + c2)  # N = 1: 1/X(1) = (c0 + c1 + c2)
        kappa = c2 * lam
        sigma = c1 * lam + kappa
    except (np.linalg.LinAlgError, ZeroDivisionError, FloatingPointError):
        lam, sigma, kappa = math.nan, math.nan, math.nan
    if not (math.isfinite(lam) and lam > 0):
        lam = float(np.max(x / n))
    sigma = min(max(sigma, 0.0), 0.99) if math.isfinite(sigma) else 0.05
    kappa = min(max(kappa, 1e-7), 0.99) if math.isfinite(kappa) else 1e-4
    return lam, sigma, kappa


def _least_squares(n: Any, x: Any, p0: tuple[float, float, float]) -> tuple[float, float, float]:
    """Bounded fit of the USL on relative errors, with its analytic Jacobian.

    This is what ``scipy.optimize.curve_fit(usl, n, x, sigma=x, bounds=...)``
    does, called one level down: curve_fit's wrapper (and the covariance it
    estimates, which the bootstrap makes redundant) tripled the time of a refit.
    """
    import numpy as np
    from scipy.optimize import least_squares

    def residuals(p: Any) -> Any:
        return usl(n, *p) / x - 1.0

    def jacobian(p: Any) -> Any:
        lam, sigma, kappa = p
        d = 1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0)
        g = -lam * n / (d * d) / x
        return np.column_stack([n / d / x, g * (n - 1.0), g * n * (n - 1.0)])

    result = least_squares(
        residuals,
        p0,
        jac=jacobian,
        bounds=([1e-12, 0.0, 0.0], [math.inf, 1.0, 1.0]),
        method="trf",
        x_scale=[max(p0[0], 1e-12), 0.1, 0.001],
        max_nfev=2000,
    )
    if result.status <= 0:
        raise RuntimeError(result.message)
    return float(result.x[0]), float(result.x[1]), float(result.x[2])


def _fit_arrays(n: Any, x: Any, p0: tuple[float, float, float] | None = None) -> tuple:
    """Best of the linearised start and a low-κ start (the surface has a flat κ valley)."""
    np = _np()
    starts = [p0] if p0 is not None else [_initial_guess(n, x)]
    if p0 is None:
        starts.append((float(np.max(x / n)), 0.05, 1e-5))
    best, best_sse = None, math.inf
    for start in starts:
        try:
            params = _least_squares(n, x, start)
        except (RuntimeError, ValueError):
            continue
        sse = float(np.sum(((usl(n, *params) - x) / x) ** 2))
        if sse < best_sse:
            best, best_sse = params, sse
    if best is None:
        raise ValueError("the USL fit did not converge")
    lam, sigma, kappa = best
    # κ on its bound, up to the optimiser's tolerance: the coherency term is below a
    # millionth of the denominator at the largest tested count, so the data show no
    # peak at all; a peak at N* = 10⁵ computed from round-off would be made up.
    top = float(np.max(n))
    if kappa * top * (top - 1.0) < KAPPA_ZERO * (1.0 + sigma * (top - 1.0)):
        kappa = 0.0
    return lam, sigma, kappa


def _flatten(samples: Samples) -> tuple[Any, Any]:
    np = _np()
    data = _clean(samples)
    n = np.array([w for w, vals in data.items() for _ in vals], dtype=float)
    x = np.array([v for vals in data.values() for v in vals], dtype=float)
    keep = x > 0
    return n[keep], x[keep]


def fit_usl(samples: Samples) -> UslFit | None:
    """Least-squares USL fit to every repeat of one machine; None below MIN_DISTINCT_WORKERS counts.

    Fitting all repeats (not the medians) lets worker counts with more repeats
    weigh more, and keeps the fit and its bootstrap on the same data.
    """
    np = _np()
    n, x = _flatten(samples)
    tested = tuple(sorted({int(v) for v in n}))
    if len(tested) < MIN_DISTINCT_WORKERS or np.any(n < 1):
        return None
    lam, sigma, kappa = _fit_arrays(n, x)
    return _make_fit(n, x, tested, lam, sigma, kappa)


def _make_fit(
    n: Any, x: Any, tested: tuple[int, ...], lam: float, sigma: float, kappa: float
) -> UslFit:
    np = _np()
    pred = usl(n, lam, sigma, kappa)
    ss_res = float(np.sum((x - pred) ** 2))
    ss_tot = float(np.sum((x - np.mean(x)) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    worst = 0.0
    for w in tested:
        med = float(np.median(x[n == w]))
        worst = max(worst, abs(float(usl(w, lam, sigma, kappa)) - med) / med)
    n_star = peak_workers(sigma, kappa)
    x_star = float(usl(n_star, lam, sigma, kappa)) if math.isfinite(n_star) else (
        lam / sigma if sigma > 0 else math.inf
    )
    return UslFit(
        lam=lam,
        sigma=sigma,
        kappa=kappa,
        n_star=n_star,
        x_star=x_star,
        r2=r2,
        max_rel_error=worst,
        rel_rmse=float(np.sqrt(np.mean((x / pred - 1.0) ** 2))),
        points=int(n.size),
        tested=tested,
    )


def _quantiles(values: Any, level: float = CONFIDENCE) -> tuple[float, float]:
    """Nearest-rank percentile interval that tolerates inf (an N* with κ = 0)."""
    s = _np().sort(_np().asarray(values, dtype=float))
    if not s.size:
        return math.nan, math.nan
    alpha = (1.0 - level) / 2
    return float(s[int(alpha * (s.size - 1))]), float(s[math.ceil((1 - alpha) * (s.size - 1))])


_POSITIVE = ("lam", "n_star", "x_star")  # widened on a log scale; σ and κ may be 0


@functools.cache
def _small_sample_factor(dof: int) -> float:
    """t(0.975, dof) / z(0.975): how much wider a 95 % interval must be with dof residuals.

    The residual bootstrap treats the few residuals it has as the whole noise
    distribution; with 6–7 trials and 3 parameters (dof 3–4) its percentile
    intervals are too narrow, most of all where ``--adaptive`` stops because the
    interval happened to be narrow. Replays of known USL surfaces
    (``bench_model.py``, 40 adaptive searches): the true N* fell inside the
    plain interval in 85 % of them and inside this one in 100 %, for one more
    trial on average (6.6 → 7.6). The factor falls to 1.1 by 20 residuals.
    """
    from scipy import stats

    dof = max(1, dof)
    return float(stats.t.ppf(0.5 + CONFIDENCE / 2, dof) / stats.norm.ppf(0.5 + CONFIDENCE / 2))


def _widen(interval: tuple[float, float], point: float, factor: float,
           log: bool) -> tuple[float, float]:
    """The interval scaled about the point estimate (on a log scale for positive values)."""
    lo, hi = interval
    if not all(math.isfinite(v) for v in (lo, hi, point)) or not lo <= point <= hi:
        return interval
    if log:
        if min(lo, point) <= 0:
            return interval
        return point * (lo / point) ** factor, point * (hi / point) ** factor
    return max(0.0, point - (point - lo) * factor), point + (hi - point) * factor


@dataclass(frozen=True)
class UslModel:
    """A USL fit with bootstrap intervals: what the report, ``--json`` and the planner read."""

    fit: UslFit
    boot: tuple[tuple[float, float, float], ...]  # (λ, σ, κ) of each bootstrap refit
    intervals: dict[str, tuple[float, float]]  # lam, sigma, kappa, n_star, x_star → 95 % interval

    @property
    def n_star_rel_halfwidth(self) -> float:
        """Half the 95 % interval of N* over N*: the ±x that ``--adaptive`` drives to ±10 %."""
        lo, hi = self.intervals["n_star"]
        if not (math.isfinite(self.fit.n_star) and math.isfinite(hi)) or self.fit.n_star <= 0:
            return math.inf
        return (hi - lo) / 2 / self.fit.n_star

    def band(self, workers: Sequence[float]) -> list[tuple[float, float, float]]:
        """(fit, low, high) throughput at each worker count: the curve and its 95 % band.

        Also the prediction at untested counts: the band says how far to trust it.
        """
        np = _np()
        ns = np.asarray(workers, dtype=float)
        if not self.boot:
            pred = self.fit.predict(ns)
            return [(float(p), float(p), float(p)) for p in pred]
        lam, sigma, kappa = np.array(self.boot, dtype=float).T[:, :, None]
        curves = usl(ns, lam, sigma, kappa)  # one row per resample, all at once
        alpha = (1.0 - CONFIDENCE) / 2
        lo = np.quantile(curves, alpha, axis=0)
        hi = np.quantile(curves, 1 - alpha, axis=0)
        return [
            (float(f), float(a), float(b))
            for f, a, b in zip(self.fit.predict(ns), lo, hi, strict=True)
        ]

    def to_dict(self, predict_at: Sequence[int] = ()) -> dict[str, Any]:
        """The fit for ``report --json``: parameters with intervals, peak, quality, predictions."""

        def num(v: float) -> float | None:
            return float(v) if math.isfinite(v) else None

        f = self.fit
        return {
            "model": "usl",
            "lambda": f.lam,
            "sigma": f.sigma,
            "kappa": f.kappa,
            "n_star": num(f.n_star),
            "x_star": num(f.x_star),
            "ci95": {k: [num(a), num(b)] for k, (a, b) in self.intervals.items()},
            "r2": f.r2,
            "max_rel_error": f.max_rel_error,
            "rel_rmse": f.rel_rmse,
            "poor_fit": f.poor,
            "peak_within_tested": f.peak_tested,
            "verdict": f.verdict(),
            "points": f.points,
            "tested_workers": list(f.tested),
            "bootstrap": {"method": "residuals", "resamples": len(self.boot)},
            "predictions": [
                {"workers": int(w), "units_per_s": p, "ci95": [lo, hi]}
                for w, (p, lo, hi) in zip(predict_at, self.band(predict_at), strict=True)
            ],
        }


    def to_state(self) -> dict[str, Any]:
        """Everything the model holds, as JSON values (a store keeps it: ``results.fits``)."""
        return {"fit": {**self.fit.__dict__, "tested": list(self.fit.tested)},
                "boot": [list(b) for b in self.boot],
                "intervals": {k: list(v) for k, v in self.intervals.items()}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> UslModel:
        fit = dict(state["fit"])
        return cls(fit=UslFit(**{**fit, "tested": tuple(fit["tested"])}),
                   boot=tuple(tuple(b) for b in state["boot"]),  # type: ignore[misc]
                   intervals={k: (v[0], v[1]) for k, v in state["intervals"].items()})


# Fits made in this process, by the data they came from (``fit_key``): a report fits each
# machine once, whoever asks (tables, plots, --json), and a store's kept fits
# (``orchestrator.results.fits``) are read into it. Each set in _FIT_LOGS collects the
# keys fitted or looked up while it is open.
FIT_VERSION = 1  # part of every key: a change to the fitting changes every key
_FITS: dict[str, UslModel | None] = {}
_FIT_LOGS: list[set[str]] = []


def fit_key(samples: Samples, n_boot: int = N_BOOT, seed: int = SEED) -> str:
    """The fit's identity: every (workers, units/s) it is fitted to, the resamples, the seed."""
    import hashlib

    np = _np()
    n, x = _flatten(samples)
    order = np.lexsort((x, n))
    data = np.stack([n[order], x[order]]).astype(float).tobytes()
    return hashlib.sha256(data + f"{n_boot}/{seed}/{FIT_VERSION}".encode()).hexdigest()[:32]


def fit_usl_with_intervals(
    samples: Samples, n_boot: int = N_BOOT, seed: int = SEED
) -> UslModel | None:
    """USL fit plus bootstrap 95 % intervals of λ, σ, κ, N* and X(N*); None if it cannot fit.

    Made once per data set in this process (see ``_FITS``). The bootstrap resamples
    the repeats' relative deviations from the fit (pooled over all worker counts,
    scaled by √(n/(n−3)) for the three fitted parameters) onto the fitted curve and
    refits. Resampling each count's own 2–3 repeats instead was measured to
    under-cover badly (the true N* fell inside the "95 %" interval in 72 % of noisy
    surfaces, against 88 % this way; tests/test_model.py and benchmarks/bench_model.py
    check coverage), because a draw from three values cannot be wider than those
    three values. Each refit starts from the point fit, and all of them run as one
    batch (``usl_batch``).
    """
    return fit_usl_many([samples], n_boot, seed)[0]


def fit_usl_many(
    many: Sequence[Samples], n_boot: int = N_BOOT, seed: int = SEED
) -> list[UslModel | None]:
    """:func:`fit_usl_with_intervals` of many data sets (a report's machines), the same
    models, with every bootstrap refit not yet made in one ``usl_batch`` call.

    A report of 200 machines made 200 batches of 200 refits; numpy's per-call overhead
    of those small batches was most of a first report's time. Here the resamples of
    every machine are stacked (padded to the longest, the padding weighted 0) and each
    row's steps are those it takes alone, so each model is the one its own call makes.
    """
    from orchestrator.analysis.usl_batch import least_squares_batch, stacked

    keys = [fit_key(s, n_boot, seed) for s in many]
    for log in _FIT_LOGS:
        log.update(keys)
    todo = {k: s for k, s in zip(keys, many, strict=True) if k not in _FITS}
    fits = {k: fit_usl(s) for k, s in todo.items()}
    _FITS.update({k: None for k, f in fits.items() if f is None})
    drawn = {k: (f, *_resamples(f, todo[k], n_boot, seed)) for k, f in fits.items() if f}
    if drawn:
        params, ok = least_squares_batch(*stacked([d[1:] for d in drawn.values()]))
        at = 0
        for key, (fit, n, bxs, _) in drawn.items():
            _FITS[key] = _with_intervals(fit, n, params[at:at + len(bxs)], ok[at:at + len(bxs)])
            at += len(bxs)
    return [_FITS[k] for k in keys]


def _resamples(
    fit: UslFit, samples: Samples, n_boot: int, seed: int
) -> tuple[Any, Any, tuple[float, float, float]]:
    """The worker counts, the ``n_boot`` resampled rates (one row each) and the refits' start."""
    np = _np()
    n, x = _flatten(samples)
    rng = np.random.default_rng(seed)
    fitted = fit.predict(n)
    dof = max(1, n.size - 3)
    rel_resid = (x / fitted - 1.0) * math.sqrt(n.size / dof)
    p0 = (fit.lam, min(fit.sigma, 0.99), max(fit.kappa, 1e-9))
    draws = rng.integers(0, n.size, size=(n_boot, n.size))  # the draws one at a time gave
    return n, np.maximum(fitted * (1.0 + rel_resid[draws]), 1e-12), p0


def _with_intervals(fit: UslFit, n: Any, params: Any, ok: Any) -> UslModel:
    """The model of ``fit`` and its refits (``params``, those that converged: ``ok``)."""
    np = _np()
    params = params.copy()
    top = float(np.max(n))  # κ this small is κ = 0, as in _fit_arrays
    flat = params[:, 2] * top * (top - 1.0) < KAPPA_ZERO * (1.0 + params[:, 1] * (top - 1.0))
    params[:, 2] = np.where(flat, 0.0, params[:, 2])
    boot = params[ok]
    lam, sigma, kappa = boot.T
    from orchestrator.analysis.usl_batch import peak_workers_each

    n_star = peak_workers_each(sigma, kappa)
    with np.errstate(divide="ignore", invalid="ignore"):
        x_star = np.where(np.isfinite(n_star), usl(n_star, lam, sigma, kappa),
                          np.where(sigma > 0, lam / sigma, math.inf))
    cols = {"lam": lam, "sigma": sigma, "kappa": kappa, "n_star": n_star, "x_star": x_star}
    intervals = {k: _quantiles(v) for k, v in cols.items()}
    point = {"lam": fit.lam, "sigma": fit.sigma, "kappa": fit.kappa,
             "n_star": fit.n_star, "x_star": fit.x_star}
    widen = _small_sample_factor(n.size - 3)
    intervals = {k: _widen(iv, point[k], widen, log=k in _POSITIVE) for k, iv in intervals.items()}
    return UslModel(fit, tuple(map(tuple, boot.tolist())), intervals)
