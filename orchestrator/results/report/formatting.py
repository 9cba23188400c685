"""How a number reads in a report: one formatter per kind, shared by every renderer."""

from __future__ import annotations

import math
from typing import Any

DASH = "–"
EST = " (est.)"


def _finite(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def n_workers(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"


def fmt_rate(x: Any) -> str:
    if not _finite(x):
        return DASH
    x = float(x)
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def fmt_pct(x: Any) -> str:
    return f"{float(x) * 100:.0f}%" if _finite(x) else DASH


def fmt_bytes(x: Any) -> str:
    if not _finite(x):
        return DASH
    x = float(x)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(x) >= size:
            return f"{x / size:.3g} {unit}" if x / size < 1000 else f"{x / size:,.0f} {unit}"
    return f"{x:.0f} B"


def fmt_usd(x: Any, estimate: bool = False) -> str:
    if not _finite(x):
        return DASH
    x = float(x)
    text = f"${x:,.0f}" if abs(x) >= 1000 else f"${x:.3g}"
    return text + (EST if estimate else "")


def fmt_duration(seconds: Any) -> str:
    if not _finite(seconds):
        return DASH
    s = float(seconds)
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"
