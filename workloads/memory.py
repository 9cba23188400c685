"""Judging a memory series: does it keep growing (a leak), and where are its spikes?

A leak is memory that keeps growing after the warm-up: we fit a least-squares
line to RSS over the steady phase (the samples after a warm-up fraction of the
trial) and call it a leak when the line's growth across that phase is a large
enough fraction of the steady RSS. Too few samples or too short a phase gives
"inconclusive" rather than a guess.

A spike is a short excursion above that baseline. Samples catch the spikes that
last longer than the sampling interval; the kernel's high-water mark catches
the rest — a peak far above every sample means a spike happened between two
samples, and we report it as one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MB = 1_000_000

# A spike must rise above the baseline by this fraction of it AND by this many bytes.
SPIKE_RELATIVE = 0.25
SPIKE_MIN_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class LeakThresholds:
    warmup_fraction: float = 0.25  # ignore the first quarter of the trial (allocations settling)
    relative_growth: float = 0.10  # growth across the steady phase / steady median RSS
    min_growth_bytes: int = 8 * 1024 * 1024  # below this, growth is allocator noise
    min_samples: int = 10
    min_window_s: float = 1.0


def _fit(t: list[float], y: list[float]) -> tuple[float, float, float]:
    """Least-squares line through (t, y): slope, intercept, R²."""
    n = len(t)
    mt, my = sum(t) / n, sum(y) / n
    stt = sum((a - mt) ** 2 for a in t)
    sty = sum((a - mt) * (b - my) for a, b in zip(t, y, strict=True))
    syy = sum((b - my) ** 2 for b in y)
    slope = sty / stt if stt > 0 else 0.0
    r2 = (sty * sty) / (stt * syy) if stt > 0 and syy > 0 else 0.0
    return slope, my - slope * mt, r2


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


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
    leaking = rel >= th.relative_growth and growth >= th.min_growth_bytes
    out["verdict"] = "leak" if leaking else "ok"
    return out


def find_spikes(
    t: list[float],
    rss: list[int],
    peak_bytes: int | None,
    warmup_fraction: float = LeakThresholds.warmup_fraction,
) -> list[dict[str, Any]]:
    """Runs of samples well above the steady baseline, plus a between-samples spike.

    The baseline is the steady-phase line (so a slow leak is not a spike). When
    the exact peak (kernel high-water mark) is above the largest sample by more
    than the spike threshold, the memory rose and fell between two samples: we
    report it with ``t`` None and ``between_samples`` True.
    """
    if not t:
        return []
    slope, icpt, _r2, _ts, ys = baseline_fit(t, rss, warmup_fraction)
    spikes: list[dict[str, Any]] = []
    run: list[int] = []

    def close_run() -> None:
        if not run:
            return
        top = max(run, key=lambda i: rss[i])
        base = slope * t[top] + icpt
        spikes.append(
            {
                "t": round(t[top], 3),
                "rss_bytes": int(rss[top]),
                "above_baseline_bytes": int(rss[top] - base),
                "samples": len(run),
                "duration_s": round(t[run[-1]] - t[run[0]], 3),
                "between_samples": False,
            }
        )
        run.clear()

    for i, (a, b) in enumerate(zip(t, rss, strict=True)):
        base = slope * a + icpt
        if b - base > _spike_threshold(base):
            run.append(i)
        else:
            close_run()
    close_run()

    sampled_max = max(rss)
    if peak_bytes is not None:
        base = _median(ys) if ys else float(sampled_max)
        if peak_bytes - sampled_max > _spike_threshold(base):
            spikes.append(
                {
                    "t": None,
                    "rss_bytes": int(peak_bytes),
                    "above_baseline_bytes": int(peak_bytes - base),
                    "samples": 0,
                    "duration_s": None,
                    "between_samples": True,
                }
            )
    return spikes
