"""A small SVG chart writer: the report's figures as crisp vector files, drawn in milliseconds.

Why not matplotlib: at the end of every sweep it cost ~1.5 s to import and ~2–4 s
to lay out and rasterise five PNGs (``benchmarks/bench_sweep.py``), a seventh of a
short dry run, for charts that are a few lines, markers and bars. Here a figure is
plain data (panels holding series) until ``to_svg()`` writes it: the tests read
that data (which colour, which points), and the layout is fixed arithmetic
(legends beside or below the panels, never on them; text widths estimated from
the font size, so nothing needs a font file). Pure Python, no import cost.

The parts: ``Figure`` (a grid of ``Panel``s, a title, one legend) and ``Panel``
(axes with linear, log-2 or log-10 scales, and the series drawn on them: lines,
markers, error bars, bands, spans, segments, stacked bars, labels).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FONT = 11.0
"""Font size of tick labels and legends, in px; titles are a little larger."""
CHAR = 0.58
"""Average glyph width of a sans-serif font as a fraction of its size (to place text)."""

DASHES = {"-": None, "--": "6,4", ":": "1.5,3", "-.": "6,3,1.5,3", "none": None}
"""SVG dash arrays for the line styles the figures use (matplotlib's names)."""

MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")
"""The marker shapes drawn (matplotlib's names); another name is drawn as a diamond."""


@dataclass
class Series:
    """One thing drawn on a panel, with the data it was drawn from (what tests read).

    ``kind``: ``line`` (x/y joined; ``linestyle="none"`` draws markers only),
    ``errorbar`` (a vertical bar from ``low`` to ``high`` at each x), ``band``
    (filled between ``low`` and ``high``), ``span`` (a vertical strip from x[0]
    to x[1]), ``segment`` (a line from (x[0], y[0]) to (x[1], y[1])), ``bar``
    (bars at category positions x, from ``low`` up by y), ``text`` (``texts`` at
    each point).
    """

    kind: str
    x: list[float]
    y: list[float]
    colour: str
    label: str | None = None
    linestyle: str = "-"
    marker: str | None = None
    size: float = 6.0
    hollow: bool = False
    alpha: float = 1.0
    width: float = 1.5
    low: list[float] | None = None
    high: list[float] | None = None
    texts: list[str] | None = None
    face: str | None = None  # a marker's fill when not its colour: "none" (see-through)


def _floats(values: Any) -> list[float]:
    return [float(v) for v in values]


@dataclass
class Panel:
    """One set of axes: its scales, limits, labels and series."""

    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    xscale: str = "linear"  # "linear" | "log2"
    yscale: str = "linear"  # "linear" | "log"
    xlim: tuple[float | None, float | None] = (None, None)
    ylim: tuple[float | None, float | None] = (None, None)
    xticks: list[tuple[float, str]] | None = None  # (value, label); None: chosen from the data
    xcategories: list[str] | None = None  # bar charts: x are positions 0..n-1 with these labels
    grid: bool = True
    note: str | None = None  # a sentence centred on an empty panel ("no price known ...")
    series: list[Series] = field(default_factory=list)

    # ------------------------------------------------------------- adding series
    def line(
        self,
        x: Any,
        y: Any,
        colour: str,
        label: str | None = None,
        linestyle: str = "-",
        marker: str | None = None,
        size: float = 6.0,
        hollow: bool = False,
        alpha: float = 1.0,
        width: float = 1.5,
        face: str | None = None,
    ) -> Series:
        """``hollow``: markers filled white (drawn over a point, they hide it); ``face="none"``:
        see-through markers that ring a point (the Pareto front)."""
        xs, ys = _floats(x), _floats(y)
        return self._add(Series("line", xs, ys, colour, label, linestyle, marker, size, hollow,
                                alpha, width, face=face))  # fmt: skip

    def points(
        self,
        x: Any,
        y: Any,
        colour: str,
        label: str | None = None,
        marker: str = "o",
        size: float = 6.0,
        hollow: bool = False,
        alpha: float = 1.0,
    ) -> Series:
        return self.line(x, y, colour, label, "none", marker, size, hollow, alpha)

    def errorbar(self, x: Any, low: Any, high: Any, colour: str, alpha: float = 0.8) -> Series:
        xs, lo, hi = _floats(x), _floats(low), _floats(high)
        mid = [(a + b) / 2 for a, b in zip(lo, hi, strict=True)]
        return self._add(
            Series("errorbar", xs, mid, colour, alpha=alpha, width=1.2, low=lo, high=hi)
        )

    def band(self, x: Any, low: Any, high: Any, colour: str, alpha: float = 0.15) -> Series:
        lo, hi = _floats(low), _floats(high)
        return self._add(Series("band", _floats(x), lo + hi, colour, alpha=alpha, low=lo, high=hi))

    def span(self, x0: float, x1: float, colour: str, alpha: float = 0.06) -> Series:
        return self._add(Series("span", [float(x0), float(x1)], [], colour, alpha=alpha))

    def segment(
        self, x0: float, x1: float, y: float, colour: str, linestyle: str = ":", alpha: float = 0.8
    ) -> Series:
        return self._add(
            Series(
                "segment",
                [float(x0), float(x1)],
                [float(y), float(y)],
                colour,
                linestyle=linestyle,
                alpha=alpha,
                width=1.2,
            )
        )

    def hline(self, y: float, colour: str = "#808080", linestyle: str = "--") -> Series:
        """A horizontal line across the whole panel (x is filled in when drawn)."""
        return self._add(
            Series(
                "segment",
                [-math.inf, math.inf],
                [float(y), float(y)],
                colour,
                linestyle=linestyle,
                width=1.0,
            )
        )

    def bars(self, heights: Any, bottoms: Any, colour: str, label: str | None = None) -> Series:
        h = _floats(heights)
        return self._add(
            Series("bar", [float(i) for i in range(len(h))], h, colour, label, low=_floats(bottoms))
        )

    def labels(self, x: Any, y: Any, texts: list[str]) -> Series:
        return self._add(Series("text", _floats(x), _floats(y), "#222222", texts=list(texts)))

    def _add(self, series: Series) -> Series:
        self.series.append(series)
        return series

    # ------------------------------------------------------------- limits
    def data_x(self) -> list[float]:
        return [v for s in self.series if s.kind != "text" for v in s.x if math.isfinite(v)]

    def data_y(self) -> list[float]:
        out: list[float] = []
        for s in self.series:
            if s.kind == "bar":
                out += [b + h for b, h in zip(s.low or [], s.y, strict=True)] + list(s.low or [])
            elif s.kind in ("errorbar", "band"):
                out += list(s.low or []) + list(s.high or [])
            elif s.kind != "span":
                out += s.y
        return [v for v in out if math.isfinite(v)]

    def limits(self) -> tuple[float, float, float, float]:
        """(x0, x1, y0, y1) in data units: the set limits, else the data's with a margin."""
        if self.xcategories is not None:
            x0, x1 = -0.6, len(self.xcategories) - 0.4
        else:
            x0, x1 = _padded(self.data_x() or [0.0, 1.0], self.xscale, self.xlim)
        y0, y1 = _padded(self.data_y() or [0.0, 1.0], self.yscale, self.ylim)
        return x0, x1, y0, y1


def _padded(values: list[float], scale: str, fixed: tuple[float | None, float | None]):
    """Data range with a 5 % margin (in the scale's space) on each end that was not set."""
    log = scale != "linear"
    if log:
        values = [v for v in values if v > 0] or [1.0]
    f = math.log if log else (lambda v: v)
    g = math.exp if log else (lambda v: v)
    set_lo = fixed[0] is not None and (not log or fixed[0] > 0)
    set_hi = fixed[1] is not None and (not log or fixed[1] > 0)
    a = f(fixed[0]) if set_lo else f(min(values))
    b = f(fixed[1]) if set_hi else f(max(values))
    if a >= b:
        half = 0.5 if log else max(abs(a) * 0.1, 0.5)
        a, b = (
            (a, a + 2 * half) if set_lo else (b - 2 * half, b) if set_hi else (a - half, b + half)
        )
    pad = (b - a) * 0.05
    return g(a) if set_lo else g(a - pad), g(b) if set_hi else g(b + pad)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 × 10^k steps) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    v = first
    while v <= hi + step * 1e-9:
        ticks.append(0.0 if abs(v) < step * 1e-9 else v)
        v += step
    return ticks


