"""How a number reads for a person: one formatter per kind, shared by the report's
renderers, the plan, the progress display and the error messages."""

from __future__ import annotations

import math
from typing import Any

from workloads.limits import format_size

DASH = "–"
EST = " (est.)"


def is_finite(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def n_workers(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"


def fmt_rate(x: Any) -> str:
    if not is_finite(x):
        return DASH
    x = float(x)
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def fmt_pct(x: Any) -> str:
    return f"{float(x) * 100:.0f}%" if is_finite(x) else DASH


def fmt_bytes(x: Any) -> str:
    """Binary units, three significant digits (the data plane's ``format_size``)."""
    return format_size(float(x)) if is_finite(x) else DASH


def fmt_usd(x: Any, estimate: bool = False) -> str:
    """Whole dollars from $1,000, cents from $1, three significant digits below (a cost per
    million units is often a few cents; ``--max-cost 1e-7`` must not read "$0.00")."""
    if not is_finite(x):
        return DASH
    x = float(x)
    if abs(x) >= 1000:
        text = f"${x:,.0f}"
    elif x == 0 or abs(x) >= 1:
        text = f"${x:,.2f}"
    else:
        whole, _, decimals = f"{x:.{2 - math.floor(math.log10(abs(x)))}f}".partition(".")
        text = f"${whole}.{decimals.rstrip('0').ljust(2, '0')}"
    return text + (EST if estimate else "")


def fmt_duration(seconds: Any) -> str:
    if not is_finite(seconds):
        return DASH
    s = float(seconds)
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"
