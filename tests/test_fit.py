"""The α–β fit against data generated from a known model."""

import random

import pytest

from distval.comm.fit import fit_alpha_beta


def test_recovers_known_alpha_and_beta_with_noise():
    alpha, beta = 50e-6, 2e9  # 50 µs, 2 GB/s
    rng = random.Random(0)
    sizes = [2**k for k in range(10, 28)]
    times = [(alpha + s / beta) * (1 + rng.uniform(-0.03, 0.03)) for s in sizes]
    fit = fit_alpha_beta(sizes, times)
    assert fit.alpha_us == pytest.approx(50, rel=0.1)
    assert fit.beta_gbps == pytest.approx(2.0, rel=0.05)
    assert fit.n_half_bytes == pytest.approx(alpha * beta, rel=0.15)
    assert fit.r2 > 0.99 and fit.num_points == len(sizes)
    assert fit.time_s(1e6) == pytest.approx(fit.alpha_s + 1e6 / fit.beta_bytes_per_s)


def test_exact_data_gives_exact_fit():
    sizes = [1e3, 1e5, 1e7]
    fit = fit_alpha_beta(sizes, [10e-6 + s / 5e9 for s in sizes])
    assert fit.alpha_us == pytest.approx(10, rel=1e-9) and fit.beta_gbps == pytest.approx(5, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0)


def test_negative_latency_is_clamped_to_zero():
    sizes = [1e6, 2e6, 4e6]
    fit = fit_alpha_beta(sizes, [s / 1e9 - 50e-6 for s in sizes])  # a free fit would give α < 0
    assert fit.alpha_s == 0.0 and fit.beta_gbps > 0


def test_a_stray_point_that_leaves_least_squares_no_slope_falls_back_to_theil_sen():
    """One size timed 50x too fast (weights 1/t² let it decide) gives least squares a negative slope;
    the median of the pairwise slopes still finds the link, and the low R² tells of the noise."""
    sizes = [1024 * 8**k for k in range(5)]
    times = [50e-6 + s / 1e9 for s in sizes]
    times[3] /= 50
    fit = fit_alpha_beta(sizes, times)
    assert fit is not None and 0.5 < fit.beta_gbps < 2 and fit.alpha_s >= 0 and fit.r2 < 0.9
    clean = fit_alpha_beta(sizes, [50e-6 + s / 1e9 for s in sizes])  # a clean sweep never takes that path
    assert clean.beta_gbps == pytest.approx(1.0, rel=1e-9) and clean.r2 == pytest.approx(1.0)


def test_a_sweep_that_shows_no_bandwidth_has_no_fit():
    sizes = [1024 * 8**k for k in range(5)]
    assert fit_alpha_beta(sizes, [1e-3 - k * 1e-4 for k in range(5)]) is None  # larger sizes ran faster


def test_too_few_points():
    assert fit_alpha_beta([1024], [1e-4]) is None
    assert fit_alpha_beta([0, 0], [1e-4, 2e-4]) is None