def log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten within [lo, hi] (with 2× and 5× between when there are few)."""
    ticks = [10.0**k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    inside = [t for t in ticks if lo <= t <= hi]
    if len(inside) < 3:
        inside = sorted(t * m for t in ticks for m in (1, 2, 5) if lo <= t * m <= hi)
    return inside


def tick_label(v: float) -> str:
    if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
        return f"{v:.0e}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def text_width(text: str, size: float = FONT) -> float:
    return len(text) * size * CHAR


# ---------------------------------------------------------------- the figure


@dataclass
class LegendEntry:
    label: str
    colour: str
    linestyle: str = "-"
    marker: str | None = None
    patch: bool = False  # a filled square (bars, spans) rather than a line
    alpha: float = 1.0
    hollow: bool = False
    face: str | None = None


@dataclass
class Figure:
    """A grid of panels with a title and one legend (beside them, or below with ``legend_below``).

    ``width`` and ``height`` are in px. The legend holds every labelled series of
    the panels (labels starting with ``_`` are left out, as matplotlib does),
    plus ``extra_legend`` entries.
    """

    width: float = 760.0
    height: float = 420.0
    rows: int = 1
    cols: int = 1
    title: str = ""
    legend_below: bool = False
    xlabel: str = ""  # one label under the middle column (a grid's panels share their x)
    panels: list[Panel] = field(default_factory=list)
    extra_legend: list[LegendEntry] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.panels:
            self.panels = [Panel() for _ in range(self.rows * self.cols)]

    def panel(self, row: int = 0, col: int = 0) -> Panel:
        return self.panels[row * self.cols + col]

    def legend(self) -> list[LegendEntry]:
        entries: list[LegendEntry] = []
        seen: set[str] = set()
        for p in self.panels:
            for s in p.series:
                if s.label and not s.label.startswith("_") and s.label not in seen:
                    seen.add(s.label)
                    entries.append(
                        LegendEntry(
                            s.label,
                            s.colour,
                            s.linestyle,
                            s.marker,
                            patch=s.kind == "bar",
                            hollow=s.hollow,
                            face=s.face,
                        )
                    )
        return entries + self.extra_legend

    def share(self, x: bool = True, y_by_column: bool = True) -> None:
        """Give the panels one x range, and each column one y range (worker counts compare)."""
        limits = [p.limits() for p in self.panels]
        if x and self.panels:
            x0, x1 = min(v[0] for v in limits), max(v[1] for v in limits)
            for p in self.panels:
                p.xlim = (x0, x1)
        if y_by_column:
            for c in range(self.cols):
                col = [limits[r * self.cols + c] for r in range(self.rows)]
                y0, y1 = min(v[2] for v in col), max(v[3] for v in col)
                for r in range(self.rows):
                    self.panel(r, c).ylim = (y0, y1)

    # ------------------------------------------------------------- layout
    def layout(self) -> dict[str, Any]:
        """Where things go, in px: ``panels`` (x, y, w, h) each, the ``legend`` box and the
        figure's ``height`` (``self.height``, or more when a long legend needs it)."""
        entries = self.legend()
        item_w = [28 + text_width(e.label) for e in entries]
        top = 34.0 if self.title else 12.0
        height = self.height  # grown when a long legend would not fit: never cut off
        if entries and not self.legend_below:
            legend_w = max(item_w) + 16
            legend_h = 18.0 * len(entries) + 8
            height = max(height, top + legend_h + 8)
            legend = (self.width - legend_w - 4, top, legend_w, legend_h)
            right, bottom_extra = legend_w + 12, 0.0
        elif entries:
            per_row = max(1, int((self.width - 20) // (max(item_w) + 12)))
            lines = math.ceil(len(entries) / per_row)
            legend_h = 18.0 * lines + 8
            height = max(height, top + legend_h + 12 + 150.0 * self.rows)
            legend = (10.0, height - legend_h - 4, self.width - 20, legend_h)
            right, bottom_extra = 12.0, legend_h + 8
        else:
            legend, right, bottom_extra = None, 12.0, 0.0
        ylabel_lines = max((p.ylabel.count("\n") + 1 for p in self.panels if p.ylabel), default=0)
        left_each = 46.0 + 14.0 * ylabel_lines
        has_titles = any(p.title for p in self.panels)
        xlabel_h = 34.0 if (self.xlabel or any(p.xlabel for p in self.panels)) else 20.0
        grid_w = self.width - right
        grid_h = height - top - bottom_extra
        cell_w, cell_h = grid_w / self.cols, grid_h / self.rows
        boxes = []
        for r in range(self.rows):
            for c in range(self.cols):
                x = c * cell_w + left_each
                y = top + r * cell_h + (16.0 if has_titles else 4.0)
                w = cell_w - left_each - 10
                h = (
                    cell_h
                    - (16.0 if has_titles else 4.0)
                    - (xlabel_h if r == self.rows - 1 else 22.0)
                )
                boxes.append((x, y, max(w, 10.0), max(h, 10.0)))
        return {"panels": boxes, "legend": legend, "entries": entries, "height": height}

    # ------------------------------------------------------------- drawing
    def to_svg(self) -> str:
        """The figure as a standalone SVG document."""
        lay = self.layout()
        e, height = html.escape, lay["height"]
        out = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width:.0f}" '
            f'height="{height:.0f}" viewBox="0 0 {self.width:.0f} {height:.0f}" '
            f'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="{FONT:g}">',
            '<rect width="100%" height="100%" fill="white"/>',
        ]
        if self.title:
            out.append(
                f'<text x="{self.width / 2:.1f}" y="22" text-anchor="middle" '
                f'font-size="{FONT + 3:g}">{e(self.title)}</text>'
            )
        for i, (panel, box) in enumerate(zip(self.panels, lay["panels"], strict=True)):
            out += _draw_panel(panel, box, f"p{i}")
        if self.xlabel:
            mid = lay["panels"][(self.rows - 1) * self.cols + self.cols // 2]
            out.append(
                f'<text x="{mid[0] + mid[2] / 2:.1f}" y="{mid[1] + mid[3] + 30:.1f}" '
                f'text-anchor="middle">{e(self.xlabel)}</text>'
            )
        if lay["legend"] is not None:
            out += _draw_legend(lay["entries"], lay["legend"], self.legend_below)
        out.append("</svg>")
        return "\n".join(out) + "\n"

    def _repr_svg_(self) -> str:  # Jupyter shows the figure inline
        return self.to_svg()

    def savefig(self, path: str | Path) -> None:
        """Write the SVG atomically (a reader never sees half a figure)."""
        from orchestrator.atomic import atomic_write_bytes

        atomic_write_bytes(Path(path), self.to_svg().encode())


def _dash(linestyle: str) -> str:
    dash = DASHES.get(linestyle)
    return f' stroke-dasharray="{dash}"' if dash else ""


def _marker(
    kind: str, x: float, y: float, size: float, colour: str, hollow: bool, alpha: float,
    face: str | None = None,
) -> str:  # fmt: skip
    fill = face or ("white" if hollow else colour)
    style = f'fill="{fill}" stroke="{colour}" stroke-width="1.2"' + (
        f' opacity="{alpha:g}"' if alpha < 1 else ""
    )
    r = size / 2
    if kind == "o":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" {style}/>'
    if kind == "s":
        return (
            f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{size:.1f}" '
            f'height="{size:.1f}" {style}/>'
        )
    shapes = {
        "^": [(0, -r), (r, r * 0.8), (-r, r * 0.8)],
        "v": [(0, r), (r, -r * 0.8), (-r, -r * 0.8)],
        "D": [(0, -r), (r * 0.75, 0), (0, r), (-r * 0.75, 0)],
        "P": [
            (-r / 3, -r),
            (r / 3, -r),
            (r / 3, -r / 3),
            (r, -r / 3),
            (r, r / 3),
            (r / 3, r / 3),
            (r / 3, r),
            (-r / 3, r),
            (-r / 3, r / 3),
            (-r, r / 3),
            (-r, -r / 3),
            (-r / 3, -r / 3),
        ],
        "X": [
            (-r, -r + 2),
            (-r + 2, -r),
            (0, -2),
            (r - 2, -r),
            (r, -r + 2),
            (2, 0),
            (r, r - 2),
            (r - 2, r),
            (0, 2),
            (-r + 2, r),
            (-r, r - 2),
            (-2, 0),
        ],
    }
    if kind == "*":
        pts = [
            (
                (r if k % 2 == 0 else r * 0.45) * math.sin(k * math.pi / 5),
                -(r if k % 2 == 0 else r * 0.45) * math.cos(k * math.pi / 5),
            )
            for k in range(10)
        ]
    else:
        pts = shapes.get(kind, shapes["D"])
    path = " ".join(f"{x + dx:.1f},{y + dy:.1f}" for dx, dy in pts)
    return f'<polygon points="{path}" {style}/>'


def _draw_panel(p: Panel, box: tuple[float, float, float, float], clip: str) -> list[str]:
    bx, by, bw, bh = box
    x0, x1, y0, y1 = p.limits()
    fx = (lambda v: math.log2(v)) if p.xscale != "linear" else (lambda v: v)
    fy = (lambda v: math.log10(v)) if p.yscale != "linear" else (lambda v: v)
    ax0, ax1, ay0, ay1 = fx(x0), fx(x1), fy(y0), fy(y1)

    def X(v: float) -> float:
        v = min(max(v, x0), x1) if not math.isfinite(v) else v
        if p.xscale != "linear" and v <= 0:
            v = x0
        return bx + (fx(v) - ax0) / (ax1 - ax0) * bw

    def Y(v: float) -> float:
        if p.yscale != "linear" and v <= 0:
            v = y0
        return by + bh - (fy(v) - ay0) / (ay1 - ay0) * bh

    e = html.escape
    out = [
        f'<clipPath id="{clip}"><rect x="{bx:.1f}" y="{by:.1f}" width="{bw:.1f}" '
        f'height="{bh:.1f}"/></clipPath>'
    ]
    if p.xcategories is not None:
        xt = [(float(i), c) for i, c in enumerate(p.xcategories)]
    elif p.xticks is not None:
        xt = [(v, t) for v, t in p.xticks if x0 <= v <= x1]
    else:
        xt = [(v, tick_label(v)) for v in nice_ticks(x0, x1)]
    yvals = log_ticks(y0, y1) if p.yscale != "linear" else nice_ticks(y0, y1)
    yt = [(v, tick_label(v)) for v in yvals if y0 - 1e-12 <= v <= y1 + 1e-12]
    for v, t in xt:
        x = X(v)
        if p.grid and p.xcategories is None:
            out.append(
                f'<line x1="{x:.1f}" y1="{by:.1f}" x2="{x:.1f}" y2="{by + bh:.1f}" '
                'stroke="#dddddd" stroke-width="0.8"/>'
            )
        out.append(
            f'<text x="{x:.1f}" y="{by + bh + 14:.1f}" text-anchor="middle" '
            f'font-size="{FONT - 1:g}">{e(t)}</text>'
        )
    for v, t in yt:
        y = Y(v)
        if p.grid:
            out.append(
                f'<line x1="{bx:.1f}" y1="{y:.1f}" x2="{bx + bw:.1f}" y2="{y:.1f}" '
                'stroke="#dddddd" stroke-width="0.8"/>'
            )
        out.append(
            f'<text x="{bx - 4:.1f}" y="{y + 4:.1f}" text-anchor="end" '
            f'font-size="{FONT - 1:g}">{e(t)}</text>'
        )
    out.append(f'<g clip-path="url(#{clip})">')
    for s in p.series:
        out += _draw_series(s, X, Y, by, bh, x0, x1)
    out.append("</g>")
    out.append(
        f'<rect x="{bx:.1f}" y="{by:.1f}" width="{bw:.1f}" height="{bh:.1f}" '
        'fill="none" stroke="#444444" stroke-width="0.8"/>'
    )
    if p.note:
        out.append(
            f'<text x="{bx + bw / 2:.1f}" y="{by + bh / 2:.1f}" text-anchor="middle">'
            f"{e(p.note)}</text>"
        )
    if p.title:
        out.append(
            f'<text x="{bx + bw / 2:.1f}" y="{by - 5:.1f}" text-anchor="middle" '
            f'font-size="{FONT + (2 if len(p.title) < 40 else 0):g}">{e(p.title)}</text>'
        )
    if p.xlabel:
        out.append(
            f'<text x="{bx + bw / 2:.1f}" y="{by + bh + 30:.1f}" text-anchor="middle">'
            f"{e(p.xlabel)}</text>"
        )
    if p.ylabel:
        lines = p.ylabel.split("\n")
        cx, cy = bx - 40 - 14 * (len(lines) - 1), by + bh / 2
        spans = "".join(
            f'<tspan x="{cx:.1f}" dy="{0 if k == 0 else 14}">{e(line)}</tspan>'
            for k, line in enumerate(lines)
        )
        out.append(
            f'<text x="{cx:.1f}" y="{cy:.1f}" text-anchor="middle" '
            f'transform="rotate(-90 {cx:.1f} {cy:.1f})">{spans}</text>'
        )
    return out


def _draw_series(s: Series, X, Y, by: float, bh: float, x0: float, x1: float) -> list[str]:
    opacity = f' opacity="{s.alpha:g}"' if s.alpha < 1 else ""
    pts = [(x, y) for x, y in zip(s.x, s.y, strict=False) if math.isfinite(x) and math.isfinite(y)]
    if s.kind == "line":
        out = []
        if s.linestyle != "none" and len(pts) > 1:
            path = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in pts)
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{s.colour}" '
                f'stroke-width="{s.width:g}"{_dash(s.linestyle)}{opacity}/>'
            )
        if s.marker:
            out += [
                _marker(s.marker, X(x), Y(y), s.size, s.colour, s.hollow, s.alpha, s.face)
                for x, y in pts
            ]
        return out
    if s.kind == "errorbar":
        out = []
        for x, lo, hi in zip(s.x, s.low or [], s.high or [], strict=True):
            if not (math.isfinite(lo) and math.isfinite(hi)):
                continue
            px, top, bottom = X(x), Y(hi), Y(lo)
            out.append(
                f'<path d="M{px:.1f},{top:.1f}V{bottom:.1f}M{px - 3:.1f},{top:.1f}'
                f'H{px + 3:.1f}M{px - 3:.1f},{bottom:.1f}H{px + 3:.1f}" '
                f'stroke="{s.colour}" stroke-width="{s.width:g}"{opacity}/>'
            )
        return out
    if s.kind == "band":
        upper = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in zip(s.x, s.high or [], strict=True))
        lower = " ".join(
            f"{X(x):.1f},{Y(y):.1f}" for x, y in reversed(list(zip(s.x, s.low or [], strict=True)))
        )
        return [f'<polygon points="{upper} {lower}" fill="{s.colour}" stroke="none"{opacity}/>']
    if s.kind == "span":
        left, right = X(s.x[0]), X(s.x[1])
        return [
            f'<rect x="{left:.1f}" y="{by:.1f}" width="{max(right - left, 0):.1f}" '
            f'height="{bh:.1f}" fill="{s.colour}"{opacity}/>'
        ]
    if s.kind == "segment":
        a = s.x[0] if math.isfinite(s.x[0]) else x0
        b = s.x[1] if math.isfinite(s.x[1]) else x1
        return [
            f'<line x1="{X(a):.1f}" y1="{Y(s.y[0]):.1f}" x2="{X(b):.1f}" y2="{Y(s.y[1]):.1f}" '
            f'stroke="{s.colour}" stroke-width="{s.width:g}"{_dash(s.linestyle)}{opacity}/>'
        ]
    if s.kind == "bar":
        out = []
        for x, h, b in zip(s.x, s.y, s.low or [], strict=True):
            left, right = X(x - 0.4), X(x + 0.4)
            top, bottom = Y(b + h), Y(b)
            out.append(
                f'<rect x="{left:.1f}" y="{top:.1f}" width="{right - left:.1f}" '
                f'height="{max(bottom - top, 0):.1f}" fill="{s.colour}"{opacity}/>'
            )
        return out
    if s.kind == "text":
        return [
            f'<text x="{X(x) + 4:.1f}" y="{Y(y) - 4:.1f}" font-size="{FONT - 2:g}">'
            f"{html.escape(t)}</text>"
            for (x, y), t in zip(pts, s.texts or [], strict=False)
        ]
    raise ValueError(f"unknown series kind {s.kind!r}")


