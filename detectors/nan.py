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

from runwatch.detectors.finding import Finding

SIGNALS: tuple[str, ...] = ("loss", "grad_norm", "act_norm")


class NanScanner:
    """Incremental: remembers the first and last non-finite observation of each signal."""

    def __init__(self, segment: int = 0) -> None:
        self.segment = segment
        self.pos = 0
        self.first: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.counts: dict[str, int] = {name: 0 for name in SIGNALS}

    def advance(self, bad: dict[str, np.ndarray]) -> None:
        """``bad[signal]`` marks the *new* rows whose value was logged and is not finite (scaler skips removed)."""
        lo = self.pos
        n = lo + len(bad["loss"])
        for name in SIGNALS:
            hits = np.flatnonzero(bad[name])
            if len(hits):
                self.first.setdefault(name, lo + int(hits[0]))
                self.last[name] = lo + int(hits[-1])
                self.counts[name] += len(hits)
        self.pos = n

    def findings(self, steps: np.ndarray, loss_finite_after: bool) -> list[Finding]:
        if not self.first:
            return []
        onset = min(self.first.values())
        firsts = sorted(name for name, i in self.first.items() if i == onset)
        last = max(self.last.values())
        recovered = last < self.pos - 1 and loss_finite_after
        severity = "warning" if recovered else "critical"
        which = " and ".join(firsts)
        later = {name: int(steps[i]) for name, i in sorted(self.first.items(), key=lambda kv: kv[1]) if i != onset}
        message = (f"non-finite {which} at step {int(steps[onset])}"
                   + (f" (then {', '.join(f'{k} at {v}' for k, v in later.items())})" if later else "")
                   + ("; finite again afterwards" if recovered else "; still not finite at the last step"))
        evidence = {"first_signal": firsts[0] if len(firsts) == 1 else "both", "first_signals": firsts,
                    "first_step": {name: int(steps[i]) for name, i in sorted(self.first.items(), key=lambda kv: kv[1])},
                    "num_nonfinite": {k: v for k, v in self.counts.items() if v}}
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
    """Offline: the first non-finite episode of one segment."""
    scanner = NanScanner(segment)
    scanner.advance(bad)
    return scanner.findings(np.asarray(steps), loss_finite_after)
