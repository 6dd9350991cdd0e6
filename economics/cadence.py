"""How often to checkpoint: Young's and Daly's optimum intervals and the expected waste at any interval.

Pure arithmetic in seconds. ``delta`` is the blocking cost of one checkpoint,
``mtbf`` the mean time between interruptions, ``restart`` the time from an
interruption to training again (all measured from the run's record, or given).

- Young (1974): tau = sqrt(2 delta M), the first-order optimum.
- Daly (2006), the higher-order estimate: for delta < 2M,
  tau = sqrt(2 delta M) [1 + (1/3) sqrt(delta / 2M) + (1/9) (delta / 2M)] - delta; else tau = M.
- The what-if uses the model Daly's estimate optimises (exponential failures,
  which may also strike during a checkpoint or a restart): the wall time per
  unit of kept work is M e^(R/M) (e^((tau + delta)/M) - 1) / tau, so the share of
  wall time lost (redone work, restarts, checkpoint writes) is one minus its
  inverse. Its minimum lies at Daly's interval (tested), and near it at Young's.
"""

from __future__ import annotations

import math

import numpy as np

HOURS_PER_DAY = 24.0


def _check(delta: float, mtbf: float) -> None:
    if not (math.isfinite(delta) and delta > 0):
        raise ValueError(f"checkpoint cost must be a positive number of seconds, got {delta!r}")
    if not (math.isfinite(mtbf) and mtbf > 0):
        raise ValueError(f"MTBF must be a positive number of seconds, got {mtbf!r}")


def young_interval(delta: float, mtbf: float) -> float:
    """Young's optimum compute time between checkpoints: sqrt(2 delta M)."""
    _check(delta, mtbf)
    return math.sqrt(2.0 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly's higher-order optimum; M itself once a checkpoint costs 2M or more."""
    _check(delta, mtbf)
    if delta >= 2.0 * mtbf:
        return mtbf
    ratio = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - delta


def lost_share(interval: np.ndarray | float, delta: float, mtbf: float,
               restart: float = 0.0) -> np.ndarray | float:
    """Expected share of wall time that keeps no progress when checkpointing every ``interval`` seconds of work.

    1 - tau / (M e^(R/M) (e^((tau + delta)/M) - 1)): redone work, restarts and
    checkpoint writes together (Daly's model of exponential interruptions).
    """
    _check(delta, mtbf)
    if not (math.isfinite(restart) and restart >= 0):
        raise ValueError(f"restart time must be >= 0 seconds, got {restart!r}")
    tau = np.asarray(interval, dtype=np.float64)
    if (tau <= 0).any():
        raise ValueError("checkpoint intervals must be positive")
    with np.errstate(over="ignore"):  # an interval many MTBFs long never finishes: all of the time is lost
        wall_per_work = mtbf * np.exp(restart / mtbf) * np.expm1((tau + delta) / mtbf) / tau
    share = 1.0 - 1.0 / wall_per_work
    return float(share) if np.ndim(share) == 0 else share


def lost_hours_per_day(interval: np.ndarray | float, delta: float, mtbf: float,
                       restart: float = 0.0) -> np.ndarray | float:
    """Expected wall hours per day of running that keep no progress (see ``lost_share``)."""
    return HOURS_PER_DAY * lost_share(interval, delta, mtbf, restart)


def interval_grid(anchors: list[float], num: int = 200, span: float = 8.0) -> np.ndarray:
    """Log-spaced intervals (seconds) from ``span`` times below the smallest anchor to ``span`` times above the largest."""
    positive = [a for a in anchors if a is not None and math.isfinite(a) and a > 0]
    if not positive:
        raise ValueError("no positive interval to centre the grid on")
    return np.geomspace(min(positive) / span, max(positive) * span, num)
