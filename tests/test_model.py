"""The pure model core: spread, knee range, USL fit with intervals, on surfaces with known truth."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from orchestrator.analysis.model import (
    MIN_REPEATS_FOR_CI,
    SEED,
    compare_groups,
    fit_usl,
    fit_usl_with_intervals,
    knee_point,
    knee_range,
    peak_workers,
    spread,
    usl,
    within_noise,
)
from orchestrator.analysis.ranking import machine_confidence, rank

GRID = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128]


def surface(lam, sigma, kappa, noise=0.0, repeats=1, grid=GRID, seed=0):
    """Samples of a USL surface with multiplicative Gaussian noise (a fraction of the rate)."""
    rng = np.random.default_rng(seed)
    return {
        n: [float(usl(n, lam, sigma, kappa)) * (1 + rng.normal(0, noise)) for _ in range(repeats)]
        for n in grid
    }


@pytest.mark.parametrize(
    ("lam", "sigma", "kappa"),
    [
        (1000.0, 0.05, 0.0005),  # peak ≈ 44
        (12000.0, 0.02, 0.0001),  # peak ≈ 99
        (50.0, 0.30, 0.002),  # heavy contention, peak ≈ 19
        (800.0, 0.0, 0.0002),  # coherency only, peak ≈ 71
    ],
)
def test_the_fit_recovers_known_parameters_from_exact_points(lam, sigma, kappa):
    fit = fit_usl(surface(lam, sigma, kappa))
    assert fit is not None
    assert fit.lam == pytest.approx(lam, rel=1e-3)
    assert fit.sigma == pytest.approx(sigma, abs=1e-3)
    assert fit.kappa == pytest.approx(kappa, rel=1e-2)
    assert fit.n_star == pytest.approx(peak_workers(sigma, kappa), rel=1e-2)
    assert fit.x_star == pytest.approx(usl(fit.n_star, lam, sigma, kappa), rel=1e-3)
    assert fit.r2 > 0.999 and not fit.poor


def test_noisy_repeats_give_intervals_that_hold_the_truth_in_most_surfaces():
    # 95 % intervals from a small sample under-cover somewhat; a broken bootstrap
    # (or one resampling each count's 3 repeats, measured at ~72 %) falls below 75 %.
    truth = peak_workers(0.05, 0.0005)
    peak_hits = band_hits = 0
    surfaces = 20
    for seed in range(surfaces):
        model = fit_usl_with_intervals(
            surface(1000.0, 0.05, 0.0005, noise=0.03, repeats=3, seed=seed), n_boot=100
        )
        assert model is not None
        lo, hi = model.intervals["n_star"]
        assert lo <= model.fit.n_star <= hi and 0 < model.n_star_rel_halfwidth < 0.3
        for name in ("lam", "sigma", "kappa", "x_star"):
            a, b = model.intervals[name]
            assert a <= b, name
        peak_hits += lo < truth < hi
        (fitted, blo, bhi), = model.band([40])  # an untested count: a prediction
        assert blo <= fitted <= bhi
        band_hits += blo < usl(40, 1000.0, 0.05, 0.0005) < bhi
    assert peak_hits >= 0.75 * surfaces
    assert band_hits >= 0.75 * surfaces


def test_without_coherency_no_peak_is_predicted_and_the_verdict_says_so():
    fit = fit_usl(surface(500.0, 0.1, 0.0))
    assert fit is not None
    assert math.isinf(fit.n_star) and not fit.peak_tested
    assert fit.x_star == pytest.approx(500.0 / 0.1, rel=0.01)  # Amdahl's ceiling λ/σ
    assert "no peak predicted" in fit.verdict()


def test_a_peak_beyond_the_tested_counts_is_called_extrapolated():
    fit = fit_usl(surface(1000.0, 0.02, 0.0001, grid=[1, 2, 4, 8, 16]))
    assert fit is not None and fit.n_star > 16
    assert "extrapolated" in fit.verdict()


def test_points_the_law_cannot_describe_are_called_a_poor_fit():
    # Throughput that collapses and recovers (e.g. two NUMA nodes): no USL curve passes near it.
    samples = {1: [100.0], 2: [200.0], 4: [400.0], 8: [90.0], 16: [800.0], 32: [60.0]}
    fit = fit_usl(samples)
    assert fit is not None and fit.poor
    assert fit.verdict().startswith("poor fit")


def test_fewer_than_three_worker_counts_cannot_be_fitted():
    assert fit_usl({1: [10.0, 11.0], 4: [30.0]}) is None
    assert fit_usl_with_intervals({2: [10.0], 4: [20.0], 8: [math.nan]}) is None


def test_the_fit_serialises_to_strict_json_with_predictions():
    model = fit_usl_with_intervals(surface(500.0, 0.1, 0.0, noise=0.02, seed=1), n_boot=50)
    assert model is not None
    data = json.loads(json.dumps(model.to_dict(predict_at=[3, 200]), allow_nan=False))
    assert data["model"] == "usl" and data["n_star"] is None  # κ = 0: no finite peak
    assert [p["workers"] for p in data["predictions"]] == [3, 200]
    assert set(data["ci95"]) == {"lam", "sigma", "kappa", "n_star", "x_star"}


@pytest.mark.parametrize(
    ("values", "median", "has_ci"),
    [
        ([10.0, 12.0, 11.0], 11.0, False),
        ([9030.0, 13659.0, 11000.0, 12000.0, 10000.0], 11000.0, True),
        ([5.0, math.nan, 7.0, 6.0], 6.0, False),
    ],
)
def test_spread_gives_the_median_iqr_and_a_ci_once_repeats_allow(values, median, has_ci):
    s = spread(values)
    assert s is not None and s.median == median
    assert s.q1 <= s.median <= s.q3
    assert (s.ci is not None) == has_ci == (s.n >= MIN_REPEATS_FOR_CI)
    assert s.low <= s.median <= s.high
    assert s.method == ("95% CI" if has_ci else "IQR")


def test_spread_of_nothing_is_none():
    assert spread([]) is None and spread([math.nan]) is None


def test_groups_far_apart_differ_clearly_and_overlapping_ones_do_not():
    far = compare_groups([100.0, 101.0, 99.0, 100.5], [150.0, 149.0, 151.0, 150.5])
    assert far is not None and far.clear and far.low > 1.4
    assert "higher" in far.describe()
    near = compare_groups([9030.0, 13659.0, 11000.0], [11500.0, 10200.0, 12900.0])
    assert near is not None and not near.clear
    assert "no clear difference" in near.describe()
    assert within_noise([9030.0, 13659.0, 11000.0], [11500.0, 10200.0, 12900.0])
    assert not within_noise([100.0, 101.0, 99.0], [150.0, 149.0, 151.0])


def test_a_single_repeat_is_never_a_clear_win():
    assert within_noise([100.0], [200.0])


@pytest.mark.parametrize(
    ("workers", "rates", "knee"),
    [
        ([1, 2, 4, 8], [1.0, 2.0, 3.9, 4.0], 4),
        ([1, 2, 4, 8], [1.0, 2.0, 4.0, 8.0], None),  # still scaling
        ([1, 2, 4, 8], [1.0, 1.05, 1.5, 1.6], 4),  # a later jump is not hidden by a flat step
        ([1, 2, 4], [5.0, math.nan, 5.2], 1),
        ([4], [3.0], None),
    ],
)
def test_knee_point_is_the_smallest_count_no_larger_count_beats(workers, rates, knee):
    assert knee_point(workers, rates) == knee


def test_a_knee_robust_to_noise_has_one_point_range():
    samples = {1: [100, 101, 99], 2: [200, 199, 201], 4: [390, 392, 391], 8: [400, 401, 399]}
    k = knee_range(samples)
    assert k.workers == 4 and (k.low, k.high) == (4, 4) and k.stable


def test_a_knee_one_repeat_can_move_shows_its_range():
    # 8 workers' repeats straddle the 10 % line above 4 workers: the knee is 4 or 8.
    samples = {1: [100, 101, 99], 2: [200, 199, 201], 4: [390, 392, 391], 8: [380, 470, 420]}
    k = knee_range(samples)
    assert not k.stable
    assert k.low == 4 and k.high in (8, None)
    assert sum(k.share.values()) == pytest.approx(1.0)
    assert json.dumps(k.to_dict())


def test_the_headline_says_when_the_runner_up_is_within_noise():
    noisy = rank({("a", 8): [9030.0, 13659.0, 11000.0], ("b", 16): [11500.0, 10200.0, 12900.0]})
    assert noisy is not None and noisy.best == ("b", 16) and noisy.within_noise
    assert "within noise" in noisy.describe()
    clear = rank({"a": [100.0, 101.0, 99.0], "b": [150.0, 149.0, 151.0]})
    assert clear is not None and clear.best == "b" and not clear.within_noise
    assert "clearly ahead" in clear.describe()
    cheapest = rank({"a": [1.0, 1.1, 0.9], "b": [2.0, 2.1, 1.9]}, higher_is_better=False)
    assert cheapest is not None and cheapest.best == "a"
    assert rank({}) is None


def test_a_machines_confidence_block_is_strict_json_and_says_why_there_is_no_curve():
    block = machine_confidence(surface(1000.0, 0.05, 0.0005, noise=0.03, repeats=4, seed=2),
                               predict_at=[40], n_boot=50)
    data = json.loads(json.dumps(block, allow_nan=False))
    assert data["usl"]["n_star"] > 0 and data["usl_reason"] is None
    assert data["spread"]["8"]["ci95"] is not None  # 4 repeats: a bootstrap interval
    assert data["knee"]["workers"] in GRID
    short = machine_confidence({1: [10.0], 2: [19.0]})
    assert short["usl"] is None and "at least 3" in short["usl_reason"]


@pytest.mark.parametrize(
    ("sigma", "kappa", "n_star"),
    [(0.0, 0.01, 10.0), (0.5, 0.005, 10.0), (1.0, 0.01, 1.0), (0.99, 0.5, 1.0),
     (0.2, 0.0, math.inf)],
)
def test_the_predicted_peak_is_never_below_one_worker(sigma, kappa, n_star):
    assert peak_workers(sigma, kappa) == pytest.approx(n_star)


def test_the_knee_ranges_median_is_numpys_to_the_last_bit():
    from orchestrator.analysis.model import _median_of_finite

    rng = np.random.default_rng(3)
    for size in range(1, 9):
        for _ in range(200):
            values = list(rng.lognormal(5, 1, size=size))
            assert _median_of_finite(values) == float(np.median(values))


def _knee_range_one_resample_at_a_time(samples, gain=0.10, n_boot=1000, seed=SEED):
    """The bootstrap as a plain loop (how knee_range drew it before numpy did): for each
    resample, each worker count's finite repeats drawn with replacement by its own
    ``rng.integers`` call, the knee found on the medians; then the share and the 2.5/97.5 %
    ranks. ``knee_range`` must return exactly this."""
    from orchestrator.analysis.model import KneeRange

    data = {}
    for n, values in sorted((int(n), v) for n, v in samples.items()):
        finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
        if finite:
            data[n] = finite
    ns = list(data)
    point = knee_point(ns, [float(np.median(data[n])) for n in ns], gain)
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(n_boot):
        medians = []
        for n in ns:
            idx = rng.integers(0, len(data[n]), size=len(data[n]))
            medians.append(float(np.median([data[n][i] for i in idx])))
        found.append(knee_point(ns, medians, gain))
    if not found:
        return KneeRange(point, None, None, {})
    share = {}
    for k in found:
        share[k] = share.get(k, 0.0) + 1.0 / len(found)
    big = (max(ns) + 1) if ns else 1
    ranked = sorted(big if k is None else k for k in found)
    lo = ranked[int(0.025 * (len(ranked) - 1))]
    hi = ranked[math.ceil(0.975 * (len(ranked) - 1))]
    return KneeRange(point, None if lo == big else lo, None if hi == big else hi,
                     {k: round(v, 4) for k, v in sorted(share.items(), key=lambda kv: -kv[1])})


@pytest.mark.parametrize(
    "samples",
    [
        {1: [100, 101, 99], 2: [200, 199, 201], 4: [390, 392, 391], 8: [380, 470, 420]},
        # uneven repeats, NaN, None and inf dropped, a count with one repeat, one with none left
        {1: [100.0, math.nan, 98.0, 103.0], 2: [190.0, 230.0],
         4: [None, 400.0, 310.0, 455.0, 390.0], 8: [420.0], 16: [math.nan, None],
         32: [math.inf, 380.0, 470.0, 440.0, 300.0, 500.0]},
        # still scaling at the largest count: the knee is mostly "not reached" (None)
        {1: [10.0, 11.0, 9.5], 2: [20.0, 19.0, 23.0], 4: [41.0, 35.0, 44.0]},
        {4: [5.0, 6.0]},  # one count: no knee can be found
        {},
        surface(1000.0, 0.05, 0.0005, noise=0.08, repeats=3, seed=5),
    ],
)
@pytest.mark.parametrize("seed", [SEED, 7])
def test_the_knee_range_is_what_one_resample_at_a_time_finds_to_the_last_bit(samples, seed):
    for n_boot in (1000, 17, 1, 0):
        got = knee_range(samples, n_boot=n_boot, seed=seed)
        want = _knee_range_one_resample_at_a_time(samples, n_boot=n_boot, seed=seed)
        assert got == want
        assert list(got.share.items()) == list(want.share.items())  # the order shown, too


@pytest.mark.parametrize(("lam", "sigma", "kappa", "noise"), [
    (300.0, 0.05, 1e-3, 0.05), (120.0, 0.0, 0.0, 0.02), (80.0, 0.2, 1e-4, 0.15),
    (500.0, 0.01, 5e-3, 0.01),
])
def test_the_batched_bootstrap_refits_what_scipy_refits_one_at_a_time(lam, sigma, kappa, noise):
    """The 200 refits run as one numpy batch; each must land where scipy's least_squares
    lands from the same start (the fit the bootstrap made before), within its tolerances."""
    from orchestrator.analysis import model
    from orchestrator.analysis.usl_batch import least_squares_batch

    samples = surface(lam, sigma, kappa, noise=noise, repeats=3, grid=GRID[:7], seed=3)
    fit = fit_usl(samples)
    n, x = model._flatten(samples)
    rng = np.random.default_rng(SEED)
    fitted = fit.predict(n)
    rel = (x / fitted - 1.0) * math.sqrt(n.size / (n.size - 3))
    bxs = np.maximum(fitted * (1.0 + rel[rng.integers(0, n.size, size=(40, n.size))]), 1e-12)
    p0 = (fit.lam, min(fit.sigma, 0.99), max(fit.kappa, 1e-9))
    batch, ok = least_squares_batch(n, bxs, p0)
    assert ok.all()
    for got, bx in zip(batch, bxs, strict=True):
        want = model._least_squares(n, bx, p0)
        assert got[0] == pytest.approx(want[0], rel=1e-4)
        assert got[1] == pytest.approx(want[1], rel=1e-3, abs=1e-5)
        assert got[2] == pytest.approx(want[2], rel=1e-3, abs=1e-7)
        sse = [float(np.sum((usl(n, *p) / bx - 1.0) ** 2)) for p in (got, want)]
        assert sse[0] <= sse[1] * (1 + 1e-6)  # never a worse fit than scipy's


def test_a_fit_is_made_once_per_data_set_and_a_stored_one_is_read_back(tmp_path):
    from orchestrator.analysis import model
    from orchestrator.results.fits import FITS_FILE, stored_fits

    samples = surface(200.0, 0.05, 1e-3, noise=0.05, repeats=3, grid=GRID[:6], seed=4)
    with stored_fits(tmp_path):
        first = fit_usl_with_intervals(samples)
        assert fit_usl_with_intervals(dict(reversed(samples.items()))) is first  # same data
    kept = json.loads((tmp_path / FITS_FILE).read_text())["fits"]
    assert list(kept) == [model.fit_key(samples)]
    model._FITS.clear()  # a new process
    with stored_fits(tmp_path):
        again = fit_usl_with_intervals(samples)
    assert again == first and again is not first
    moved = {w: [v * 1.01 for v in vals] for w, vals in samples.items()}
    assert model.fit_key(moved) != model.fit_key(samples)  # another trial: another fit


def _spread_one_group_at_a_time(values, seed=SEED):
    """``spread`` as it was, one group per call: what ``spreads`` must give to the last bit."""
    x = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not x:
        return None
    q1, med, q3 = (float(v) for v in np.quantile(np.asarray(x), [0.25, 0.5, 0.75]))
    ci = None
    if len(x) >= MIN_REPEATS_FOR_CI:
        draws = np.asarray(x)[np.random.default_rng(seed).integers(0, len(x), size=(2000, len(x)))]
        medians = np.median(draws, axis=1)
        low, high = np.quantile(medians, [0.025, 0.975])
        ci = (float(low), float(high))
    return (med, len(x), q1, q3, ci)


def test_the_spreads_of_many_groups_are_each_groups_own_to_the_last_bit():
    from orchestrator.analysis.model import spreads

    rng = np.random.default_rng(7)
    groups = [list(rng.normal(100, 15, size=n)) for n in (1, 2, 3, 4, 5, 6, 7, 8, 4, 5, 9)]
    groups += [[], [math.nan, 3.0, math.inf, 4.0, 5.0, 6.0], [1.0, 1.0, 1.0, 1.0]]
    groups += [list(rng.lognormal(5, 1, size=4)) for _ in range(70)]  # more than one chunk
    got = spreads(groups)
    assert len(got) == len(groups)
    for sp, values in zip(got, groups, strict=True):
        want = _spread_one_group_at_a_time(values)
        assert (None if sp is None else (sp.median, sp.n, sp.q1, sp.q3, sp.ci)) == want
        assert sp == spread(values)


def test_many_machines_fitted_at_once_get_the_models_each_gets_alone():
    """A report fits every machine's bootstrap in one padded batch; each machine's model
    must be the one its own fit makes (the same steps; sums over padding may round apart)."""
    from orchestrator.analysis import model

    many = [surface(300.0, 0.05, 1e-3, noise=0.05, repeats=3, grid=GRID[:7], seed=1),
            surface(120.0, 0.0, 0.0, noise=0.02, repeats=2, grid=GRID[:5], seed=2),
            surface(80.0, 0.2, 1e-4, noise=0.15, repeats=5, grid=GRID[:8], seed=3),
            {1: [10.0, 11.0], 4: [30.0]},  # two counts: no fit
            surface(500.0, 0.01, 5e-3, noise=0.01, repeats=4, grid=GRID[:6], seed=4)]
    model._FITS.clear()
    together = model.fit_usl_many(many)
    model._FITS.clear()
    alone = [fit_usl_with_intervals(s) for s in many]
    model._FITS.clear()
    assert together[3] is None and alone[3] is None
    for a, b in zip(together, alone, strict=True):
        if a is None:
            continue
        assert a.fit == b.fit and len(a.boot) == len(b.boot) == model.N_BOOT
        np.testing.assert_allclose(np.array(a.boot), np.array(b.boot), rtol=1e-8, atol=1e-12)
        for key, (lo, hi) in a.intervals.items():
            assert lo == pytest.approx(b.intervals[key][0], rel=1e-8)
            assert hi == pytest.approx(b.intervals[key][1], rel=1e-8)
