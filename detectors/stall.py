"""Stalls and slowdowns: wall time that falls outside the run's own step-time distribution.

``stall``: one interval between logged observations took far longer than the
trailing per-step time predicts: its EXCESS over ``k`` expected steps (``k`` =
steps between the two rows) is worth more than ``STALL_RATIO - 1`` steps and
``MIN_STALL_S`` seconds (a checkpoint write inside the interval is allowed
for). Per step, not per interval: a pause of G steps' time inside a k-step
interval raises the interval only by G/k, so an interval ratio would need
G >= 9k on a log written every k steps; for a per-step log (k = 1) both rules
are the same. The per-step baseline uses small blocks (``STALL_BLOCK``): a log
written every 25 steps must not spend its first 800 steps in warm-up. Live, with ``now``: no new observation for ``STALL_RATIO`` times
the expected wait, and at least ``LIVE_MIN_S`` (collectors flush in bulk, so a
minute of silence is normal), but not more than ``LIVE_MAX_S`` (an archive).

``slowdown``: step time stays above its trailing baseline by at least
``MIN_SLOWDOWN`` (4%) and ``Z_SLOW`` robust sigmas for ``MIN_SLOW_OBS``
consecutive observations. 4% is deliberate: on a large job a node that costs
5% of throughput for the rest of the run (BLOOM 105 s -> 110 s, "remained
there") is worth a look, and the sigma test keeps jittery runs quiet. A
slowdown never needs a rollback; it is 'warning' from 25% up, 'info' below, and
one under 25% must last ``MIN_SMALL_SLOW_OBS`` observations (shared machines jitter).
Sustained also means in training steps: a slowdown shorter than ``MIN_SLOW_STEPS``
steps (three slow steps of a per-step log) is a hiccup, whatever its size.
"""

from __future__ import annotations

import math

import numpy as np

from runwatch.detectors.finding import Finding
from runwatch.detectors.series import Grow, TrailingBaseline

STALL_RATIO = 10.0
MIN_STALL_S = 1.0
STALL_BLOCK = 4
"""Observations per baseline block: warm-up is 2 blocks (8 observations), window 16 blocks (64)."""
Z_STALL = 6.0
"""The excess must also lie this many interval sigmas out (k times the per-step sigma): coarse logs jitter too."""
LIVE_MIN_S = 300.0
LIVE_MAX_S = 3 * 86400.0
"""Silent for more than 3 days: the run ended (or is an archive), it is not 'stalled' any more."""
MIN_SLOWDOWN = 0.04
Z_SLOW = 6.0
MIN_SLOW_OBS = 3
WARN_SLOWDOWN = 0.25
SLOW_BLOCK = 4
MIN_SMALL_SLOW_OBS = 16
"""A slowdown under ``WARN_SLOWDOWN`` must last this many observations to count."""
MIN_SLOW_STEPS = 16
"""Any slowdown must span this many training steps to count (logged every 100 steps, 3 observations do)."""


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

    def __init__(self, segment: int = 0) -> None:
        self.segment = segment
        self.pos = 0
        self.base = TrailingBaseline(rel_floor=0.01, abs_floor=1e-9, block=STALL_BLOCK, num_blocks=16)
        self.hits: list[int] = []
        self.allowance: list[float] = []  # checkpoint seconds inside each hit's interval
        self.per_step = Grow()

    def advance(self, steps: np.ndarray, times: np.ndarray, allowance: np.ndarray) -> None:
        n, lo = len(steps), max(self.pos, 1)
        if n <= lo:
            self.pos = max(self.pos, n)
            return
        self.base.update(self._per_step(steps, times, n))
        base, scale = self.base.at(lo, n)
        k = steps[lo:n] - steps[lo - 1:n - 1]
        allowed = allowance[lo:n]
        unknown = np.isnan(allowed)  # a checkpoint of unknown write time: only the whole-interval ratio
        excess = times[lo:n] - times[lo - 1:n - 1] - np.where(unknown, 0.0, allowed) - base * k
        with np.errstate(invalid="ignore"):
            stalled = ((excess > (STALL_RATIO - 1) * base) & (excess > MIN_STALL_S)
                       & (excess > Z_STALL * k * scale) & (~unknown | (excess > (STALL_RATIO - 1) * base * k)))
        hit = np.flatnonzero(stalled)
        self.hits.extend((lo + hit).tolist())
        self.allowance.extend(np.where(unknown, 0.0, allowed)[hit].tolist())
        self.pos = n

    def _per_step(self, steps: np.ndarray, times: np.ndarray, n: int) -> np.ndarray:
        """Per-step time of every row so far, kept incrementally so streaming stays O(1)."""
        have = self.per_step.size
        if n > have:
            lo = max(have - 1, 0)
            dt, _ = step_times(steps[lo:n], times[lo:n])
            self.per_step.extend(dt[have - lo:])
        return self.per_step.view

    def findings(self, steps: np.ndarray, times: np.ndarray) -> list[Finding]:
        out = []
        for i, allowed in zip(self.hits, self.allowance):
            gap = float(times[i] - times[i - 1])
            base = float(self.base.at(i, i + 1)[0][0])
            expected = base * int(steps[i] - steps[i - 1])
            out.append(Finding(
                kind="stall", onset_step=int(steps[i - 1]), end_step=int(steps[i]), peak_step=int(steps[i]),
                segment=self.segment, severity="warning", self_recovered=True, needs_action=False,
                evidence={"gap_s": gap, "expected_s": expected, "per_step_s": base, "allowance_s": allowed,
                          "num_steps": int(steps[i] - steps[i - 1])},
                message=f"training stalled for {_duration(gap)} after step {int(steps[i - 1])} "
                        f"(expected {_duration(expected)}); it resumed"))
        return out


