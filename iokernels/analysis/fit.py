"""Log-log exponent fits: y ∝ x^a by least squares on (ln x, ln y), with a t-based 95% interval.

scipy is optional (``pip install 'iokernels[sweep]'``): :func:`require_scipy` says so in one line.
The model's own slopes (exact bytes, the Θ form's leading term, FLOPs) need only numpy, so they are
computed with the same estimator over the same points and can sit beside a measured fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

CONFIDENCE = 0.95


def require_scipy():
    """scipy.stats, or RuntimeError with the install command (the CLI prints it as one line)."""
    try:
        from scipy import stats
    except ImportError as exc:
        raise RuntimeError(
            "fitting exponents needs scipy, which is not installed: pip install 'iokernels[sweep]' "
            "(or pass --no-fit)"
        ) from exc
    return stats


@dataclass(frozen=True)
class Fit:
    """ln y = exponent · ln x + intercept over ``n`` points."""

    exponent: float
    intercept: float
    r2: float
    n: int
    stderr: float | None
    ci_low: float | None  # 95% confidence interval of the exponent (t-distribution, n - 2 dof); None if n < 3
    ci_high: float | None

    def as_dict(self) -> dict:
        return asdict(self)


def _log_points(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xa.shape != ya.shape:
        raise ValueError(f"x and y differ in length: {xa.size} and {ya.size}")
    if np.any(xa <= 0) or np.any(ya <= 0) or not (np.all(np.isfinite(xa)) and np.all(np.isfinite(ya))):
        raise ValueError("log-log fits need finite, positive x and y")
    if np.unique(xa).size < 2:
        raise ValueError("a log-log fit needs at least two distinct x values")
    return np.log(xa), np.log(ya)


def slope(x: Sequence[float], y: Sequence[float]) -> float:
    """The least-squares log-log slope (numpy only), for model curves beside a measured fit."""
    lx, ly = _log_points(x, y)
    return float(np.polyfit(lx, ly, 1)[0])


def loglog_fit(x: Sequence[float], y: Sequence[float]) -> Fit:
    """Fit y ∝ x^a (scipy.stats.linregress on logs); the interval is a ± t(0.975, n-2) · stderr."""
    stats = require_scipy()
    lx, ly = _log_points(x, y)
    n = lx.size
    res = stats.linregress(lx, ly)
    a = float(res.slope)
    r2 = float(res.rvalue) ** 2 if math.isfinite(res.rvalue) else 1.0
    if n < 3:
        return Fit(a, float(res.intercept), r2, n, None, None, None)
    stderr = float(res.stderr)
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 2)) * stderr
    return Fit(a, float(res.intercept), r2, n, stderr, a - half, a + half)
