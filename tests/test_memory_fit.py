"""The leak regression is the standard library's least squares, degenerate inputs included."""

from __future__ import annotations

import pytest

from workloads.memory import _fit


def test_the_fit_recovers_a_known_line_and_its_r_squared() -> None:
    t = [float(i) for i in range(20)]
    y = [3.0 * a + 100.0 for a in t]
    slope, intercept, r2 = _fit(t, y)
    assert (slope, intercept, r2) == pytest.approx((3.0, 100.0, 1.0))
    noisy = [v + (5.0 if i % 2 else -5.0) for i, v in enumerate(y)]
    assert 0.9 < _fit(t, noisy)[2] < 1.0


@pytest.mark.parametrize(
    ("t", "y", "expected"),
    [
        ([], [], (0.0, 0.0, 0.0)),  # no samples: no line (was a ZeroDivisionError)
        ([1.0], [7.0], (0.0, 7.0, 0.0)),
        ([2.0, 2.0, 2.0], [1.0, 2.0, 3.0], (0.0, 2.0, 0.0)),  # one instant: no slope
        ([0.0, 1.0, 2.0], [5.0, 5.0, 5.0], (0.0, 5.0, 0.0)),  # flat: explains nothing
    ],
)
def test_degenerate_samples_give_no_slope_instead_of_an_error(
    t: list[float], y: list[float], expected: tuple[float, float, float]
) -> None:
    assert _fit(t, y) == pytest.approx(expected)
