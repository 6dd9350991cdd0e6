"""The hinge fit behind divergence onsets: exact against brute force, linear in memory."""

from __future__ import annotations

import numpy as np
import pytest

from runwatch.detectors.divergence import hinge_onset


def _brute_force(values: np.ndarray) -> int:
    ok = np.isfinite(values)
    y, t = values[ok], np.flatnonzero(ok).astype(np.float64)
    best, best_sse = None, np.inf
    for j, knot in enumerate(t[:-2]):
        h = np.maximum(t - knot, 0.0)
        hc, yc = h - h.mean(), y - y.mean()
        slope = (hc @ yc) / max(hc @ hc, 1e-300)
        sse = ((yc - slope * hc) ** 2).sum()
        if slope > 0 and sse < best_sse:
            best, best_sse = j, sse
    return 0 if best is None else int(t[best]) + 1


@pytest.mark.parametrize("seed", range(20))
def test_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    m, knee = int(rng.integers(4, 200)), int(rng.integers(0, 150))
    y = 1 + 0.02 * rng.standard_normal(m) + 0.05 * np.maximum(np.arange(m) - knee, 0)
    y[rng.integers(0, m, size=2)] = np.nan
    assert hinge_onset(y) == _brute_force(y)


def test_a_million_points_fit_in_linear_memory():
    rng = np.random.default_rng(1)
    n, knee = 1_000_000, 600_000
    y = 1 + 1e-5 * np.maximum(np.arange(n) - knee, 0) + 0.01 * rng.standard_normal(n)
    assert abs(hinge_onset(y) - knee) < 20_000  # a (knots x m) matrix here would need terabytes
