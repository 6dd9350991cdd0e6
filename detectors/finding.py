"""The typed records detectors hand to the app: findings, segments, rollback advice.

Everything here is frozen and JSON-ready through ``to_dict`` so the CLI, the
dashboard and the evaluation read the same fields.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from runwatch.detectors.registry import KINDS

SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")


def clean_json(value: object) -> object:
    """Recursively make a value strict-JSON safe: non-finite floats become None, numpy scalars plain."""
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalar -> Python scalar
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def recovery_steps(steps: Sequence[int], onset: int, back: int | None) -> int | None:
    """Steps from an excursion's onset (a row) to its first row back to normal (``back``, a row; None when it never
    came back): how long a finding that recovered by itself took (DETECTION.md section 5: a late recovery is a
    recovery, and its time is recorded)."""
    return None if back is None or not 0 <= back < len(steps) else int(steps[back]) - int(steps[onset])


@dataclass(frozen=True)
class Finding:
    """One problem a detector saw in one segment's series."""

    kind: str
    """One of ``KINDS`` (the registry's)."""
    onset_step: int
    """First step of the excursion (not the step where a threshold was crossed)."""
    end_step: int
    """Last step still affected (the last step judged when it never ended)."""
    peak_step: int
    """Step of the worst value."""
    segment: int
    """Segment whose own rows showed it."""
    severity: str
    """'info', 'warning' or 'critical'."""
    self_recovered: bool | None
    """True: back to its pre-onset level; False: did not come back within the window; None: not applicable or too early to say."""
    needs_action: bool
    """True when someone should act (roll back, fix a node); False for history and self-healing blips."""
    open: bool = True
    """Still an alarm: on the main line and not already rolled back (set by ``analyze``)."""
    evidence: dict = field(default_factory=dict)
    """Numbers behind the finding (baseline, peak, ratios, thresholds)."""
    message: str = ""
    """One line for a human at 3 a.m."""
    rank: int | None = None
    """The rank it is about (a straggler, a rank that stalled or disagrees, a NaN on one rank's shard);
    None when it is about the whole run (every rank saw it)."""
    host: str | None = None
    """The host of ``rank`` in that segment (from ``run.json``), when known."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}; expected one of {KINDS}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}; expected one of {SEVERITIES}")

    def to_dict(self) -> dict:
        return clean_json(asdict(self))  # type: ignore[return-value]


@dataclass(frozen=True)
class SegmentInfo:
    """One (re)start of training: its step range and where a later resume abandoned it."""

    segment: int
    first_step: int
    last_step: int
    abandoned_from: int | None
    """First step of this segment's rows that a later segment replaced, or None."""

    def to_dict(self) -> dict:
        return clean_json(asdict(self))  # type: ignore[return-value]


@dataclass(frozen=True)
class Rollback:
    """What to do about the earliest finding that needs action."""

    checkpoint_step: int | None
    """Step of the checkpoint to restart from (None when no healthy checkpoint exists)."""
    checkpoint_path: str | None
    skip_batches: list[int] | None
    """[a, b]: the batches (steps) to skip after restarting, inclusive."""
    actions: list[str]
    reason: str
    evidence: dict = field(default_factory=dict)
    checkpoint_missing: bool = False
    """True when the right checkpoint was deleted by retention (or is not on disk)."""

    def to_dict(self) -> dict:
        return clean_json(asdict(self))  # type: ignore[return-value]


def fmt_value(x: float | None) -> str:
    """A measured value in a finding's message (4 significant digits); a value never seen finite says so."""
    return "not finite" if x is None or not math.isfinite(x) else f"{x:.4g}"
