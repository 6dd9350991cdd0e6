"""The one contract every detector implements, and what it is handed.

A scanner judges one segment's observations of one series (``series`` in its
registry entry: the loss observations, the loss-scale observations, the timed
rows, the step times, or every row). ``advance(obs)`` is given the whole series
so far (column views that only grow) and looks at what it has not seen yet;
``findings(obs)`` turns what it saw into ``Finding`` records. Running
``advance`` once over a whole run or once per new row gives the same findings:
that is what makes the streaming analyzer equal to the offline one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from runwatch.detectors.config import DetectorConfig
from runwatch.detectors.finding import Finding

Observations = dict[str, np.ndarray]
"""Column views of one series: ``step`` (int64) and float columns (NaN where not logged)."""


@dataclass(frozen=True)
class ScanContext:
    """What a scanner may know besides its observations."""

    segment: int
    config: DetectorConfig
    meta: dict = field(default_factory=dict)
    """The run's metadata (``run.json``): e.g. ``scaler`` with ``init_scale``, ``growth_interval``."""
    history: int = 0
    """Leading observations of the series that are the parent segment's healthy history (a resumed segment
    starts from its parent's baseline at the resume step); no finding may begin inside them."""
    resume_step: int | None = None
    """The checkpoint step this segment resumed from, when a resume event says so."""
    trained_lr: float = -math.inf
    """The highest LR the run trained at on its main line up to the resume (``segments.parent_history``): a warm
    restart back to a peak the run held long before the history it was seeded with is still the schedule's."""


class Scanner(Protocol):
    """One failure mode over one segment's series; see the module docstring."""

    def __init__(self, ctx: ScanContext) -> None: ...

    def advance(self, obs: Observations) -> None:
        """Look at every observation not seen yet (``obs`` holds the whole series so far)."""

    def findings(self, obs: Observations) -> list[Finding]:
        """What was seen, as findings (closed episodes and the one still open)."""


def own_findings(findings: list[Finding], steps: np.ndarray, history: int) -> list[Finding]:
    """The findings that begin in the segment's own observations, not in the parent history it was seeded with."""
    if not history:
        return findings
    first = int(steps[history]) if history < len(steps) else np.iinfo(np.int64).max
    return [f for f in findings if f.onset_step >= first]
