import numpy as np
import pytest

from iokernels.analysis import fit

pytest.importorskip("scipy")


def test_exact_power_law():
    f = fit.loglog_fit([1, 2, 4, 8, 16], [3 * x**-1.5 for x in (1, 2, 4, 8, 16)])
    assert f.exponent == pytest.approx(-1.5) and f.intercept == pytest.approx(np.log(3))
    assert f.r2 == pytest.approx(1.0) and f.n == 5
    assert f.ci_low == pytest.approx(-1.5) and f.ci_high == pytest.approx(-1.5)


def test_interval_is_t_based_and_covers_the_truth_95_percent_of_the_time():
    rng = np.random.default_rng(7)
    x = np.array([1, 2, 4, 8, 16, 32.0])
    trials, covered = 2000, 0
    for _ in range(trials):
        f = fit.loglog_fit(x, 5 * x**2 * np.exp(rng.normal(0, 0.05, x.size)))
        covered += f.ci_low < 2 < f.ci_high
    # t with 4 dof: 95%; a normal-based interval (1.96 stderr) would cover only ~88%
    assert 0.93 < covered / trials < 0.97
    from scipy import stats

    assert (f.ci_high - f.ci_low) / 2 == pytest.approx(stats.t.ppf(0.975, x.size - 2) * f.stderr)


def test_two_points_give_no_interval():
    f = fit.loglog_fit([10, 20], [1, 4])
    assert f.exponent == pytest.approx(2) and f.ci_low is None and f.ci_high is None and f.stderr is None


@pytest.mark.parametrize("x, y, message", [
    ([1, 2], [1, 0], "positive"),
    ([1, -2], [1, 2], "positive"),
    ([3, 3, 3], [1, 2, 3], "two distinct x"),
    ([1, 2, 3], [1, 2], "differ in length"),
])
def test_bad_points(x, y, message):
    with pytest.raises(ValueError, match=message):
        fit.loglog_fit(x, y)


def test_slope_needs_no_scipy_and_agrees():
    x, y = [16, 32, 64, 128], [x**1.7 + 5 * x for x in (16, 32, 64, 128)]
    assert fit.slope(x, y) == pytest.approx(fit.loglog_fit(x, y).exponent)
