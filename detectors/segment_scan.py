"""Every registered detector over one segment, fed incrementally: the shared engine of offline and streaming.

``SegmentDetectors.advance(cols)`` takes the segment's rows so far (column
arrays as ``segments.columns`` makes them), appends the new rows to the
observation series each detector reads (the registry's ``series``), and lets
every scanner look at what is new. Offline analysis calls it once; the
streaming analyzer calls it per flush. Same code, same findings. A resumed
segment's loss and step-time series start with its parent's healthy history
(``segments.parent_history``), so its detectors judge its first observations
against the parent's baseline.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from runwatch.detectors.config import DetectorConfig
from runwatch.detectors.core import Grow
from runwatch.detectors.finding import Finding
from runwatch.detectors.nan import nonfinite_masks
from runwatch.detectors.registry import REGISTRY, scanner_class
from runwatch.detectors.scanner import ScanContext
from runwatch.detectors.segments import skipped_steps, step_times
from runwatch.detectors.slowdown import join_spells, stall_spells
from runwatch.detectors.stall import drop_slowdown_stalls, lone_stalls

SERIES: dict[str, tuple[str, ...]] = {
    "loss": ("step", "loss", "grad_norm", "act_norm", "lr"),
    "scale": ("step", "loss_scale", "found_inf", "found_inf_present"),
    "time": ("step", "time", "allowance"),
    "step_time": ("step", "step_time"),
    "rows": ("step", "loss", "loss_present", "bad_loss", "bad_grad_norm", "bad_act_norm"),
}
_INT, _BOOL = {"step"}, {"found_inf", "found_inf_present", "loss_present", "bad_loss", "bad_grad_norm", "bad_act_norm"}


PARALLEL_FROM = 1 << 17
"""New rows from which a segment's scanners run side by side on threads (numpy's sorts, selections and
ufuncs release the GIL): an offline read of a long run (1M rows: 0.80x on 2 cores, bench/detector_speed.py).
A live flush of a few rows, and the findings after it, stay on the caller's thread, where a pool would cost
more than it saves. Each scanner reads only its own series, so the findings are the same either way."""
LONGEST_FIRST = ("spike", "slowdown", "stall", "scaler_collapse", "divergence")
"""The scanners by their cost over a long segment, longest first (bench/detector_speed.py's 1M rows: spike ~0.25 s,
slowdown and stall ~0.10 s each, scaler ~0.05 s, divergence ~0.02 s, the rest nothing): handed to the pool in this
order, two threads finish at about the same time (in the registry's order the second thread took the spike's
six companions, more than the spike alone). Side by side every numpy call hands the GIL over, so a scanner
beside another runs slower than alone (the spike ~1.4x): fewer, larger numpy calls count twice here."""
THREADS_ENV = "RUNWATCH_SCAN_THREADS"
"""Threads a segment's scanners may use (default: the cores this process may use); ``check --all`` sets 1 in
its workers, which already judge runs side by side on every core."""


def scan_threads() -> int:
    """The threads a long segment's scanners may use."""
    if os.environ.get(THREADS_ENV, "").strip().isdigit():
        return max(int(os.environ[THREADS_ENV]), 1)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class SegmentDetectors:
    """The registered scanners of one segment plus the observation series each one reads."""

    def __init__(self, segment: int, config: DetectorConfig, *, meta: dict | None = None,
                 checkpoint_seconds: dict[int, float] | None = None,
                 history: dict[str, dict[str, np.ndarray]] | None = None,
                 resume_step: int | None = None, trained_lr: float = -np.inf) -> None:
        self.segment, self.pos, self.config = segment, 0, config
        self.set_pause_seconds(checkpoint_seconds or {})
        self.buf = {name: {col: Grow(np.int64 if col in _INT else (np.bool_ if col in _BOOL else np.float64))
                           for col in cols} for name, cols in SERIES.items()}
        num_history = {}  # observations of the parent's healthy history each series starts with
        for series, past in (history or {}).items():
            for col, grow in self.buf[series].items():
                grow.extend(past[col])
            num_history[series] = len(past["step"])
        self.prev_scale = np.nan
        self._threads = 1  # for the last advance and the findings after it (``PARALLEL_FROM``)
        self.logged_step_time = False  # once a row logs step_time, it is the source; else derive it from time
        self.scanners = {}
        for spec in REGISTRY:
            if spec.scope != "rank":
                continue  # fleet detectors compare ranks (``fleet``), not one rank's rows
            ctx = ScanContext(segment=segment, config=config, meta=meta or {},
                              history=num_history.get(spec.series, 0), resume_step=resume_step, trained_lr=trained_lr)
            self.scanners[spec.kind] = (spec.series, scanner_class(spec.kind)(ctx))

    def set_pause_seconds(self, checkpoint_seconds: dict[int, float]) -> None:
        """Known pauses by step (checkpoint writes, evaluations) the stall rule allows for in the rows not yet
        taken: a live run's checkpoint event lands after the segment started, before the rows after the save."""
        ckpt = sorted((k, v) for k, v in checkpoint_seconds.items() if not np.isnan(v))
        # Checkpoints of unknown write time (a text log's "saving checkpoint"): the interval around one may
        # hold a save and an eval of any length, so the stall rule falls back to the whole-interval ratio there.
        self._unknown_ckpt = np.array(sorted(k for k, v in checkpoint_seconds.items() if np.isnan(v)), dtype=np.int64)
        self._ckpt_steps = np.array([k for k, _ in ckpt], dtype=np.int64)
        self._ckpt_cum = np.concatenate([[0.0], np.cumsum([v for _, v in ckpt])])

    def views(self, series: str) -> dict[str, np.ndarray]:
        return {col: grow.view for col, grow in self.buf[series].items()}

    def advance(self, cols: dict[str, np.ndarray]) -> None:
        """Take rows ``pos .. len(cols['step'])-1`` of the segment."""
        n, lo = len(cols["step"]), self.pos
        if n <= lo:
            return
        new = {k: v[lo:n] for k, v in cols.items()}
        # A step the fp16 scaler skipped (found_inf, or the scale halved there) ran no optimizer
        # step: its inf gradient norm is not a NaN incident and its time is not a normal step time.
        skip, self.prev_scale = skipped_steps(new["loss_scale"], new["found_inf"], self.prev_scale)
        bad = nonfinite_masks(new["loss"], new["grad_norm"], new["act_norm"], new["loss_present"],
                              new["grad_norm_present"], new["act_norm_present"], skip)
        new.update({"bad_" + name: mask for name, mask in bad.items()})
        self._route(new, skip)
        self.pos = n
        self._threads = min(scan_threads(), len(self.scanners)) if n - lo >= PARALLEL_FROM else 1
        self._each(lambda series, scanner: scanner.advance(self.views(series)))

    def _each(self, call) -> dict[str, object]:
        """``call(series, scanner)`` for every scanner, by kind: on threads after a long stretch of rows."""
        workers = self._threads

        def quiet(series: str, scanner: object) -> object:
            # Non-finite values are data here (an overflowed loss, a NaN norm), not arithmetic errors to warn about
            # on stderr; per call, since numpy's error state is per thread.
            with np.errstate(all="ignore"):
                return call(series, scanner)

        if workers < 2:
            return {kind: quiet(*pair) for kind, pair in self.scanners.items()}
        with ThreadPoolExecutor(max_workers=workers) as pool:
            # Longest first (a pool's threads then finish together), answered in the registry's order as before.
            order = sorted(self.scanners, key=lambda kind: LONGEST_FIRST.index(kind) if kind in LONGEST_FIRST
                           else len(LONGEST_FIRST))
            futures = {kind: pool.submit(quiet, *self.scanners[kind]) for kind in order}
            return {kind: futures[kind].result() for kind in self.scanners}

    def _route(self, new: dict[str, np.ndarray], skip: np.ndarray) -> None:
        """Append the new rows to the observation series they belong to."""
        masks = {
            "loss": new["loss_present"],
            "scale": (new["loss_scale_present"] & np.isfinite(new["loss_scale"])) | new["found_inf_present"],
            "time": np.isfinite(new["time"]),
            "rows": np.ones(len(new["step"]), dtype=bool),
        }
        self.logged_step_time = self.logged_step_time or bool(new["step_time_present"].any())
        if self.logged_step_time:
            masks["step_time"] = np.isfinite(new["step_time"]) & (new["step_time"] > 0) & ~skip
        for name, mask in masks.items():
            if not mask.any():
                continue
            every = bool(mask.all())  # then the columns go in as they are, not through a masked copy
            if name == "time":
                self.buf["time"]["allowance"].extend(self._allowance(new["step"] if every else new["step"][mask]),
                                                     share=True)
            for col, grow in self.buf[name].items():
                if col != "allowance":  # shared, not copied, into an empty buffer: no scanner writes to its series
                    grow.extend(new[col] if every else new[col][mask], share=True)
        if "step_time" not in masks:
            self._derived_step_time(masks["time"], skip[masks["time"]])

    def _allowance(self, steps: np.ndarray) -> np.ndarray:
        """Seconds of checkpoint writing inside each interval (previous timed row, this row]."""
        if not len(self._ckpt_steps) and not len(self._unknown_ckpt):
            return np.zeros(len(steps))  # no checkpoint known: nothing to allow for (no search of every row)
        tb = self.buf["time"]["step"]
        prev = np.concatenate([[tb.view[-1] if tb.size else np.iinfo(np.int64).min], steps[:-1]])
        lo = np.searchsorted(self._ckpt_steps, prev, side="left")
        hi = np.searchsorted(self._ckpt_steps, steps, side="left")
        known = self._ckpt_cum[hi] - self._ckpt_cum[lo]
        # Unknown write time inside [previous row, this row] (either end: logs differ on which side a save falls).
        unknown = (np.searchsorted(self._unknown_ckpt, steps, side="right")
                   > np.searchsorted(self._unknown_ckpt, prev, side="left"))
        return np.where(unknown, np.nan, known)

    def _derived_step_time(self, has_time: np.ndarray, skipped: np.ndarray) -> None:
        """No logged step time: derive it from the wall time between observations."""
        tb = self.buf["time"]
        count = int(has_time.sum())
        if not count:
            return
        steps, times = tb["step"].view, tb["time"].view
        first = len(steps) - count
        # From the timed row before these (the segment's first timed row has no interval before it: left out).
        lo = max(first - 1, 0)
        skip = np.concatenate([[False], skipped]) if first else skipped
        at, per = step_times(steps[lo:], times[lo:], skip)
        sb = self.buf["step_time"]
        sb["step"].extend(at, share=True)
        sb["step_time"].extend(per, share=True)

    def findings(self) -> list[Finding]:
        found = self._each(lambda series, scanner: scanner.findings(self.views(series)))
        found["stall"] = drop_slowdown_stalls(found["stall"], found["slowdown"], self.config.stall)
        timed = self.buf["time"]["step"]
        ends = (int(timed.view[0]), int(timed.view[-1])) if timed.size else (0, -1)
        lone, spells = stall_spells(found["stall"], self.config.slowdown, ends)
        found["stall"] = lone_stalls(lone, self.config.stall)
        found["slowdown"] = join_spells(found["slowdown"], spells, timed.view)
        if found["bad_resume"]:
            # The resume itself is the incident: an excursion starting with the segment is that one.
            start = found["bad_resume"][0].onset_step
            for kind in ("spike", "divergence"):
                found[kind] = [f for f in found[kind] if f.onset_step != start]
        return [f for kind in found for f in found[kind]]
