"""Judging a memory series: does it keep growing (a leak), and where are its spikes?

A leak is memory that keeps growing after the warm-up: we fit a least-squares
line to RSS over the steady phase (the samples after a warm-up fraction of the
trial) and call it a leak when the line's growth across that phase is a large
enough fraction of the steady RSS. Too few samples or too short a phase gives
"inconclusive" rather than a guess.

A spike is a short excursion (under about a second) above the local median.
Samples catch the spikes that
last longer than the sampling interval; the kernel's high-water mark catches
the rest — a peak far above every sample means a spike happened between two
samples, and we report it as one.
"""

from __future__ import annotations

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
    leaking = rel >= th.relative_growth and growth >= th.min_growth_bytes and steady_growth
    out["verdict"] = "leak" if leaking else "ok"
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
