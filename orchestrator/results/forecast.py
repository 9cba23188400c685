"""Forecast a figure at a data size that was not measured: the pure maths, no I/O.

A sweep with ``--grid rows=...`` measures time per run (or seconds per unit) and peak
memory at a few sizes; the user's question is the size they have not run. Four growth
laws are fitted to the points of one configuration:

* ``linear``     y = a + b·n
* ``n log n``    y = a + b·n·ln n
* ``n²``         y = a + b·n²
* ``power``      y = a + b·n^k, k in [0.25, 3]

The first three are the usual complexity classes, two parameters each; the power law is the
fallback for any other exponent, at the price of a third parameter that a few noisy points
pin down poorly (an exponent off by 0.2 is a forecast off by 60 % at 10×).

with a, b ≥ 0 (a start-up cost and a per-size cost cannot be negative), each by least
squares on the *relative* error (values span orders of magnitude; a 10 % miss at the
smallest size counts as much as one at the largest). For a fixed k the fit is linear in
(a, b) and solved in closed form, so the power law is a scan over a grid of k: no
optimiser, and a few hundred bootstrap refits cost milliseconds.

Which law: leave-one-out over the sizes. Each size is held out in turn, the law fitted to
the others and its prediction at the held-out size compared with the measurement (the log
of their ratio), and the root-mean-square of those is the law's error. The power law wins
only where its error is under half the best two-parameter law's (``EXPONENT_PRICE``): its
free exponent fits noise, or a second growth mixed in, as readily as the growth itself, and
an exponent between the classes pinned by a few noisy points extrapolates worse than the
nearest class. Otherwise, of the two-parameter laws within ``PARSIMONY`` of the best, the
simplest wins (linear, then n log n, then n²). A law is cross-validated only where every
fold keeps as many sizes as it has parameters (linear and n log n from three sizes, the
power law from four); with two sizes only the linear law is fitted, and it says so.

The interval: a residual bootstrap, seeded (``SEED``) so a report is the same twice. Each
replicate multiplies the fitted values by errors drawn with replacement from the chosen
law's leave-one-out errors (the in-sample residuals where no fold exists), refits the law
and predicts the target; the interval is the 2.5th to 97.5th percentile. The held-out
errors are what the law got wrong at a size it had not seen, which is what a forecast
does, so the interval is wider than the in-sample residuals would make it.

Limits (the docs page says them): a law that held over the measured sizes need not hold
beyond them (a cache that stops fitting, a spill to disk); past ``FAR`` times the largest
size the forecast is flagged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

LINEAR, NLOGN, SQUARE, POWER = "linear", "n log n", "n²", "power"
MODELS = (LINEAR, NLOGN, SQUARE, POWER)  # in order of simplicity
PARAMS = {LINEAR: 2, NLOGN: 2, SQUARE: 2, POWER: 3}
K_GRID = (0.25, 3.0, 0.01)  # the power law's exponents tried: start, stop, step
EXPONENT_PRICE = 2.0  # the power law must halve the best 2-parameter law's CV error to win
PARSIMONY = (1.10, 0.01)  # within 10 % or 0.01 of the best CV error: the simpler law wins
SEED = 20261126
RESAMPLES = 400
FAR = 10.0  # forecasts beyond this many times the largest measured size are flagged


@dataclass(frozen=True)
class Fit:
    """One law fitted to (size, value) points: y = a + b·f(n), f per ``model``."""

    model: str
    a: float
    b: float
    k: float = 1.0  # the power law's exponent (1 for the others)

    def predict(self, n: float) -> float:
        return self.a + self.b * float(_feature(self.model, _np().array([float(n)]), self.k)[0])

    def describe(self) -> str:
        """ "power (k = 1.98)", "n log n", "linear": how the law is named in a report."""
        return f"{POWER} (k = {self.k:.2f})" if self.model == POWER else self.model


@dataclass(frozen=True)
class Forecast:
    """A figure at ``target``: ``value`` and its bootstrap interval ``low``-``high``."""

    target: float
    value: float
    low: float
    high: float
    fit: Fit
    cv_error: float  # RMS of the leave-one-out log errors of the chosen law (NaN: none)
    cross_validated: bool  # False: two sizes, the linear law fitted without a check
    sizes: tuple[float, ...]  # the measured sizes it was fitted to
    scores: dict[str, float]  # every law's CV error (NaN where it could not be checked)

    @property
    def extrapolation(self) -> float:
        """The target over the largest measured size (below 1: inside the measured range)."""
        return self.target / max(self.sizes)

    @property
    def far(self) -> bool:
        return self.extrapolation > FAR


def _np() -> np:  # type: ignore[valid-type]
    import numpy

    return numpy


def _feature(model: str, n: np.ndarray, k: float | np.ndarray = 1.0) -> np.ndarray:
    np = _np()
    if model == LINEAR:
        return n
    if model == NLOGN:
        return n * np.log(np.maximum(n, 1.0))
    if model == SQUARE:
        return n * n
    return n ** k


def _solve(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least squares of relative error for y = a + b·x with a, b ≥ 0, broadcast over leading
    axes: x and y of shape (..., m). Returns (a, b, sum of squared relative errors)."""
    np = _np()
    u = 1.0 / y
    xu = x * u
    s_uu, s_ux, s_xx = (u * u).sum(-1), (u * xu).sum(-1), (xu * xu).sum(-1)
    t_u, t_x = u.sum(-1), xu.sum(-1)
    det = s_uu * s_xx - s_ux * s_ux
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(det > 0, (t_u * s_xx - t_x * s_ux) / det, -1.0)
        b = np.where(det > 0, (s_uu * t_x - s_ux * t_u) / det, -1.0)
        only_b = np.where(s_xx > 0, t_x / s_xx, 0.0)  # a = 0
        only_a = np.where(s_uu > 0, t_u / s_uu, 0.0)  # b = 0
    a_neg, b_neg = a < 0, b < 0
    a, b = np.where(a_neg, 0.0, a), np.where(a_neg, np.maximum(only_b, 0.0), b)
    a = np.where(b_neg & ~a_neg, only_a, a)
    b = np.where(b_neg & ~a_neg, 0.0, b)
    sse = ((a[..., None] * u + b[..., None] * xu - 1.0) ** 2).sum(-1)
    return a, b, sse


