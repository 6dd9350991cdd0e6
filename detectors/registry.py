"""The detector registry: every failure mode runwatch knows, in one place.

Adding a detector is one module implementing ``scanner.Scanner``, one line
here and its test. ``KINDS`` (what a finding may be), the kinds that never
need a rollback and the dashboard's performance kinds all come from this
table. Scanner classes are imported on first use, so the record types
(``finding``) can read the kinds without importing every detector.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class DetectorSpec:
    kind: str
    scanner: str
    """``module:Class`` under ``runwatch.detectors``."""
    series: str
    """The observations it reads: 'loss' (rows with a loss), 'scale' (rows with a loss scale or a skip flag),
    'time' (rows with a wall time), 'step_time', 'rows' (every row), or 'ranks' (a fleet detector's steps that
    every rank of the segment logged, one column per rank)."""
    can_need_rollback: bool
    """Whether a finding of this kind can call for a rollback (speed problems never do)."""
    performance: bool = False
    """A speed finding (shown with the step-time chart rather than the loss)."""
    data_may_cause: bool = True
    """Whether the batches at the onset may be the cause, so that a rollback skips them (a replica that
    disagrees with the others is a device's fault: every replica read the same step)."""
    scope: str = "rank"
    """'rank': judges one rank's segment (``segment_scan``); 'fleet': compares the ranks of a segment
    step by step (``fleet``), its series 'ranks' holds one column per rank."""


REGISTRY: tuple[DetectorSpec, ...] = (
    DetectorSpec("spike", "spike:SpikeScanner", "loss", True),
    DetectorSpec("divergence", "divergence:DivergenceScanner", "loss", True),
    DetectorSpec("bad_resume", "bad_resume:BadResumeScanner", "loss", True),
    DetectorSpec("scaler_collapse", "scaler_collapse:ScalerScanner", "scale", True),
    DetectorSpec("nan", "nan:NanScanner", "rows", True),
    DetectorSpec("stall", "stall:StallScanner", "time", False, performance=True),
    DetectorSpec("slowdown", "slowdown:SlowdownScanner", "step_time", False, performance=True),
    DetectorSpec("straggler", "straggler:StragglerScanner", "ranks", False, performance=True, scope="fleet"),
    DetectorSpec("rank_disagreement", "rank_disagreement:DisagreementScanner", "ranks", True, data_may_cause=False,
                 scope="fleet"),
)

KINDS: tuple[str, ...] = tuple(d.kind for d in REGISTRY)
NO_ROLLBACK_KINDS: frozenset[str] = frozenset(d.kind for d in REGISTRY if not d.can_need_rollback)
DEVICE_FAULT_KINDS: frozenset[str] = frozenset(d.kind for d in REGISTRY if not d.data_may_cause)
PERFORMANCE_KINDS: frozenset[str] = frozenset(d.kind for d in REGISTRY if d.performance)
FLEET_KINDS: tuple[str, ...] = tuple(d.kind for d in REGISTRY if d.scope == "fleet")
SERIES_OF: dict[str, str] = {d.kind: d.series for d in REGISTRY}
"""The observations each kind reads: two findings over the same steps that read the same ones are two readings of
one incident (a spike that became a divergence); a slowdown beside a spike is two incidents."""


@cache
def scanner_class(kind: str) -> type:
    """The scanner class registered for ``kind``."""
    spec = next(d for d in REGISTRY if d.kind == kind)
    module, name = spec.scanner.split(":")
    return getattr(importlib.import_module(f"runwatch.detectors.{module}"), name)
