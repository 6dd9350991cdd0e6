"""The known-change-point test's risk on clean training: how often it passes its bar where nothing happened.

    .venv/bin/python bench/change_point_null.py --seeds 172015 392002      # seeds whose training is cached

The lift test after an LR burst (``divergence.lr_burst_shifts``: the loss level over 8, 16 or 32 rows against
the level before, in standard errors of the two medians' difference, the best of the three windows) runs only
where the LR rose, so its false alarms are its risk per look times the harmless raises. This measures that risk:
a look at every 40th row after the warm-up of each clean twin of the fresh seeds' runs (segment 0), counting
the looks past 4, 5, 6 and 8 standard errors (``DivergenceConfig.lr_shift_z`` is 4). It reads the training
cache only (``eval_detectors.py --set fresh --seed N`` fills it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from evalruns import fresh  # noqa: E402
from twin_alarms import cached_twin  # noqa: E402

from runwatch.detectors.config import DEFAULT  # noqa: E402
from runwatch.detectors.divergence import _known_change_point  # noqa: E402

EVERY = 40
"""Rows between looks: past the longest window (32 rows), so looks do not share their rows after."""


def looks(seed: int) -> list[float]:
    """The best-of-windows z at every ``EVERY``-th row after the warm-up of each clean twin of ``seed``."""
    cfg, out = DEFAULT.divergence, []
    for run in fresh.fresh_runs(seed):
        rows, _ = cached_twin(run, seed)
        steps = np.array([r["step"] for r in rows])
        back = np.flatnonzero(np.diff(steps) <= 0)  # a resume: segment 0 ends there
        n = int(back[0]) + 1 if len(back) else len(steps)
        loss, steps = np.array([r["loss"] for r in rows[:n]], float), steps[:n]
        warmup = fresh.draws.knobs(run.spec).get("warmup", 0)
        for a in range(2 * EVERY, n - cfg.lr_shift_obs, EVERY):
            lift = _known_change_point(loss, a, 0, cfg) if steps[a] > warmup else None
            if lift is None:
                continue
            tests = [lift(a + 1, min(n, a + 1 + k * cfg.lr_shift_obs)) for k in cfg.lr_burst_windows]
            lifted = [z for z, up, level in tests if level > 0 and up >= DEFAULT.spike.min_rise * level]
            out.append(max(lifted, default=0.0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    z = np.array([v for seed in ap.parse_args().seeds for v in looks(seed)])
    print(f"{len(z)} looks on clean twins: " + ", ".join(f"{100 * (z >= t).mean():.2f}% past {t}" for t in (4, 5, 6, 8)))


if __name__ == "__main__":
    main()