def fit_many(model: str, n: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
    """Fit ``model`` to every row of ``ys`` (shape (r, m)) at sizes ``n`` (m,): (a, b, k)."""
    np = _np()
    if model != POWER:
        a, b, _ = _solve(_feature(model, n)[None, :], ys)
        return a, b, np.ones_like(a)
    ks = np.arange(*K_GRID)
    x = n[None, :] ** ks[:, None]  # (K, m)
    a, b, sse = _solve(x[None, :, :], ys[:, None, :])  # (r, K)
    best = sse.argmin(axis=1)
    rows = np.arange(len(ys))
    return a[rows, best], b[rows, best], ks[best]


def fit(model: str, sizes: list[float], values: list[float]) -> Fit:
    """One law fitted to the points (relative least squares, a, b ≥ 0)."""
    np = _np()
    a, b, k = fit_many(model, np.asarray(sizes, float), np.asarray([values], float))
    return Fit(model, float(a[0]), float(b[0]), float(k[0]))


def cv_errors(model: str, sizes: list[float], values: list[float]) -> list[float]:
    """Leave-one-out: log(predicted / measured) at each size, fitted without it ([] when a
    fold would keep no more sizes than the law has parameters)."""
    if len(sizes) - 1 < PARAMS[model]:
        return []
    out = []
    for i in range(len(sizes)):
        rest = [j for j in range(len(sizes)) if j != i]
        law = fit(model, [sizes[j] for j in rest], [values[j] for j in rest])
        predicted = law.predict(sizes[i])
        out.append(math.log(max(predicted, 1e-300) / values[i]))
    return out


def _rms(errors: list[float]) -> float:
    return math.sqrt(sum(e * e for e in errors) / len(errors)) if errors else math.nan


def choose(sizes: list[float], values: list[float]) -> tuple[str, dict[str, list[float]]]:
    """The law by leave-one-out error (the power law where it halves the best class law's
    error, else the simplest class law near the best), and every law's held-out errors."""
    errors = {m: cv_errors(m, sizes, values) for m in MODELS}
    scored = {m: _rms(e) for m, e in errors.items() if e}
    if not scored:
        return LINEAR, errors
    two = [m for m in scored if PARAMS[m] == 2]
    if POWER in scored and (not two or scored[POWER] * EXPONENT_PRICE
                            < min(scored[m] for m in two)):
        return POWER, errors
    best = min(scored[m] for m in two)
    # the simplest law (MODELS is in order of simplicity) whose error is near the best's
    return next(m for m in MODELS if m in two
                and scored[m] <= max(PARSIMONY[0] * best, best + PARSIMONY[1])), errors


def forecast(sizes: list[float], values: list[float], target: float,
             seed: int = SEED, resamples: int = RESAMPLES) -> Forecast:
    """The value at ``target`` from (size, value) points, one per distinct size (the caller
    reduces repeats: the median time, the max peak). Needs two sizes and positive values."""
    np = _np()
    points = sorted((float(s), float(v)) for s, v in zip(sizes, values, strict=True)
                    if math.isfinite(s) and math.isfinite(v) and s > 0 and v > 0)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if len(set(xs)) != len(xs):
        raise ValueError("one value per size: reduce repeats before forecasting")
    if len(xs) < 2:
        raise ValueError("a forecast needs at least two measured sizes")
    model, errors = choose(xs, ys)
    law = fit(model, xs, ys)
    n = np.asarray(xs)
    fitted = law.a + law.b * _feature(model, n, law.k)
    residuals = np.asarray(errors[model]) if errors[model] \
        else np.log(np.asarray(ys) / np.maximum(fitted, 1e-300))
    rng = np.random.default_rng(seed)
    draws = rng.choice(residuals, size=(resamples, len(xs)), replace=True)
    a, b, k = fit_many(model, n, fitted[None, :] * np.exp(draws))
    predictions = a + b * _feature(model, np.asarray([float(target)]), k[:, None])[:, 0] \
        if model == POWER else a + b * float(_feature(model, np.asarray([float(target)]))[0])
    value = law.predict(target)
    low, high = (float(q) for q in np.percentile(predictions, [2.5, 97.5]))
    return Forecast(
        target=float(target), value=value, low=min(low, value), high=max(high, value),
        fit=law, cv_error=_rms(errors[model]), cross_validated=bool(errors[model]),
        sizes=tuple(xs), scores={m: _rms(e) for m, e in errors.items()})
