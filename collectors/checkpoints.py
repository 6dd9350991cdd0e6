"""Checkpoint bookkeeping shared by the framework callbacks (Lightning, Hugging Face).

Frameworks save checkpoints and delete old ones under their retention rules
(``save_top_k``, ``save_total_limit``). The rollback advisor must never point
at a deleted checkpoint, so each save is recorded as a ``checkpoint`` event
and each checkpoint found gone afterwards as a ``note`` with ``deleted=True``
(the README's convention for retention).
"""

from __future__ import annotations

import os
from pathlib import Path

from runwatch.collectors.monitor import Monitor


class CheckpointLedger:
    """The checkpoints a run saved and still has; each deletion is reported once."""

    def __init__(self) -> None:
        self._kept: dict[str, int] = {}  # path -> step

    def saved(self, monitor: Monitor, step: int, path: str | Path, write_seconds: float | None) -> None:
        """Record a completed save (size measured from ``path``), then any earlier checkpoint since deleted."""
        monitor.checkpoint(step, path, write_seconds=write_seconds)
        self.check(monitor, step)
        self._kept[str(path)] = step

    def check(self, monitor: Monitor, step: int) -> None:
        """Record a ``note`` (``deleted=True``) for each kept checkpoint that is gone from disk."""
        for path in [p for p in self._kept if not os.path.exists(p)]:
            monitor.event("note", step, path=path, deleted=True, checkpoint_step=self._kept.pop(path))
