"""bench/calibrate.py's pooled budget: the bound it prints and the alarms it lists per draw."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from calibrate import SWEEPS, budget, main, poisson_upper, with_value  # noqa: E402

from runwatch.detectors.config import DEFAULT  # noqa: E402


def test_the_bound_is_garwoods_exact_poisson_bound() -> None:
    """The one-sided 95% upper bound of a Poisson mean after k events is chi-square(0.95, 2k + 2) / 2: 2.996
    after none (the rule of three), 4.744 after one, 10.513 after five, 33.75 after 24."""
    assert [round(poisson_upper(k), 3) for k in (0, 1, 5, 24)] == [2.996, 4.744, 10.513, 33.752]


def _timed_run(pause_at: int | None) -> pa.Table:
    n = 3000
    steps = np.arange(n, dtype=np.int64)
    dt = 1.0 + 0.02 * np.random.default_rng(0).standard_normal(n)
    if pause_at is not None:
        dt[pause_at] += 600.0  # ten minutes between two rows of one-second steps
    return pa.table({"step": steps, "loss": 2.0 + 0.01 * np.random.default_rng(1).standard_normal(n),
                     "time": 1.7e9 + np.cumsum(dt), "segment": pa.array(np.zeros(n, np.int32)),
                     "main": pa.array(np.ones(n, bool))})


def test_the_budget_names_each_alarm_by_its_draw_and_counts_every_step() -> None:
    sims = [("d0/sim-000", _timed_run(None), {}), ("d1/sim-000", _timed_run(2000), {"noisy_host": False})]
    b = budget({"real-log": _timed_run(None)}, sims, DEFAULT)
    assert b["steps"] == 9000 and b["alarms"] == 1 and b["by_kind"] == {"sim stall": 1}
    assert b["list"][0].startswith("d1/sim-000: stall at 1999 (warning"), b["list"]


@pytest.mark.parametrize("argv,says", [
    (["--sweep", "--fields", "spike.cusum_h,spike.cusm_h"], "unknown threshold spike.cusm_h"),
    (["--fields", "spike.cusum_h"], "--fields needs --sweep"),
])
def test_a_sweep_of_a_misspelt_or_idle_threshold_is_refused_before_any_work(argv, says, capsys) -> None:
    """``--fields spike.cusm_h`` swept nothing after the minutes of simulating the healthy runs, and printed a
    curve without that row; without ``--sweep`` the names were ignored. Both are a usage error (exit 2, one line
    naming what is wrong) before anything is simulated."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and says in capsys.readouterr().err


def test_every_point_of_the_sweep_is_a_valid_config() -> None:
    """Each swept value builds a config its checks accept (a review found ``burst_h`` 10-20 refused once
    ``burst_lasted_h`` had to be at least it: the sweep crashed), and moves the threshold it names."""
    for (component, field), values in SWEEPS.items():
        for value in values:
            cfg = with_value(DEFAULT, component, field, value)
            assert getattr(getattr(cfg, component), field) == value, (component, field, value)
