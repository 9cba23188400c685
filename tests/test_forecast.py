"""The growth laws of ``orchestrator.results.forecast`` on points of known law: table-driven,
exact and noisy, the interval reproducible and honest about what it does not know."""

from __future__ import annotations

import math

import pytest

from orchestrator.results import forecast

SIZES = [1000.0, 2000.0, 3000.0, 4000.0, 6000.0, 8000.0]


@pytest.mark.parametrize(("law", "truth"), [
    ("linear", lambda n: 3.0 + 2e-3 * n),
    ("n log n", lambda n: 1.0 + 1e-4 * n * math.log(n)),
    ("n²", lambda n: 0.5 + 1e-6 * n * n),
    ("power", lambda n: 0.2 + 1e-5 * n ** 1.5),
    ("power", lambda n: 2.0 + 1e-9 * n ** 2.6),
])
def test_exact_points_of_a_law_choose_it_and_forecast_it(law: str, truth) -> None:
    result = forecast.forecast(SIZES, [truth(n) for n in SIZES], 80000)
    assert result.fit.model == law
    assert result.value == pytest.approx(truth(80000), rel=0.02)
    assert result.cross_validated and result.extrapolation == pytest.approx(10.0)
    assert not result.far


def test_two_sizes_fit_a_line_and_say_it_was_not_checked() -> None:
    result = forecast.forecast([100.0, 200.0], [1.0, 2.0], 400)
    assert result.fit.model == "linear" and not result.cross_validated
    assert result.value == pytest.approx(4.0)
    with pytest.raises(ValueError, match="at least two"):
        forecast.forecast([100.0], [1.0], 400)


def test_beyond_ten_times_the_largest_size_is_far() -> None:
    result = forecast.forecast(SIZES, [1 + n for n in SIZES], 10.5 * SIZES[-1])
    assert result.far and result.extrapolation == pytest.approx(10.5)


def test_the_interval_is_seeded_and_widens_with_the_noise() -> None:
    def noisy(scale: float) -> list[float]:
        wiggle = (0.03, -0.02, 0.025, -0.03, 0.02, -0.01)
        return [(0.5 + 1e-6 * n * n) * (1 + scale * w) for n, w in zip(SIZES, wiggle,
                                                                         strict=True)]

    quiet, loud = (forecast.forecast(SIZES, noisy(s), 80000) for s in (0.3, 3.0))
    again = forecast.forecast(SIZES, noisy(3.0), 80000)
    assert (loud.low, loud.high) == (again.low, again.high)  # seeded: the same twice
    assert loud.low < loud.value < loud.high
    assert loud.high - loud.low > 3 * (quiet.high - quiet.low)
    assert loud.low <= 0.5 + 1e-6 * 80000**2 <= loud.high
