"""Young's and Daly's intervals and the expected-waste model they optimise."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwatch.economics.cadence import daly_interval, interval_grid, lost_hours_per_day, lost_share, young_interval

MIN, HOUR = 60.0, 3600.0


def test_dalys_own_example() -> None:
    """Daly (2006): M = 24 h and delta = 5 min give about 117 min; Young gives 120."""
    assert young_interval(5 * MIN, 24 * HOUR) / MIN == pytest.approx(120.0)
    assert daly_interval(5 * MIN, 24 * HOUR) / MIN == pytest.approx(116.69, abs=0.01)


@pytest.mark.parametrize(("delta", "mtbf", "expected"), [
    (300.0, 600.0, math.sqrt(2 * 300 * 600) * (1 + math.sqrt(0.25) / 3 + 0.25 / 9) - 300.0),  # 416.7 s
    (1199.0, 600.0, math.sqrt(2 * 1199 * 600) * (1 + math.sqrt(1199 / 1200) / 3 + 1199 / 1200 / 9) - 1199.0),
    (1200.0, 600.0, 600.0),   # delta >= 2M: once per MTBF
    (5000.0, 600.0, 600.0),
])
def test_daly_near_and_past_its_range(delta: float, mtbf: float, expected: float) -> None:
    assert daly_interval(delta, mtbf) == pytest.approx(expected)


@settings(max_examples=60, deadline=None)
@given(mtbf=st.floats(600.0, 30 * 86400.0), share=st.floats(1e-5, 0.05))
def test_the_models_minimum_is_dalys_interval(mtbf: float, share: float) -> None:
    """Daly's estimate is the optimum of the model the what-if plots (within 1% while delta << M)."""
    delta = share * mtbf
    daly = daly_interval(delta, mtbf)
    grid = np.geomspace(daly / 3, daly * 3, 20001)
    best = grid[np.argmin(lost_share(grid, delta, mtbf))]
    assert best == pytest.approx(daly, rel=0.01)
    assert abs(best - daly) <= abs(best - young_interval(delta, mtbf)) + 1e-9 * daly  # Daly is the closer one


def test_lost_share_parts() -> None:
    delta, mtbf = 60.0, 24 * HOUR
    # Checkpointing constantly (tiny interval) loses almost everything to writes; never, everything to failures.
    assert lost_share(1e-3, delta, mtbf) > 0.99 and lost_share(1e9, delta, mtbf) == 1.0
    assert 0 < lost_share(young_interval(delta, mtbf), delta, mtbf) < 0.05  # 2 sqrt(delta / 2M) = 3.7%
    # First order: delta/tau of writes plus tau/(2M) of redone work.
    tau = young_interval(delta, mtbf)
    assert lost_share(tau, delta, mtbf) == pytest.approx(delta / tau + tau / (2 * mtbf), rel=0.02)
    # A restart costs R/M on top, whatever the interval.
    more = lost_share(tau, delta, mtbf, restart=600.0) - lost_share(tau, delta, mtbf)
    assert more == pytest.approx(600.0 / mtbf, rel=0.05)
    assert lost_hours_per_day(tau, delta, mtbf) == pytest.approx(24 * lost_share(tau, delta, mtbf))


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_bad_inputs_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="checkpoint cost"):
        young_interval(bad, HOUR)
    with pytest.raises(ValueError, match="MTBF"):
        daly_interval(60.0, bad)
    with pytest.raises(ValueError):
        lost_share(np.array([bad]), 60.0, HOUR) if bad <= 0 else lost_share(60.0, 60.0, HOUR, restart=bad)


def test_interval_grid_brackets_every_anchor() -> None:
    grid = interval_grid([120.0, None, 7200.0])
    assert grid[0] == pytest.approx(15.0) and grid[-1] == pytest.approx(57600.0)
    assert np.all(np.diff(grid) > 0)
    with pytest.raises(ValueError):
        interval_grid([None, 0.0])