def _draw_legend(
    entries: list[LegendEntry], box: tuple[float, float, float, float], below: bool
) -> list[str]:
    lx, ly, lw, lh = box
    e = html.escape
    out = [
        f'<rect x="{lx:.1f}" y="{ly:.1f}" width="{lw:.1f}" height="{lh:.1f}" fill="white" '
        'stroke="#cccccc"/>'
    ]
    item_w = max(28 + text_width(en.label) for en in entries) + 12
    per_row = max(1, int(lw // item_w)) if below else 1
    for k, en in enumerate(entries):
        col, row = (k % per_row, k // per_row) if below else (0, k)
        x, y = lx + 8 + col * item_w, ly + 13 + 18 * row
        if en.patch:
            opacity = f' opacity="{en.alpha:g}"' if en.alpha < 1 else ""
            out.append(
                f'<rect x="{x + 4:.1f}" y="{y - 5:.1f}" width="12" height="10" '
                f'fill="{en.colour}"{opacity}/>'
            )
        else:
            if en.linestyle != "none":
                out.append(
                    f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x + 20:.1f}" y2="{y:.1f}" '
                    f'stroke="{en.colour}" stroke-width="1.5"{_dash(en.linestyle)}/>'
                )
            if en.marker:
                out.append(_marker(en.marker, x + 10, y, 6, en.colour, en.hollow, 1.0, en.face))
        out.append(f'<text x="{x + 26:.1f}" y="{y + 4:.1f}">{e(en.label)}</text>')
    return out
