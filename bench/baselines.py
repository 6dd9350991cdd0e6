"""The three anchors runwatch's spike/divergence detectors are measured against.

Each baseline flags individual observations of a run's loss (and grad norm
where the anchor uses it); consecutive flagged observations merge into one
event whose onset is the first flagged step. They see the same main-line and
branch rows as ``analyze`` (per segment), nothing else.

1. Megatron-LM (``--check-for-spiky-loss``): ``pretrain_gpt.py`` defines
   "spiky loss as a loss that's 10x the max loss observed" (``SPIKY_LOSS_FACTOR
   = 10``) and validates each loss with ``RerunStateMachine.is_unexpectedly_large``
   (``megatron/core/rerun_state_machine.py``): the first ``num_samples=100``
   values only set the max; afterwards ``value >= max_values * threshold`` is a
   spike; NaN and Inf are ignored ("They should be checked separately").
2. OLMo 2's spike score: the OLMo 2 paper counts a spike when a value is more
   than 7 standard deviations above the rolling mean of the last 1,000 steps,
   on the training loss and on the gradient norm. OLMo-core's
   ``StabilityMonitorCallback`` implements it as ``value > mean + threshold_std
   * std`` over a trailing window that excludes the value (its current defaults
   are window 128 and 6.0 std; we use the paper's 1,000 and 7). Deviation:
   OLMo-core only judges once the window is full; our labelled runs are ~500
   steps, so we judge from 100 trailing values on (up to 1,000).
3. ZClip-style EMA z-score (alpha 0.97, z > 2.5): exponential moving mean and
   variance of the value; z = (x - mean) / std; after a 25-step warm-up a value
   with z > 2.5 is flagged, and (as ZClip does for the gradient norm) the EMA is
   updated with the clipped value mean + 2.5 std instead of the outlier. Applied
   to the loss and to the gradient norm; either flags the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MEGATRON_FACTOR = 10.0
MEGATRON_SAMPLES = 100
OLMO_WINDOW = 1000
OLMO_MIN_HISTORY = 100
OLMO_STD = 7.0
ZCLIP_ALPHA = 0.97
ZCLIP_Z = 2.5
ZCLIP_WARMUP = 25


@dataclass(frozen=True)
class BaselineEvent:
    onset_step: int
    end_step: int
    segment: int


def megatron_flags(loss: np.ndarray) -> np.ndarray:
    """Megatron-LM's rule: |loss| >= 10x the max |loss| of the first 100 finite values."""
    flags = np.zeros(len(loss), dtype=bool)
    finite = np.flatnonzero(np.isfinite(loss))
    if len(finite) <= MEGATRON_SAMPLES:
        return flags
    ref = np.max(np.abs(loss[finite[:MEGATRON_SAMPLES]]))
    later = finite[MEGATRON_SAMPLES:]
    flags[later] = np.abs(loss[later]) >= ref * MEGATRON_FACTOR
    return flags


def olmo_flags_one(x: np.ndarray) -> np.ndarray:
    """value > mean + 7 std of up to 1,000 preceding finite values (at least 100)."""
    flags = np.zeros(len(x), dtype=bool)
    history: list[float] = []
    for i, v in enumerate(x):
        if not np.isfinite(v):
            continue
        if len(history) >= OLMO_MIN_HISTORY:
            window = np.asarray(history[-OLMO_WINDOW:])
            std = window.std()
            flags[i] = std > 1e-10 and v > window.mean() + OLMO_STD * std
        history.append(float(v))
    return flags


def zclip_flags_one(x: np.ndarray) -> np.ndarray:
    """EMA z-score > 2.5 (alpha 0.97) with ZClip's clipped update after an outlier."""
    flags = np.zeros(len(x), dtype=bool)
    mean = var = None
    seen = 0
    for i, v in enumerate(x):
        if not np.isfinite(v):
            continue
        seen += 1
        if mean is None:
            mean, var = float(v), 0.0
            continue
        std = var ** 0.5
        z = (v - mean) / std if std > 1e-12 else 0.0
        if seen > ZCLIP_WARMUP and z > ZCLIP_Z:
            flags[i] = True
            v = mean + ZCLIP_Z * std
        delta = v - mean
        mean = ZCLIP_ALPHA * mean + (1 - ZCLIP_ALPHA) * v
        var = ZCLIP_ALPHA * (var + (1 - ZCLIP_ALPHA) * delta * delta)
    return flags


def olmo_flags(loss: np.ndarray, grad_norm: np.ndarray | None) -> np.ndarray:
    flags = olmo_flags_one(loss)
    return flags | olmo_flags_one(grad_norm) if grad_norm is not None else flags


def zclip_flags(loss: np.ndarray, grad_norm: np.ndarray | None) -> np.ndarray:
    flags = zclip_flags_one(loss)
    return flags | zclip_flags_one(grad_norm) if grad_norm is not None else flags


def merge_flags(steps: np.ndarray, flags: np.ndarray, segment: int) -> list[BaselineEvent]:
    """Consecutive flagged observations -> one event, onset at the first flagged step."""
    events: list[BaselineEvent] = []
    start = None
    for i, flagged in enumerate(flags):
        if flagged and start is None:
            start = i
        if start is not None and (not flagged or i == len(flags) - 1):
            last = i if flagged else i - 1
            events.append(BaselineEvent(int(steps[start]), int(steps[last]), segment))
            start = None
    return events


BASELINES = {
    "megatron_10x": lambda loss, gn: megatron_flags(loss),
    "olmo2_7std": olmo_flags,
    "zclip_ema_z2.5": zclip_flags,
}


def run_baselines(segments: list[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]]) -> dict[str, list[BaselineEvent]]:
    """Every baseline over each (segment, steps, loss, grad_norm) series; events per baseline."""
    out: dict[str, list[BaselineEvent]] = {name: [] for name in BASELINES}
    for segment, steps, loss, grad_norm in segments:
        for name, flag_fn in BASELINES.items():
            out[name].extend(merge_flags(steps, flag_fn(loss, grad_norm), segment))
    return out