def live_stall(steps: np.ndarray, times: np.ndarray, now: float, segment: int) -> Finding | None:
    """A stall in progress: the newest row is older than the run's own rhythm allows."""
    ok = np.isfinite(times)
    if ok.sum() < 3:
        return None
    steps, times = steps[ok], times[ok]
    dt, num_steps = step_times(steps, times)
    recent = slice(max(1, len(steps) - 64), len(steps))
    per_step = float(np.nanmedian(dt[recent])) if np.isfinite(dt[recent]).any() else math.nan
    spacing = float(np.median(num_steps[recent]))
    if not math.isfinite(per_step):
        return None
    expected = max(per_step * spacing, 0.0)
    silence = now - float(times[-1])
    if silence <= max(STALL_RATIO * expected, LIVE_MIN_S) or silence > LIVE_MAX_S:
        return None
    return Finding(
        kind="stall", onset_step=int(steps[-1]), end_step=int(steps[-1]), peak_step=int(steps[-1]),
        segment=segment, severity="critical", self_recovered=None, needs_action=True,
        evidence={"silence_s": silence, "expected_s": expected, "live": True},
        message=f"no new step for {_duration(silence)} after step {int(steps[-1])} (expected one every {_duration(expected)})")


class SlowdownScanner:
    """Incremental over one segment's step-time observations."""

    def __init__(self, segment: int = 0) -> None:
        self.segment = segment
        self.pos = 0
        # Small blocks: step time is often logged sparsely (every 100 steps), and a
        # slowdown early in the run (Megatron golden run, steps 2100-2300) must not fall in warm-up.
        self.base = TrailingBaseline(rel_floor=0.005, abs_floor=1e-9, block=SLOW_BLOCK, num_blocks=8, follow_last=False)
        self.slow_tail = 0  # slow observations in a row at the end of the last call (idle only)
        self.episode: dict | None = None
        self.closed: list[tuple[dict, int, bool | None]] = []

    def advance(self, step_time: np.ndarray) -> None:
        n, lo = len(step_time), self.pos
        if n <= lo:
            return
        self.base.update(step_time)
        base, scale = self.base.at(lo, n)
        with np.errstate(invalid="ignore"):
            slow = (step_time[lo:n] > base * (1 + MIN_SLOWDOWN)) & (step_time[lo:n] > base + Z_SLOW * scale)
        # Starts of MIN_SLOW_OBS slow observations in a row, counting slow ones carried from the last call.
        tail = self.slow_tail
        ext = np.concatenate([np.ones(tail, bool), slow])
        if len(ext) >= MIN_SLOW_OBS:
            window = np.lib.stride_tricks.sliding_window_view(ext, MIN_SLOW_OBS).all(axis=1)
            starts = lo - tail + np.flatnonzero(window)
        else:
            starts = np.array([], dtype=np.int64)
        i, allowed = lo, lo - tail
        self.slow_tail = 0
        while i < n:
            if self.episode is not None:
                i = allowed = self._follow(i, n, step_time)
                continue
            k = int(np.searchsorted(starts, allowed))
            if k == len(starts):
                # Remember how many slow observations in a row end this call (they may start a run).
                first = max(allowed, lo)
                quiet = np.flatnonzero(~slow[first - lo:])
                run = n - (first + int(quiet[-1]) + 1) if len(quiet) else n - allowed
                self.slow_tail = min(run, MIN_SLOW_OBS - 1)
                break
            start = int(starts[k])
            self.episode = {"onset": start, "base": self._base_at(start), "prev_ok": False,
                            "last_slow": start + MIN_SLOW_OBS - 1}
            i = start + MIN_SLOW_OBS
        self.pos = n

    def _base_at(self, i: int) -> float:
        return float(self.base.at(i, i + 1)[0][0])

    def _follow(self, i: int, n: int, step_time: np.ndarray) -> int:
        """In a slowdown: two observations in a row back under the frozen band end it."""
        ep = self.episode
        with np.errstate(invalid="ignore"):
            ok = step_time[i:n] <= ep["base"] * (1 + MIN_SLOWDOWN)
        ext = np.concatenate([[ep["prev_ok"]], ok])  # the pair may straddle the previous call
        pairs = np.flatnonzero(ext[:-1] & ext[1:])
        stop = n if not len(pairs) else i + int(pairs[0]) + 1
        slow = np.flatnonzero(~ok[: stop - i] & np.isfinite(step_time[i:stop]))
        if len(slow):
            ep["last_slow"] = i + int(slow[-1])
        ep["prev_ok"] = bool(ok[stop - i - 1])
        if not len(pairs):
            return n
        self.closed.append((ep, ep["last_slow"], True))
        self.episode = None
        return stop

    def findings(self, steps: np.ndarray, step_time: np.ndarray) -> list[Finding]:
        items = list(self.closed) + ([(self.episode, self.episode["last_slow"], None)] if self.episode else [])
        out = []
        for ep, end, recovered in items:
            span = step_time[ep["onset"]:end + 1]
            level = float(np.nanmedian(span))
            rise = level / ep["base"] - 1
            if rise < WARN_SLOWDOWN and end - ep["onset"] + 1 < MIN_SMALL_SLOW_OBS:
                continue  # a few percent for a few observations is machine jitter, not a slowdown
            if steps[end] - steps[ep["onset"]] + 1 < MIN_SLOW_STEPS:
                continue  # a hiccup of a few steps (a GC pause, a noisy neighbour), not sustained
            peak = ep["onset"] + int(np.nanargmax(span))
            state = "back to normal" if recovered else "still slow at the last step"
            out.append(Finding(
                kind="slowdown", onset_step=int(steps[ep["onset"]]), end_step=int(steps[end]), peak_step=int(steps[peak]),
                segment=self.segment, severity="warning" if rise >= WARN_SLOWDOWN else "info",
                self_recovered=recovered, needs_action=False,
                evidence={"baseline_step_s": ep["base"], "median_step_s": level, "rise": rise},
                message=f"steps {rise:.0%} slower from step {int(steps[ep['onset']])} "
                        f"({ep['base']:.3g}s -> {level:.3g}s per step); {state}"))
        return out


def drop_slowdown_stalls(stalls: list[Finding], slowdowns: list[Finding]) -> list[Finding]:
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
            if not (excess > (STALL_RATIO - 1) * level and excess > MIN_STALL_S):
                continue
        out.append(st)
    return out


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.3g} s"


def detect_stalls(steps: np.ndarray, times: np.ndarray, allowance: np.ndarray | None = None, segment: int = 0) -> list[Finding]:
    """Offline: wall-time gaps far outside the segment's own step-time distribution."""
    steps, times = np.asarray(steps), np.asarray(times, dtype=np.float64)
    scanner = StallScanner(segment)
    scanner.advance(steps, times, np.zeros(len(steps)) if allowance is None else np.asarray(allowance, np.float64))
    return scanner.findings(steps, times)


def detect_slowdowns(steps: np.ndarray, step_time: np.ndarray, segment: int = 0) -> list[Finding]:
    """Offline: sustained rises in step time over one segment's step-time observations."""
    scanner = SlowdownScanner(segment)
    step_time = np.asarray(step_time, dtype=np.float64)
    scanner.advance(step_time)
    return scanner.findings(np.asarray(steps), step_time)
