"""What the framework callbacks (Lightning, Hugging Face) share: checkpoint bookkeeping, hooks that never raise.

Frameworks save checkpoints and delete old ones under their retention rules
(``save_top_k``, ``save_total_limit``). The rollback advisor must never point
at a deleted checkpoint, so each save is recorded as a ``checkpoint`` event
and each checkpoint found gone afterwards as a ``note`` with ``deleted=True``
(the README's convention for retention).

A callback hook runs inside the training loop, so, like ``Monitor.step``, it
must never raise into it: ``never_raises`` turns a failure into the
monitor's one warning and count.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from runwatch.collectors.monitor import Monitor

Hook = TypeVar("Hook", bound=Callable[..., Any])


def never_raises(hook: Hook) -> Hook:
    """Wrap a callback hook (a method of an object with ``.monitor``): failures are counted, not raised."""

    @functools.wraps(hook)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return hook(self, *args, **kwargs)
        except Exception as err:  # the observer never kills the patient
            what = f"{type(self).__name__}.{hook.__name__}"
            if self.monitor is not None:
                self.monitor._fail(what, err)
            else:
                warnings.warn(f"runwatch: {what} failed: {type(err).__name__}: {err} (training continues)",
                              RuntimeWarning, stacklevel=2)
            return None

    return guarded  # type: ignore[return-value]


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
