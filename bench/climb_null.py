"""The rollback walk-back's learning test on clean training: how often a natural activation-norm climb is refused.

    .venv/bin/python bench/climb_null.py --seeds 141563 199657      # seeds whose training is cached

The advice refuses every checkpoint inside an activation-norm climb that grew the norm ``act_climb_ratio`` x by
``act_climb_z`` standard errors (OPT's precursor), unless the loss fell through the climb: by ``learning_fall`` of
its level and by ``learning_z`` standard errors of its first and last quarters' medians (``divergence.
precursor_grown``). On a clean twin (no fault: ``bench/evalruns/fresh``) every such climb is the model learning,
so a climb the test does not call learning is a checkpoint refused for nothing, and the advice walks back over
the training since. This asks the question the advice asks, at every checkpoint of each twin's first segment
after the warm-up, and reports the climbs found and the share the loss's fall would call learning at each bar.
It reads the training cache only (``eval_detectors.py --set fresh --seed N`` fills it).
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
from runwatch.detectors.divergence import _loss_ends, act_growth_start, answers_the_schedule, norm_grown  # noqa: E402

BARS = (1.5, 2.0, 2.5, 3.0)


def climbs(seed: int) -> list[tuple[float, float]]:
    """(the loss's fall, its standard error), each as a share of the loss's level, through each natural climb the
    advice would ask about at a checkpoint of ``seed``'s clean twins (one per distinct climb start and run)."""
    adv, lrc, out = DEFAULT.advice, DEFAULT.lr, []
    for run in fresh.fresh_runs(seed):
        rows, events = cached_twin(run, seed)
        steps = np.array([r["step"] for r in rows])
        back = np.flatnonzero(np.diff(steps) <= 0)  # a resume: segment 0 ends there
        n = int(back[0]) + 1 if len(back) else len(steps)
        col = {k: np.array([np.nan if r.get(k) is None else r[k] for r in rows[:n]], float)
               for k in ("loss", "act_norm", "lr")}
        steps = steps[:n]
        if not np.isfinite(col["act_norm"]).any():
            continue
        seen = set()
        for c in sorted({e["step"] for e in events if e["event"] == "checkpoint" and e["step"] <= steps[-1]}):
            start = act_growth_start(steps, col["act_norm"], c + 1)
            if start is None or start in seen or answers_the_schedule(steps, col["lr"], start, lrc):
                continue
            i, j = int(np.searchsorted(steps, start)), int(np.searchsorted(steps, c + 1))
            ends = _loss_ends(col["loss"][i:j], adv.learning_obs) if norm_grown(col["act_norm"], i, j, adv) else None
            if ends is None:
                continue
            seen.add(start)
            first, last, se = ends
            out.append(((first - last) / abs(first), se / abs(first)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    found = [v for seed in ap.parse_args().seeds for v in climbs(seed)]
    if not found:
        print("no climbs")
        return
    fall, se = np.array([v[0] for v in found]), np.array([v[1] for v in found])
    z, floor = fall / se, DEFAULT.advice.learning_fall
    unproven = {t: int((~((z >= t) & (fall >= floor))).sum()) for t in BARS}
    shown = {t: int((fall + t * se < floor).sum()) for t in BARS}
    print(f"{len(z)} natural activation-norm climbs at clean twins' checkpoints (median fall {np.median(z):.2f} "
          f"standard errors, {np.median(fall):.1%} of the loss). Refused as OPT's precursor where learning is not "
          "shown (a fall of t standard errors and " + f"{floor:.0%}): "
          + ", ".join(f"t={t}: {unproven[t]}" for t in BARS) + f". Where a stall is shown (the fall t standard errors "
          f"up under {floor:.0%}): " + ", ".join(f"t={t}: {shown[t]}" for t in BARS) + ".")


if __name__ == "__main__":
    main()
