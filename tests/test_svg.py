"""The report's SVG chart writer: well-formed files, legends that fit, round ticks, escaped text."""

from __future__ import annotations

from xml.etree import ElementTree

import pytest

from orchestrator.results import svg

SVG = "{http://www.w3.org/2000/svg}"


def test_a_long_legend_makes_the_figure_taller_rather_than_cutting_entries_off() -> None:
    fig = svg.Figure(width=720, height=405)
    for i in range(40):
        fig.panel().line([1, 2, 4], [i, i + 1, i + 2], "#1f77b4", label=f"machine-{i:02d}")
    layout = fig.layout()
    _, y, _, h = layout["legend"]
    assert layout["height"] > 405 and y + h <= layout["height"]
    root = ElementTree.fromstring(fig.to_svg())
    assert float(root.get("height")) == layout["height"]
    labels = [t.text for t in root.iter(f"{SVG}text") if (t.text or "").startswith("machine-")]
    assert labels == [f"machine-{i:02d}" for i in range(40)]  # every entry, in order


def test_text_is_escaped_and_the_file_stays_well_formed(tmp_path) -> None:
    fig = svg.Figure(title="<script>alert(1)</script> & co")
    ax = fig.panel()
    ax.line([0, 1], [0, 1], "#000000", label="a < b & c")
    ax.labels([0.5], [0.5], ['"quoted" <tag>'])
    fig.savefig(tmp_path / "f.svg")
    root = ElementTree.parse(tmp_path / "f.svg").getroot()
    texts = {t.text for t in root.iter(f"{SVG}text")}
    assert {"<script>alert(1)</script> & co", "a < b & c", '"quoted" <tag>'} <= texts
    assert root.find(f"{SVG}script") is None


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [(0, 1, [0, 0.2, 0.4, 0.6, 0.8, 1.0]), (0, 6400, [0, 2000, 4000, 6000]),
     (-0.9, 2.1, [0, 1, 2]), (3, 3.2, [3.0, 3.05, 3.1, 3.15, 3.2])],
)  # fmt: skip
def test_ticks_are_round_numbers_inside_the_range(lo, hi, expected) -> None:
    assert svg.nice_ticks(lo, hi) == pytest.approx(expected)


def test_limits_keep_a_set_bound_and_pad_only_the_free_one() -> None:
    ax = svg.Panel(ylim=(0, None))
    ax.line([1, 2], [6300, 6400], "#000000")
    _, _, y0, y1 = ax.limits()
    assert y0 == 0 and 6400 < y1 < 6400 * 1.1  # the margin comes from 0..6400, not 6300..6400
    ax.yscale = "log"
    _, _, y0, y1 = ax.limits()
    assert 0 < y0 < 6300 and y1 > 6400  # a log axis cannot start at 0: it pads instead
