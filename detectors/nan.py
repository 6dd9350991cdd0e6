"""Non-finite values: the first NaN/Inf loss or gradient norm, and which signal went first.

Under fp16 dynamic loss scaling an infinite gradient norm on a step the scaler
skipped (``found_inf``, or the loss scale halved there) is the scaler doing its
job, not a NaN incident; those are left to ``scaler_collapse``. Everything else
non-finite in the loss, gradient norm or activation norm opens one finding per
segment. It is self-recovered when the last observations are finite again (the
scaler or a skip absorbed it); a run whose values stay non-finite needs action.
"""

from __future__ import annotations

import numpy as np

from runwatch.detectors.finding import Finding, recovery_steps
from runwatch.detectors.scanner import Observations, ScanContext

SIGNALS: tuple[str, ...] = ("loss", "grad_norm", "act_norm")


class NanScanner:
    """Incremental over every row: remembers the first and last non-finite observation of each signal."""

    def __init__(self, ctx: ScanContext) -> None:
        self.segment = ctx.segment
        self.pos = 0
        self.first: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.counts: dict[str, int] = {name: 0 for name in SIGNALS}

    def advance(self, obs: Observations) -> None:
        """``obs['bad_<signal>']`` marks the rows whose value was logged and is not finite (scaler skips removed)."""
        lo, n = self.pos, len(obs["step"])
        bad = {name: obs["bad_" + name][lo:n] for name in SIGNALS}
        for name in SIGNALS:
            hits = np.flatnonzero(bad[name])
            if len(hits):
                self.first.setdefault(name, lo + int(hits[0]))
                self.last[name] = lo + int(hits[-1])
                self.counts[name] += len(hits)
        self.pos = n

    def findings(self, obs: Observations) -> list[Finding]:
        if not self.first:
            return []
        steps = obs["step"]
        logged = obs["loss"][obs["loss_present"]]
        loss_finite_after = not len(logged) or bool(np.isfinite(logged[-1]))
        onset = min(self.first.values())
        firsts = sorted(name for name, i in self.first.items() if i == onset)
        last = max(self.last.values())
        recovered = last < self.pos - 1 and loss_finite_after
        severity = "warning" if recovered else "critical"
        took = recovery_steps(steps, onset, last + 1) if recovered else None
        which = " and ".join(firsts)
        later = {name: int(steps[i]) for name, i in sorted(self.first.items(), key=lambda kv: kv[1]) if i != onset}
        message = (f"non-finite {which} at step {int(steps[onset])}"
                   + (f" (then {', '.join(f'{k} at {v}' for k, v in later.items())})" if later else "")
                   + (f"; finite again after {took} steps" if recovered else "; still not finite at the last step"))
        evidence = {"detected_step": int(steps[onset]), "first_signal": firsts[0] if len(firsts) == 1 else "both", "first_signals": firsts,
                    "first_step": {name: int(steps[i]) for name, i in sorted(self.first.items(), key=lambda kv: kv[1])},
                    "num_nonfinite": {k: v for k, v in self.counts.items() if v},
                    "recovery_steps": took}
        return [Finding(kind="nan", onset_step=int(steps[onset]), end_step=int(steps[last]),
                        peak_step=int(steps[onset]), segment=self.segment, severity=severity,
                        self_recovered=recovered, needs_action=not recovered, evidence=evidence, message=message)]


def nonfinite_masks(loss: np.ndarray, grad: np.ndarray, act: np.ndarray, loss_present: np.ndarray,
                    grad_present: np.ndarray, act_present: np.ndarray, scaler_skip: np.ndarray) -> dict[str, np.ndarray]:
    """Which rows hold a logged, non-finite value; a gradient norm the scaler skipped does not count."""
    return {
        "loss": loss_present & ~np.isfinite(loss),
        "grad_norm": grad_present & ~np.isfinite(grad) & ~scaler_skip,
        "act_norm": act_present & ~np.isfinite(act),
    }


def detect_nan(steps: np.ndarray, bad: dict[str, np.ndarray], loss_finite_after: bool, segment: int = 0) -> list[Finding]:
    """Offline: the first non-finite episode of one segment (``bad``: masks as ``nonfinite_masks`` makes them)."""
    from runwatch.detectors.config import DEFAULT

    steps = np.asarray(steps, dtype=np.int64)
    obs = {"step": steps, **{"bad_" + k: np.asarray(v, bool) for k, v in bad.items()},
           "loss": np.array([0.0 if loss_finite_after else np.nan]), "loss_present": np.ones(1, bool)}
    scanner = NanScanner(ScanContext(segment=segment, config=DEFAULT))
    scanner.advance(obs)
    return scanner.findings(obs)
