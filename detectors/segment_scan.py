"""All detectors over one segment, fed incrementally: the shared engine of offline and streaming analysis.

``SegmentDetectors.advance(cols)`` takes the segment's rows so far (column
arrays as ``segments.columns`` makes them) and hands each detector the new
observations of the series it judges: the loss observations (rows where the
loss was logged) to spike and divergence, the loss-scale observations to the
scaler, rows with a wall time to stall, step-time observations to slowdown,
every row to nan. Offline analysis calls it once; the streaming analyzer calls
it per row. Same code, same findings.
"""

from __future__ import annotations

import numpy as np

from runwatch.detectors.divergence import DivergenceScanner
from runwatch.detectors.finding import Finding
from runwatch.detectors.nan import NanScanner, nonfinite_masks
from runwatch.detectors.scaler_collapse import ScalerScanner
from runwatch.detectors.series import Grow
from runwatch.detectors.spike import SpikeScanner
from runwatch.detectors.stall import SlowdownScanner, StallScanner, drop_slowdown_stalls

_SUBSERIES: dict[str, tuple[str, ...]] = {
    "loss": ("step", "loss", "grad_norm", "act_norm", "lr"),
    "scale": ("step", "loss_scale"),
    "time": ("step", "time", "allowance"),
    "step_time": ("step", "step_time"),
}


class SegmentDetectors:
    """Scanners for one segment plus the observation buffers each one reads."""

    def __init__(self, segment: int, checkpoint_seconds: dict[int, float] | None = None) -> None:
        self.segment = segment
        self.pos = 0
        ckpt = sorted((k, v) for k, v in (checkpoint_seconds or {}).items() if not np.isnan(v))
        # Checkpoints of unknown write time (a text log's "saving checkpoint"): the interval around one may
        # hold a save and an eval of any length, so the stall rule falls back to the whole-interval ratio there.
        self._unknown_ckpt = np.array(sorted(k for k, v in (checkpoint_seconds or {}).items() if np.isnan(v)),
                                      dtype=np.int64)
        self._ckpt_steps = np.array([k for k, _ in ckpt], dtype=np.int64)
        self._ckpt_cum = np.concatenate([[0.0], np.cumsum([v for _, v in ckpt])])
        self.buf = {name: {col: Grow(np.int64 if col == "step" else np.float64) for col in cols}
                    for name, cols in _SUBSERIES.items()}
        self.all_steps = Grow(np.int64)
        self.prev_scale = np.nan
        self.last_finite_loss = True
        self.logged_step_time = False  # once a row logs step_time, it is the source; else derive it from time
        self.spike, self.divergence = SpikeScanner(segment), DivergenceScanner(segment)
        self.scaler, self.nan = ScalerScanner(segment), NanScanner(segment)
        self.stall, self.slowdown = StallScanner(segment), SlowdownScanner(segment)

    def advance(self, cols: dict[str, np.ndarray]) -> None:
        """Take rows ``pos .. len(cols['step'])-1`` of the segment."""
        n, lo = len(cols["step"]), self.pos
        if n <= lo:
            return
        new = {k: v[lo:n] for k, v in cols.items()}
        self.all_steps.extend(new["step"])
        # A step the fp16 scaler skipped (found_inf, or the scale halved there) ran no optimizer
        # step: its inf gradient norm is not a NaN incident and its time is not a normal step time.
        scale = new["loss_scale"]
        known = np.concatenate([[self.prev_scale], scale])
        idx = np.maximum.accumulate(np.where(np.isfinite(known), np.arange(len(known)), 0))
        last_logged = known[idx]  # the last logged scale up to each row (forward fill)
        with np.errstate(invalid="ignore"):
            skip = new["found_inf"] | (scale < last_logged[:-1])
        self.prev_scale = float(last_logged[-1])
        self._route(new, skip)
        bad = nonfinite_masks(new["loss"], new["grad_norm"], new["act_norm"], new["loss_present"],
                              new["grad_norm_present"], new["act_norm_present"], skip)
        self.nan.advance(bad)
        logged = new["loss"][new["loss_present"]]
        if len(logged):
            self.last_finite_loss = bool(np.isfinite(logged[-1]))
        self.pos = n
        b = self.buf
        self.spike.advance(b["loss"]["loss"].view, b["loss"]["grad_norm"].view)
        self.divergence.advance(b["loss"]["loss"].view)
        self.scaler.advance(b["scale"]["loss_scale"].view, b["scale"]["step"].view)
        self.stall.advance(b["time"]["step"].view, b["time"]["time"].view, b["time"]["allowance"].view)
        self.slowdown.advance(b["step_time"]["step_time"].view)

    def _route(self, new: dict[str, np.ndarray], skip: np.ndarray) -> None:
        """Append the new rows to the observation series they belong to."""
        masks = {
            "loss": new["loss_present"],
            "scale": new["loss_scale_present"] & np.isfinite(new["loss_scale"]),
            "time": np.isfinite(new["time"]),
        }
        self.logged_step_time = self.logged_step_time or bool(new["step_time_present"].any())
        if self.logged_step_time:
            masks["step_time"] = np.isfinite(new["step_time"]) & (new["step_time"] > 0) & ~skip
        for name, mask in masks.items():
            if not mask.any():
                continue
            if name == "time":
                self.buf["time"]["allowance"].extend(self._allowance(new["step"][mask]))
            for col, grow in self.buf[name].items():
                if col != "allowance":
                    grow.extend(new[col][mask])
        if "step_time" not in masks:
            self._derived_step_time(masks["time"], skip[masks["time"]])

    def _allowance(self, steps: np.ndarray) -> np.ndarray:
        """Seconds of checkpoint writing inside each interval (previous timed row, this row]."""
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
        lo = max(first - 1, 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            per = np.diff(times[lo:]) / np.diff(steps[lo:])
        if first == 0:
            per = np.concatenate([[np.nan], per])
        keep = np.isfinite(per) & (per > 0) & ~skipped
        sb = self.buf["step_time"]
        sb["step"].extend(steps[first:][keep])
        sb["step_time"].extend(per[keep])

    def findings(self) -> list[Finding]:
        b = self.buf
        loss = b["loss"]
        out = self.spike.findings(loss["step"].view, loss["loss"].view, loss["grad_norm"].view, loss["lr"].view)
        out += self.divergence.findings(loss["step"].view, loss["loss"].view, loss["grad_norm"].view,
                                        loss["act_norm"].view, loss["lr"].view)
        out += self.scaler.findings(b["scale"]["step"].view, b["scale"]["loss_scale"].view)
        out += self.nan.findings(self.all_steps.view, self.last_finite_loss)
        slowdowns = self.slowdown.findings(b["step_time"]["step"].view, b["step_time"]["step_time"].view)
        out += drop_slowdown_stalls(self.stall.findings(b["time"]["step"].view, b["time"]["time"].view), slowdowns)
        out += slowdowns
        return out
