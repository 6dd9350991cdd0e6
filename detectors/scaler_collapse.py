"""fp16 loss-scale collapse: a burst of consecutive halvings, or the scale falling below a floor.

Dynamic loss scaling backs off on every overflow and grows back after a clean
stretch; an overflow every few hundred steps followed by regrowth (DeepSpeed's
65536 -> 32768 sawtooth) is the scaler working. Also normal: the start-up
calibration, when the scale drops from its initial guess before it ever grew
(a chain starting within ``CALIBRATION_OBS`` observations of the segment start).
A finding is a *chain* of decreases without any growth in between, each within
``CHAIN_GAP`` observations (and steps, unless on the next logged row) of the previous one, that halves the scale at least
``MIN_HALVINGS`` times (16x); or any scale under ``FLOOR`` (OPT: healthy means
>= 1; "crashing to 0" is the signature). A burst is self-recovered once the
scale grows back to within ``RECOVERED_WITHIN`` halvings of where it was; one
that stays down for ``RECOVERY_WINDOW`` observations after its last halving,
or any scale under the floor, needs action.
"""

from __future__ import annotations

import math

import numpy as np

from runwatch.detectors.finding import Finding

FLOOR = 1.0
CALIBRATION_OBS = 50
"""Decreases before the scale ever grew, starting in the first 50 observations, are start-up calibration."""
MIN_HALVINGS = 4.0
CHAIN_GAP = 25
"""Observations between two decreases that still make them one burst."""
RECOVERY_WINDOW = 200
RECOVERED_WITHIN = 4
"""Back within 2**4 (16x) of the scale before the burst: recovered. One regrowth from 8 to 16 is not."""


class ScalerScanner:
    """Incremental over the loss-scale observations of one segment (rows where it was logged)."""

    def __init__(self, segment: int = 0) -> None:
        self.segment = segment
        self.pos = 0
        self.grew = False  # the scale has grown once: calibration is over
        self.chain: dict | None = None  # current run of decreases
        self._steps: np.ndarray | None = None
        self.closed: list[tuple[dict, int, bool | None]] = []

    def advance(self, scale: np.ndarray, steps: np.ndarray | None = None) -> None:
        """``steps`` (the step of each observation, optional) keeps the chain gap in training steps too."""
        n = len(scale)
        self._steps = steps
        lo = self.pos
        if n <= lo:
            return
        start = max(lo, 1)
        if lo == 0 and n and scale[0] < FLOOR:
            self._decrease(0, scale)
        with np.errstate(invalid="ignore"):
            changes = np.flatnonzero(scale[start:n] != scale[start - 1:n - 1]) + start if n > start else np.array([], int)
        for i in changes.tolist():
            self._settle(i, scale)
            if scale[i] > scale[i - 1]:
                self.grew = True
                if self.chain is not None:
                    self._close_on_growth(i, scale)
            elif scale[i] < scale[i - 1]:
                self._decrease(i, scale)
        self._settle(n, scale)
        self.pos = n

    def _decrease(self, i: int, scale: np.ndarray) -> None:
        prev = float(scale[i - 1]) if i > 0 else float(scale[i])
        halvings = (math.log2(prev / scale[i]) if scale[i] > 0 else math.inf) if i > 0 else 0.0
        ch = self.chain
        # A chain goes on while it has not regrown; a long quiet gap breaks it unless it is already a burst.
        if ch is not None and not _is_burst(ch) and self._gap(ch["last"], i) > CHAIN_GAP:
            self.chain = ch = None
        if ch is None:
            ch = self.chain = {"first": i, "last": i, "halvings": 0.0, "before": prev,
                               "calibration": not self.grew and i < CALIBRATION_OBS, "min_i": i, "min": math.inf}
        ch["last"], ch["halvings"] = i, ch["halvings"] + halvings
        if not scale[i] >= ch["min"]:
            ch["min_i"], ch["min"] = i, float(scale[i])

    def _gap(self, last: int, i: int) -> int:
        """Quiet observations between two decreases; on a log written every k steps, in steps (a chain
        gap of 25 observations would be 25k steps, in which a scaler with a long growth interval backs
        off now and then without collapsing), except that decreases on neighbouring rows always chain."""
        steps = self._steps
        if steps is None or i - last <= 1:
            return i - last
        return max(i - last, int(steps[i] - steps[last]))

    def _close_on_growth(self, i: int, scale: np.ndarray) -> None:
        """Growth ends an ordinary chain; a burst ends only once the scale is back near where it was."""
        ch = self.chain
        if not _is_burst(ch):
            self.chain = None
        elif scale[i] >= ch["before"] / 2.0 ** RECOVERED_WITHIN:
            self._finish(ch, i - 1, True)

    def _settle(self, i: int, scale: np.ndarray) -> None:
        """Close a chain that had ``RECOVERY_WINDOW`` observations to regrow and did not."""
        ch = self.chain
        if ch is not None and i > ch["last"] + RECOVERY_WINDOW:
            self._finish(ch, ch["last"] + RECOVERY_WINDOW, False)

    def _finish(self, ch: dict, end: int, recovered: bool | None) -> None:
        self.chain = None
        if _is_burst(ch):
            self.closed.append((ch, end, recovered))

    def findings(self, steps: np.ndarray, scale: np.ndarray) -> list[Finding]:
        items = list(self.closed)
        if self.chain is not None:
            items.append((self.chain, len(scale) - 1, None))
        out = [classify(ch, end, rec, steps, scale, self.segment) for ch, end, rec in items]
        return [f for f in out if f is not None]


def _is_burst(ch: dict) -> bool:
    below = ch["min"] < FLOOR
    return below or (ch["halvings"] >= MIN_HALVINGS and not ch["calibration"])


def classify(ch: dict, end: int, recovered: bool | None, steps: np.ndarray, scale: np.ndarray,
             segment: int) -> Finding | None:
    if not _is_burst(ch):
        return None
    low = ch["min"]
    below = low < FLOOR
    needs = below or recovered is not True  # a burst still down (open or window over) is an alarm
    severity = "critical" if needs else "warning"
    recovered = False if below and recovered is not True else recovered
    evidence = {"scale_before": ch["before"], "scale_min": low, "halvings": ch["halvings"],
                "below_floor": below, "floor": FLOOR, "calibration": ch["calibration"]}
    state = {True: "the scale grew back", False: "the scale did not grow back", None: "not grown back yet"}[recovered]
    message = (f"loss scale collapsed from step {int(steps[ch['first']])}: {ch['before']:g} -> {low:g}"
               f" ({ch['halvings']:.0f} halvings{', below the floor of 1' if below else ''}); {state}")
    return Finding(kind="scaler_collapse", onset_step=int(steps[ch["first"]]), end_step=int(steps[min(end, len(steps) - 1)]),
                   peak_step=int(steps[ch["min_i"]]), segment=segment, severity=severity,
                   self_recovered=recovered, needs_action=needs, evidence=evidence, message=message)


def detect_scaler_collapse(steps: np.ndarray, scale: np.ndarray, segment: int = 0) -> list[Finding]:
    """Offline: every loss-scale collapse in one segment's loss-scale observations."""
    scanner = ScalerScanner(segment)
    scale = np.asarray(scale, dtype=np.float64)
    scanner.advance(scale, np.asarray(steps))
    return scanner.findings(np.asarray(steps), scale)
