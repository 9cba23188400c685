"""Judging a memory series: does it keep growing (a leak), and where are its spikes?

A leak is memory that keeps growing after the warm-up: we fit a least-squares
line to RSS over the steady phase (the samples after a warm-up fraction of the
trial) and call it a leak when the line's growth across that phase is a large
enough fraction of the steady RSS. Too few samples or too short a phase gives
"inconclusive" rather than a guess.

Growth is not enough: 160 workers allocating their buffers one after another
(slower still on a loaded host) make RSS *ramp* well past the warm-up and then
level off. So the verdict also asks whether memory is still growing at the end:
a line with one bend (``end_slope``) through the steady phase gives the slope
at its end with a 95 % interval (standard error widened for the samples'
autocorrelation: RSS samples at 10 Hz are not independent), and from it the
probability that the end still grows at the leak rate. Growth that levels off
(that probability ≤ 5 %) is a ramp, "ok"; a probability ≥ 95 % is a leak; in
between, "inconclusive" with the probability shown — a longer trial or
``--warmup`` settles it.

A spike is a short excursion (under about a second) above the local median.
Samples catch the spikes that
last longer than the sampling interval; the kernel's high-water mark catches
the rest — a peak far above every sample means a spike happened between two
samples, and we report it as one.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

MB = 1_000_000

# A spike must rise above the baseline by this fraction of it AND by this many bytes.
SPIKE_RELATIVE = 0.25
SPIKE_MIN_BYTES = 32 * 1024 * 1024
# ... measured against the median of the surrounding ±SPIKE_WINDOW_S: a spike is shorter.
SPIKE_WINDOW_S = 1.0
SPIKE_BUCKET_S = 0.25


@dataclass(frozen=True)
class LeakThresholds:
    warmup_fraction: float = 0.25  # ignore the first quarter of the trial (allocations settling)
    relative_growth: float = 0.10  # growth across the steady phase / steady median RSS
    min_growth_bytes: int = 8 * 1024 * 1024  # below this, growth is allocator noise
    min_samples: int = 10
    min_window_s: float = 1.0
    confidence: float = 0.95  # leak when P(end grows at the leak rate) ≥ this; ok when ≤ 1 − this


def _fit(t: list[float], y: list[float]) -> tuple[float, float, float]:
    """Least-squares line through (t, y): slope, intercept, R² (the standard library's).

    No line (fewer than two distinct times) is slope 0; a flat line explains nothing (R² 0).
    """
    try:
        slope, intercept = statistics.linear_regression(t, y)
    except statistics.StatisticsError:  # < 2 points, or every t the same
        return 0.0, (statistics.fmean(y) if y else 0.0), 0.0
    try:
        r2 = statistics.correlation(t, y) ** 2
    except statistics.StatisticsError:  # y constant: the line explains no variance
        r2 = 0.0
    return slope, intercept, r2


@dataclass(frozen=True)
class SlopeEstimate:
    """A least-squares slope with its standard error, widened for autocorrelated samples."""

    slope: float
    stderr: float

    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
        return self.slope - z * self.stderr, self.slope + z * self.stderr

    def probability_above(self, rate: float) -> float:
        """P(true slope > rate) under a normal approximation; a step function when exact."""
        if self.stderr <= 0 or not math.isfinite(self.stderr):
            return 1.0 if self.slope > rate else 0.0
        return 1.0 - statistics.NormalDist(self.slope, self.stderr).cdf(rate)


def _ols(x: Any, y: Any, contrast: list[float]) -> tuple[float, float, float]:
    """OLS of y on the columns of x: contrast·β, its standard error, and the SSE.

    The standard error is inflated by √((1+ρ)/(1−ρ)), ρ the lag-1
    autocorrelation of the residuals (clipped to [0, 0.99]): a sampler sees the
    same allocations several times, so n samples carry the information of about
    n(1−ρ)/(1+ρ) independent ones. Without this every wobble is "significant".
    """
    import numpy as np

    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    sse = float(resid @ resid)
    c = np.asarray(contrast)
    value = float(c @ beta)
    dof = len(y) - x.shape[1]
    if dof <= 0 or sse <= 0:
        return value, 0.0 if sse <= 0 else math.inf, sse
    rho = min(max(float(resid[1:] @ resid[:-1]) / sse, 0.0), 0.99)
    cov = np.linalg.pinv(x.T @ x) * (sse / dof)
    stderr = math.sqrt(max(float(c @ cov @ c), 0.0) * (1 + rho) / (1 - rho))
    return value, stderr, sse


def line_slope(t: list[float], y: list[float]) -> SlopeEstimate:
    """The slope of a straight line through the series, with its (widened) standard error."""
    import numpy as np

    tt = np.asarray(t, dtype=float)
    if tt.size < 3:
        return SlopeEstimate(0.0, math.inf)
    tt = tt - tt[0]  # conditioning: seconds since the window opened
    x = np.column_stack([np.ones_like(tt), tt])
    slope, stderr, _ = _ols(x, np.asarray(y, dtype=float), [0.0, 1.0])
    return SlopeEstimate(slope, stderr)


def end_slope(t: list[float], y: list[float], breaks: int = 16) -> tuple[SlopeEstimate, float]:
    """The slope at the end of the series, allowing one bend: (slope, where it bends in s).

    Fits y = a + b·t + c·max(0, t − t₀) for t₀ on a grid over the middle of the
    window (20–85 %) and keeps the best, or the straight line when no bend fits
    better. Growth that levels off (buffers allocated, then reused) bends to a
    flat end; a leak keeps its slope. The end's slope is b + c with its standard
    error from the same fit.
    """
    import numpy as np

    tt = np.asarray(t, dtype=float)
    yy = np.asarray(y, dtype=float)
    if tt.size < 8:
        return line_slope(t, y), math.nan
    tt = tt - tt[0]
    span = float(tt[-1])
    line = np.column_stack([np.ones_like(tt), tt])
    best_slope, best_err, best_sse = _ols(line, yy, [0.0, 1.0])
    bend = math.nan
    for k in range(breaks):
        t0 = span * (0.20 + 0.65 * k / max(1, breaks - 1))
        if int(np.sum(tt > t0)) < 4:
            continue
        x = np.column_stack([line, np.maximum(0.0, tt - t0)])
        slope, err, sse = _ols(x, yy, [0.0, 1.0, 1.0])
        if sse < best_sse:
            best_slope, best_err, best_sse, bend = slope, err, sse, t0 + float(t[0])
    return SlopeEstimate(best_slope, best_err), bend


_median = statistics.median


def _spike_threshold(baseline: float) -> float:
    return max(baseline * SPIKE_RELATIVE, SPIKE_MIN_BYTES)


def _steady(t: list[float], rss: list[int], warmup_fraction: float) -> tuple[list, list]:
    if not t:
        return [], []
    start = t[0] + (t[-1] - t[0]) * warmup_fraction
    pairs = [(a, float(b)) for a, b in zip(t, rss, strict=True) if a >= start]
    return [a for a, _ in pairs], [b for _, b in pairs]


def baseline_fit(
    t: list[float], rss: list[int], warmup_fraction: float
) -> tuple[float, float, float, list[float], list[float]]:
    """Line through the steady phase, refitted once without spike samples.

    Dropping the samples far above the first fit keeps one big spike from
    masquerading as (or hiding) a trend.
    """
    ts, ys = _steady(t, rss, warmup_fraction)
    if len(ts) < 2:
        return 0.0, (ys[0] if ys else 0.0), 0.0, ts, ys
    slope, icpt, r2 = _fit(ts, ys)
    keep = [
        (a, b)
        for a, b in zip(ts, ys, strict=True)
        if b - (slope * a + icpt) <= _spike_threshold(slope * a + icpt)
    ]
    if 2 <= len(keep) < len(ts):
        ts, ys = [a for a, _ in keep], [b for _, b in keep]
        slope, icpt, r2 = _fit(ts, ys)
    return slope, icpt, r2, ts, ys


def leak_test(
    t: list[float], rss: list[int], thresholds: LeakThresholds | None = None
) -> dict[str, Any]:
    """The summary's ``leak`` entry: verdict "ok" | "leak" | "inconclusive" and the evidence."""
    th = thresholds or LeakThresholds()
    slope, _icpt, r2, ts, ys = baseline_fit(t, rss, th.warmup_fraction)
    window = (ts[-1] - ts[0]) if len(ts) >= 2 else 0.0
    out: dict[str, Any] = {
        "verdict": "inconclusive",
        "slope_mb_per_s": round(slope / MB, 6),
        "growth_bytes": int(slope * window),
        "relative_growth": None,
        "r2": round(r2, 4),
        "samples": len(ts),
        "window_s": round(window, 3),
        "warmup_fraction": th.warmup_fraction,
        "threshold_relative_growth": th.relative_growth,
    }
    if len(ts) < th.min_samples or window < th.min_window_s:
        out["reason"] = (
            f"need at least {th.min_samples} samples over {th.min_window_s:g} s after warm-up"
        )
        return out
    median = _median(ys)
    growth = slope * window
    rel = growth / median if median > 0 else 0.0
    out["relative_growth"] = round(rel, 4)
    # "Keeps growing": a single step up (data loaded mid-run) also has a slope, but not
    # growth in every third of the window. Each third's median must rise by at least a
    # quarter of what the line predicts.
    k = len(ys) // 3
    thirds = [_median(ys[:k]), _median(ys[k : 2 * k]), _median(ys[2 * k :])]
    step = growth / 3
    steady_growth = thirds[1] - thirds[0] >= step / 4 and thirds[2] - thirds[1] >= step / 4
    out["median_by_thirds_bytes"] = [int(m) for m in thirds]
    grew = rel >= th.relative_growth and growth >= th.min_growth_bytes and steady_growth
    whole = line_slope(ts, ys)
    out["slope_ci_mb_per_s"] = [round(v / MB, 6) for v in whole.interval(th.confidence)]
    # The leak rate: the growth across the steady window that the thresholds call a leak.
    leak_rate = max(th.relative_growth * median, th.min_growth_bytes) / window
    end, bend = end_slope(ts, ys)
    p_leak = end.probability_above(leak_rate)
    out["leak_rate_mb_per_s"] = round(leak_rate / MB, 6)
    out["end_slope_mb_per_s"] = round(end.slope / MB, 6)
    out["end_slope_ci_mb_per_s"] = [round(v / MB, 6) for v in end.interval(th.confidence)]
    out["bend_t"] = round(bend, 3) if math.isfinite(bend) else None
    out["probability"] = round(p_leak, 4) if grew else 0.0
    out["ramp"] = bool(grew and p_leak <= 1.0 - th.confidence)
    if not grew or out["ramp"]:
        out["verdict"] = "ok"
        if out["ramp"]:
            out["reason"] = "grew, then levelled off: a ramp (buffers being allocated), not a leak"
    elif p_leak >= th.confidence:
        out["verdict"] = "leak"
    else:
        out["reason"] = (
            f"grew, and the end may still grow (P = {p_leak:.0%}): run longer or with --warmup"
        )
    return out


def _local_baseline(t: list[float], rss: list[int]) -> list[float]:
    """Per sample, the median RSS of the surrounding ±SPIKE_WINDOW_S.

    Computed on bucket medians (SPIKE_BUCKET_S wide) so that it stays linear in the
    number of samples at 100 Hz over hours. A rise shorter than the window stands
    out against it; a step up or a slow leak does not, because the window follows it.
    """
    t0 = t[0]
    buckets: dict[int, list[int]] = {}
    for a, b in zip(t, rss, strict=True):
        buckets.setdefault(int((a - t0) / SPIKE_BUCKET_S), []).append(b)
    medians = {k: _median(v) for k, v in buckets.items()}
    reach = round(SPIKE_WINDOW_S / SPIKE_BUCKET_S)
    local: dict[int, float] = {}
    for k in medians:
        near = [medians[j] for j in range(k - reach, k + reach + 1) if j in medians]
        local[k] = _median(near)
    return [local[int((a - t0) / SPIKE_BUCKET_S)] for a in t]


def find_spikes(t: list[float], rss: list[int], peak_bytes: int | None) -> list[dict[str, Any]]:
    """Runs of samples well above their local baseline, plus a between-samples spike.

    When the exact peak (kernel high-water mark) is above the largest sample by
    more than the spike threshold, memory rose and fell between two samples: we
    report it with ``t`` None and ``between_samples`` True.
    """
    if not t:
        return []
    base = _local_baseline(t, rss)
    spikes: list[dict[str, Any]] = []
    run: list[int] = []

    def close_run() -> None:
        if not run:
            return
        top = max(run, key=lambda i: rss[i])
        spikes.append(
            {
                "t": round(t[top], 3),
                "rss_bytes": int(rss[top]),
                "above_baseline_bytes": int(rss[top] - base[top]),
                "samples": len(run),
                "duration_s": round(t[run[-1]] - t[run[0]], 3),
                "between_samples": False,
            }
        )
        run.clear()

    for i, b in enumerate(rss):
        if b - base[i] > _spike_threshold(base[i]):
            run.append(i)
        else:
            close_run()
    close_run()

    sampled_max = max(rss)
    if peak_bytes is not None:
        typical = _median([float(b) for b in rss])
        if peak_bytes - sampled_max > _spike_threshold(typical):
            spikes.append(
                {
                    "t": None,
                    "rss_bytes": int(peak_bytes),
                    "above_baseline_bytes": int(peak_bytes - typical),
                    "samples": 0,
                    "duration_s": None,
                    "between_samples": True,
                }
            )
    return spikes
