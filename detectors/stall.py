"""Stalls: wall time between two logged rows far beyond what their steps should take.

One interval's EXCESS over k expected steps (k = steps between the two rows,
expected = the trailing per-step time) must be worth more than ``ratio - 1``
steps, ``min_seconds`` and ``z`` interval sigmas; a checkpoint write inside the
interval (``write_seconds``) is allowed for. Consecutive such intervals are a
slow spell (``slowdown.stall_spells``); one alone is a stall only past
``z_alone`` sigmas, the bar its own false-alarm rate sets (``lone_stalls``). Per step, not per interval: a
pause of G steps' time inside a k-step interval raises the interval only by
G/k, so an interval ratio would need G >= 9k on a log written every k steps.
Where a checkpoint of unknown write time lies in the interval only the whole
interval ratio is used. Live (``live_stall``): no new row for ``ratio`` times
the expected wait and at least ``live_min_seconds``, but not more than
``live_max_seconds`` (an archive).
"""

from __future__ import annotations

import math

import numpy as np

from runwatch.detectors.config import StallConfig
from runwatch.detectors.core import ROWS_AT_ONCE, BlockBaseline, Grow
from runwatch.detectors.finding import Finding
from runwatch.detectors.scanner import Observations, ScanContext


def step_times(steps: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-step wall time of each interval (NaN for the first row) and the interval length in steps."""
    dt = np.full(len(steps), np.nan)
    num_steps = np.zeros(len(steps), dtype=np.int64)
    if len(steps) > 1:
        num_steps[1:] = np.diff(steps)
        with np.errstate(invalid="ignore", divide="ignore"):
            per = np.diff(times) / num_steps[1:]
        dt[1:] = np.where(num_steps[1:] > 0, per, np.nan)
    return dt, num_steps


class StallScanner:
    """Incremental over one segment's rows with a wall time."""

    def __init__(self, ctx: ScanContext) -> None:
        self.segment, self.cfg = ctx.segment, ctx.config.stall
        self.pos = 0
        # The interval's spread includes the host's wander (over a long history): a noisy host's slow stretch
        # is not a pause. Nor is its noise ever taken below the long-run noise: a MAD of 64 intervals is
        # uncertain by ~15%, and a calm window's low estimate made a noisy host's ordinary 5-sigma interval a
        # "stall" (bench/calibrate.py: 32 of 34 false alarms in 3M healthy steps before this).
        # Step time varies by factors (a slow stretch takes 1.3x, not +0.3 s), so its baseline is kept in log:
        # a sigma of the raw interval under-states the long right tail of a wandering host (a 100-step interval
        # 1.7x its usual length is a 3.5-sigma log excursion, a "6-sigma" raw one: 6 of the 8 false alarms
        # left in 3M healthy steps by bench/calibrate.py). The 1% floor is the jitter of a steady host's timer.
        self.base = BlockBaseline(block=self.cfg.block, window=self.cfg.window_blocks, min_blocks=2,
                                  rel_floor=0.0, abs_floor=0.01, wander=True, wander_window=4 * self.cfg.window_blocks,
                                  long_noise_floor=1.0)
        self.hits: list[int] = []
        self.allowance: list[float] = []  # checkpoint seconds inside each hit's interval
        self.sigmas: list[float] = []  # each hit's interval in sigmas of the run's log interval time
        self.per_step = Grow()

    def advance(self, obs: Observations) -> None:
        n, lo = len(obs["step"]), max(self.pos, 1)
        if n <= lo:
            self.pos = max(self.pos, n)
            return
        self.base.update(self._per_step(obs["step"], obs["time"], n))
        for a in range(lo, n, ROWS_AT_ONCE):
            self._judge(obs, a, min(n, a + ROWS_AT_ONCE))
        self.pos = n

    def _judge(self, obs: Observations, lo: int, n: int) -> None:
        """Note the stalled intervals among rows lo..n-1 (each judged on its own)."""
        steps, times, allowance, cfg = obs["step"], obs["time"], obs["allowance"], self.cfg
        log_base, log_scale = self.base.at(lo, n)
        base = np.exp(log_base)
        k = steps[lo:n] - steps[lo - 1:n - 1]
        allowed = allowance[lo:n]
        unknown = np.isnan(allowed)  # a checkpoint of unknown write time: only the whole-interval ratio
        known = np.where(unknown, 0.0, allowed) if unknown.any() else allowed
        excess = times[lo:n] - times[lo - 1:n - 1] - known - base * k
        with np.errstate(invalid="ignore", divide="ignore"):
            # The two plain bars first; the log-scale and unknown-checkpoint tests at the few rows past both.
            rows = np.flatnonzero((excess > (cfg.ratio - 1) * base) & (excess > cfg.min_seconds))
            e, b, kk = excess[rows], base[rows], k[rows]
            rise = np.log1p(e / (b * kk))
            stalled = (rise > cfg.z * log_scale[rows]) & (~unknown[rows] | (e > (cfg.ratio - 1) * b * kk))
        hit = rows[stalled]
        self.hits.extend((lo + hit).tolist())
        self.allowance.extend(known[hit].tolist())
        self.sigmas.extend((rise / log_scale[rows])[stalled].tolist())

    def _per_step(self, steps: np.ndarray, times: np.ndarray, n: int) -> np.ndarray:
        """Log per-step time of every row so far, kept incrementally so streaming stays O(1)."""
        for a in range(self.per_step.size, n, ROWS_AT_ONCE):
            b, lo = min(n, a + ROWS_AT_ONCE), max(a - 1, 0)
            dt, _ = step_times(steps[lo:b], times[lo:b])
            with np.errstate(invalid="ignore", divide="ignore"):
                self.per_step.extend(np.log(np.where(dt > 0, dt, np.nan))[a - lo:])
        return self.per_step.view

    def findings(self, obs: Observations) -> list[Finding]:
        steps, times = obs["step"], obs["time"]
        out = []
        for i, allowed, sigmas in zip(self.hits, self.allowance, self.sigmas):
            gap = float(times[i] - times[i - 1])
            base = math.exp(float(self.base.level_at(i, i + 1)[0]))
            expected = base * int(steps[i] - steps[i - 1])
            out.append(Finding(
                kind="stall", onset_step=int(steps[i - 1]), end_step=int(steps[i]), peak_step=int(steps[i]),
                segment=self.segment, severity="warning" if gap - allowed - expected >= self.cfg.warn_seconds else "info",
                self_recovered=True, needs_action=False,
                evidence={"gap_s": gap, "expected_s": expected, "per_step_s": base, "allowance_s": allowed,
                          "num_steps": int(steps[i] - steps[i - 1]), "detected_step": int(steps[i]),
                          "z": sigmas},
                message=f"training stalled for {duration(gap)} after step {int(steps[i - 1])} "
                        f"(expected {duration(expected)}); it resumed"))
        return out


def expected_wait(steps: np.ndarray, times: np.ndarray) -> float | None:
    """Seconds between two logged rows at the run's recent rhythm (per-step time x logging interval), or None
    before three timed rows."""
    ok = np.isfinite(times)
    if ok.sum() < 3:
        return None
    steps, times = steps[ok], times[ok]
    dt, num_steps = step_times(steps, times)
    recent = slice(max(1, len(steps) - 64), len(steps))
    per_step = float(np.nanmedian(dt[recent])) if np.isfinite(dt[recent]).any() else math.nan
    spacing = float(np.median(num_steps[recent]))
    return max(per_step * spacing, 0.0) if math.isfinite(per_step) else None


def is_live_stall(silence: float, expected: float, cfg: StallConfig, allowance: float = 0.0) -> bool:
    """The live rule: silent for more than ``ratio`` x the expected wait and ``live_min_seconds`` (plus a
    known pause such as the longest checkpoint write), and not so long that the run is over."""
    return max(cfg.ratio * expected, cfg.live_min_seconds) + allowance < silence <= cfg.live_max_seconds


def live_stall(steps: np.ndarray, times: np.ndarray, now: float, segment: int,
               cfg: StallConfig = StallConfig()) -> Finding | None:
    """A stall in progress: the newest row is older than the run's own rhythm allows."""
    expected = expected_wait(steps, times)
    if expected is None:
        return None
    steps = steps[np.isfinite(times)]
    times = times[np.isfinite(times)]
    silence = now - float(times[-1])
    if not is_live_stall(silence, expected, cfg):
        return None
    return Finding(
        kind="stall", onset_step=int(steps[-1]), end_step=int(steps[-1]), peak_step=int(steps[-1]),
        segment=segment, severity="critical", self_recovered=None, needs_action=True,
        evidence={"silence_s": silence, "expected_s": expected, "live": True},
        message=f"no new step for {duration(silence)} after step {int(steps[-1])} (expected one every {duration(expected)})")


def lone_stalls(stalls: list[Finding], cfg: StallConfig) -> list[Finding]:
    """The stalls no slow spell took that pass ``z_alone``: one interval alone must be rarer than a spell's."""
    return [st for st in stalls if st.evidence["z"] >= cfg.z_alone]


def drop_slowdown_stalls(stalls: list[Finding], slowdowns: list[Finding], cfg: StallConfig = StallConfig()) -> list[Finding]:
    """Judge a stall inside a slowdown against the slowed pace, not the old one.

    On a log written every k steps a slowdown of factor f adds (f - 1) * k steps'
    time to every interval, which the per-step stall rule alone would call a
    stall in each interval; a real pause must still stand out from the slow pace.
    """
    out = []
    for st in stalls:
        ev = st.evidence
        slow = next((sd for sd in slowdowns if sd.segment == st.segment
                     and sd.onset_step <= st.end_step <= sd.end_step), None)
        if slow is not None:
            level = float(slow.evidence["median_step_s"])
            excess = ev["gap_s"] - ev["allowance_s"] - level * ev["num_steps"]
            if not (excess > (cfg.ratio - 1) * level and excess > cfg.min_seconds):
                continue
        out.append(st)
    return out


def duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.3g} s"


def detect_stalls(steps: np.ndarray, times: np.ndarray, allowance: np.ndarray | None = None, segment: int = 0,
                  config: object | None = None) -> list[Finding]:
    """Offline: wall-time gaps far outside the segment's own step-time distribution."""
    from runwatch.detectors.config import DEFAULT

    steps, times = np.asarray(steps, dtype=np.int64), np.asarray(times, dtype=np.float64)
    obs = {"step": steps, "time": times,
           "allowance": np.zeros(len(steps)) if allowance is None else np.asarray(allowance, np.float64)}
    scanner = StallScanner(ScanContext(segment=segment, config=config or DEFAULT))
    scanner.advance(obs)
    return scanner.findings(obs)
