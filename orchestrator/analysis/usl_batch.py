"""The USL fit of many data sets at once: the bootstrap's refits as one numpy batch.

A report fits the USL (``orchestrator.analysis.model``) to every machine and refits it to
200 bootstrap resamples for its intervals; one scipy call per refit was 93 % of a
report's time. Standalone (numpy alone, no import of the model), so that the model's
module can move without it.
"""

from __future__ import annotations

from typing import Any

MAX_ITERATIONS = 500
CHUNK = 1 << 17  # values per array of a chunk (200 machines: 16x fewer ran 1.9x slower, more alike)


def least_squares_batch(n: Any, xs: Any, p0: Any, weights: Any = None) -> tuple[Any, Any]:
    """The bounded fit of ``model._least_squares`` for many data sets at once.

    ``xs`` holds one data set per row (the bootstrap's resamples); ``n`` their worker
    counts, one row shared by all or one row each; ``p0`` one start (λ, σ, κ) shared or
    one row each; ``weights`` (0 or 1 per point, optional) lets data sets of different
    lengths share one padded array: a point of weight 0 adds nothing. Returns the
    (λ, σ, κ) rows and which converged. A projected Levenberg–Marquardt in numpy over
    the whole batch: a coordinate on its bound whose gradient pushes it out stays there
    while the others move, in the same scaled coordinates as ``_least_squares``
    (``x_scale``) and to its tolerances. Each row's steps depend on that row alone, and
    converged rows leave the batch (once a quarter of a chunk has): the bootstraps of a
    whole report (200 machines × 200 resamples) are one call, as cheap per row as a
    small batch.
    """
    import numpy as np

    xs = np.asarray(xs, dtype=float)
    batch, m = xs.shape
    n = np.broadcast_to(np.asarray(n, dtype=float), (batch, m))
    w = np.ones((batch, m)) if weights is None else np.asarray(weights, dtype=float)
    start = np.broadcast_to(np.asarray(p0, dtype=float), (batch, 3))
    size = max(1, CHUNK // max(1, m))
    parts = [_solve(n[i:i + size], xs[i:i + size], w[i:i + size], start[i:i + size])
             for i in range(0, batch, size)]
    return np.concatenate([p for p, _ in parts]), np.concatenate([ok for _, ok in parts])


def stacked(parts: Any) -> tuple[Any, Any, Any, Any]:
    """(counts, rows of rates, start) of several data sets as one ``least_squares_batch``
    call's arrays: padded to the longest, the padding weighted 0."""
    import numpy as np

    width = max(b.shape[1] for _, b, _ in parts)

    def padded(rows: Any, fill: float) -> Any:
        return np.pad(rows, ((0, 0), (0, width - rows.shape[1])), constant_values=fill)

    return (np.concatenate([padded(np.broadcast_to(n, b.shape), 1.0) for n, b, _ in parts]),
            np.concatenate([padded(b, 1.0) for _, b, _ in parts]),
            np.concatenate([np.tile(p0, (len(b), 1)) for _, b, p0 in parts]),
            np.concatenate([padded(np.ones(b.shape), 0.0) for _, b, _ in parts]))


def _solve(n: Any, xs: Any, w: Any, start: Any) -> tuple[Any, Any]:
    """``least_squares_batch`` on one chunk of rows."""
    import numpy as np

    batch = xs.shape[0]
    scale = full_scale = np.stack([np.maximum(start[:, 0], 1e-12), np.full(batch, 0.1),
                                   np.full(batch, 0.001)], axis=1)
    lo, hi = np.array([1e-12, 0.0, 0.0]) / scale, np.array([np.inf, 1.0, 1.0]) / scale
    q = np.clip(start / scale, lo, hi)
    out, done_all = q.copy(), np.zeros(batch, dtype=bool)
    rows = np.arange(batch)  # the rows every array below holds: those still moving, mostly
    finished = np.zeros(batch, dtype=bool)
    mu = np.full(batch, 1e-3)
    eye = np.eye(3)
    data = (n * w / xs, n - 1.0, n * (n - 1.0), w)  # what every step reads of the points
    r, d = _residuals(q * scale, *data)
    cost = 0.5 * np.einsum("bm,bm->b", r, r)
    with np.errstate(all="ignore"):
        for _ in range(MAX_ITERATIONS):
            grad, hess = _normal_equations(q * scale, scale, r, d, *data)
            active = ((q <= lo + 1e-12) & (grad > 0)) | ((q >= hi - 1e-12) & (grad < 0))
            free = ~active
            flat = np.max(np.abs(np.where(free, grad, 0.0)), axis=1) < 1e-8 * np.maximum(1.0, cost)
            done = finished | flat
            mask = free[:, :, None] & free[:, None, :]
            a = np.where(mask, hess, 0.0) + eye * (active[:, :, None] + mu[:, None, None])
            step = -np.linalg.solve(a, np.where(free, grad, 0.0)[:, :, None])[:, :, 0]
            trial = np.clip(q + step, lo, hi)
            r_new, d_new = _residuals(trial * scale, *data)
            cost_new = 0.5 * np.einsum("bm,bm->b", r_new, r_new)
            better = (cost_new <= cost) & np.isfinite(cost_new) & ~done
            small = better & (cost - cost_new <= 1e-12 * cost) & (
                np.max(np.abs(trial - q), axis=1) <= 1e-8 * (1.0 + np.max(np.abs(q), axis=1)))
            q = np.where(better[:, None], trial, q)
            worse = ~better  # the steps refused keep their rows' residuals (few, past the start)
            r_new[worse], d_new[worse] = r[worse], d[worse]
            r, d = r_new, d_new
            cost = np.where(better, cost_new, cost)
            mu = np.where(better, np.maximum(mu / 3.0, 1e-12), np.minimum(mu * 4.0, 1e12))
            finished = done | small
            if finished.all():
                break
            if finished.sum() * 4 < len(finished):  # a quarter done: worth copying the rest
                continue
            out[rows], done_all[rows] = q, finished
            keep = ~finished
            finished = finished[keep]
            rows, q, r, d, cost, mu = rows[keep], q[keep], r[keep], d[keep], cost[keep], mu[keep]
            scale, lo, hi = scale[keep], lo[keep], hi[keep]
            data = tuple(a[keep] for a in data)
    out[rows], done_all[rows] = q, finished
    params = out * full_scale
    return params, done_all & np.all(np.isfinite(params), axis=1)


def _residuals(p: Any, nix: Any, n1: Any, nn1: Any, w: Any) -> tuple[Any, Any]:
    """The relative errors at (λ, σ, κ) rows ``p``, and the curve's denominator there.

    ``nix`` is N·w/x: the rate's λN/d over x, less the weight, is the relative error."""
    lam, sigma, kappa = p.T[:, :, None]
    d = 1.0 + sigma * n1 + kappa * nn1
    return lam * nix / d - w, d


def _normal_equations(p: Any, scale: Any, r: Any, d: Any, nix: Any, n1: Any, nn1: Any,
                      w: Any) -> tuple[Any, Any]:
    """Gradient Jᵀr and Gauss–Newton Hessian JᵀJ in the scaled coordinates.

    The Jacobian's columns are λ-free shapes times a factor per row (∂/∂λ = u,
    ∂/∂σ = −λ·u/d·(N−1), ∂/∂κ = −λ·u/d·N(N−1), with u = N/(d·x)): nine dot products
    of three shapes, not a (rows, points, 3) Jacobian and two einsums over it, which
    cost three times as much per step."""
    import numpy as np

    u = nix / d
    v = u / d
    shapes = (u, v * n1, v * nn1)
    factor = scale * np.stack([np.ones(len(p)), -p[:, 0], -p[:, 0]], axis=1)
    dots = np.empty((len(p), 3, 3))
    for i in range(3):
        for j in range(i, 3):
            dots[:, i, j] = dots[:, j, i] = np.einsum("bm,bm->b", shapes[i], shapes[j])
    grad = factor * np.stack([np.einsum("bm,bm->b", s, r) for s in shapes], axis=1)
    return grad, factor[:, :, None] * factor[:, None, :] * dots


def peak_workers_each(sigma: Any, kappa: Any) -> Any:
    """``model.peak_workers`` of each refit's (σ, κ), as arrays: inf where κ = 0, whatever
    σ (σ = 1 with κ = 0 is 0/0 in the formula, and one NaN refit spoils a batch's sums)."""
    import numpy as np

    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(kappa > 0, np.maximum(1.0, np.sqrt(np.maximum(0.0, 1.0 - sigma) / kappa)),
                        np.inf)
