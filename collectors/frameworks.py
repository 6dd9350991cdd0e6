"""What the framework callbacks (Lightning, Hugging Face) share: their Monitor's arguments, checkpoint bookkeeping,
hooks that never raise.

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

import dataclasses
import functools
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from torch import nn

from runwatch.collectors.monitor import Monitor, MonitorConfig
from runwatch.collectors.rank_signals import has_replicated_grads
from runwatch.collectors.uploader import UploaderConfig

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


class MonitorArgs:
    """What a callback's user gives for its ``Monitor``, kept until training starts (see the callbacks' docstrings).

    The root stays as given: an object-store URL (``s3://...``) must reach ``Monitor`` as one, not as a local path.
    The callback passes the gradient norm itself, so the monitor never computes a post-clip one.
    """

    def __init__(self, root: str | Path, *, run: str, activation_module: nn.Module | str | None = None,
                 config: MonitorConfig | None = None, meta: Mapping[str, Any] | None = None,
                 skip_batches: tuple[int, int] | None = None, spool: str | Path | None = None,
                 upload: UploaderConfig | None = None, replicated_grads: bool | None = None) -> None:
        self.root, self.run = root, run
        self.activation_module = activation_module
        self.config = dataclasses.replace(config or MonitorConfig(), compute_grad_norm=False)
        self.meta = dict(meta or {})
        self.skip_batches, self.replicated_grads = skip_batches, replicated_grads
        self.storage = {"spool": spool, "upload": upload}

    def make_monitor(self, model: nn.Module | None, wrapped: nn.Module | None, *, framework: str,
                     resume_step: int | None, resume_checkpoint: str | None, **kwargs: Any) -> Monitor:
        """The run's Monitor for a fit that starts (resumed from ``resume_checkpoint`` at ``resume_step``, or not);
        ``wrapped`` is the model as the framework runs it (a DDP wrapper replicates gradients)."""
        return Monitor(self.root, self.run, model=model, config=self.config, resume_step=resume_step,
                       resume_checkpoint=resume_checkpoint,
                       skip_batches=self.skip_batches if resume_step is not None else None,
                       meta={"framework": framework, **self.meta},
                       replicated_grads=has_replicated_grads(wrapped, self.replicated_grads), **self.storage, **kwargs)


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
