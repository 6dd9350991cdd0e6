"""The checkpoint advice of one run: measured figures, the cadence they imply and the retention ladder.

Pure: ``Measured`` (from ``measure``), the run's findings, segments and
rollback advice in; a ``CheckpointAdvice`` out, whose ``to_dict`` is the JSON
of ``runwatch advise --json``. Every figure the record cannot give is null.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from runwatch.detectors.finding import Finding, Rollback, clean_json
from runwatch.economics.cadence import daly_interval, young_interval
from runwatch.economics.measure import Cols, Measured
from runwatch.economics.retention import Ladder, depths, ladder


@dataclass(frozen=True)
class CheckpointAdvice:
    """Cost, interruptions, lost work, cadence and retention of one run (seconds inside, hours/minutes out)."""

    measured: Measured
    mtbf_seconds: float | None
    """``--mtbf-hours`` when given, else wall time over interruptions, else None."""
    mtbf_given: bool
    young_seconds: float | None
    daly_seconds: float | None
    retention: Ladder

    def to_dict(self) -> dict:
        """The ``runwatch advise --json`` object: strict JSON, null where the record cannot give a figure."""
        m = self.measured
        out = {
            "checkpoint_seconds": m.checkpoint_seconds,
            "checkpoint_bytes": m.checkpoint_bytes,
            "mtbf_hours": _per(self.mtbf_seconds, 3600.0),
            "interruptions": m.interruptions,
            "lost_steps": m.lost_steps,
            "lost_hours": _per(m.lost_seconds, 3600.0),
            "goodput": m.goodput,
            "cadence": {"young_minutes": _per(self.young_seconds, 60.0),
                        "daly_minutes": _per(self.daly_seconds, 60.0),
                        "current_minutes": _per(m.current_seconds, 60.0)},
            "retention": {"keep_last": self.retention.keep_last, "every_nth": self.retention.every_nth,
                          "milestones": self.retention.milestones, "reason": self.retention.reason},
        }
        json.dumps(out, allow_nan=False)  # fail here, not in a consumer
        return clean_json(out)  # type: ignore[return-value]


def _per(value: float | None, unit: float) -> float | None:
    return None if value is None else value / unit


def advise_checkpoints(measured: Measured, segments: dict[int, Cols], findings: list[Finding],
                       rollback: Rollback | None = None, *, mtbf_hours: float | None = None) -> CheckpointAdvice:
    """Young's and Daly's intervals from the measured cost and MTBF (or the given one), and the ladder."""
    if mtbf_hours is not None and not mtbf_hours > 0:
        raise ValueError(f"--mtbf-hours must be > 0, got {mtbf_hours}")
    mtbf = mtbf_hours * 3600.0 if mtbf_hours is not None else measured.mtbf_seconds
    delta = measured.checkpoint_seconds
    # A checkpoint measured at 0 s (a tiny model on a fast disk) has no optimum interval: checkpoint always.
    known = mtbf is not None and delta is not None and delta > 0
    # The main line ends where the newest segment is: every older one is cut before that segment starts.
    newest = max((k for k, c in segments.items() if len(c["step"])), default=None)
    main_last = int(segments[newest]["step"][-1]) if newest is not None else 0
    return CheckpointAdvice(
        measured=measured, mtbf_seconds=mtbf, mtbf_given=mtbf_hours is not None,
        young_seconds=young_interval(delta, mtbf) if known else None,
        daly_seconds=daly_interval(delta, mtbf) if known else None,
        retention=ladder(depths(findings, segments, rollback), measured.interval_steps, measured.checkpoints,
                         findings, main_last, rollback))
