"""Hugging Face Transformers: ``Trainer(callbacks=[RunwatchTrainerCallback(root, run=...)])`` records the run.

One ``Monitor.step`` per optimizer step at step = ``state.global_step`` (the
k-th update is step k, and ``checkpoint-k`` is a checkpoint at step k):

- loss: the Trainer's own per-step loss (what ``training_step`` returned,
  summed over accumulated micro-batches: what the Trainer adds to its
  running loss, before its NaN filter), as the device tensor;
- gradient norm: the Trainer's own (what ``accelerator.clip_grad_norm_``
  returned: pre-clip with ``max_grad_norm``, else the plain norm);
- loss scale and skipped steps: the accelerator's GradScaler. Only fp16 on
  CUDA has one; on the CPU ``fp16=True`` trains without a scaler, so there
  is no loss scale to record;
- activation norm (a forward hook on the final block, found by structure or
  given), the learning rate of the update, and ``num_input_tokens_seen`` as
  tokens when ``include_num_input_tokens_seen`` is on (the Trainer's count
  costs a sync of its own per step; runwatch adds none);
- checkpoints at ``on_save`` with their size and blocking write time (from
  the last Trainer event before the save), checkpoints deleted by
  ``save_total_limit`` as notes, and ``train(resume_from_checkpoint=...)`` as
  a new segment with a resume event at the checkpoint's step.

``TrainerCallback`` hooks are not handed the Trainer, and its loss and
gradient norm are locals of its loop; so at ``on_train_begin`` the callback
finds the Trainer that is calling it up the call stack and keeps the values
its ``training_step`` and its accelerator's ``clip_grad_norm_`` return
(instance wrappers, removed at ``on_train_end``). Install:
``pip install 'runwatch[hf]'``.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

try:
    import transformers
    from transformers import Trainer, TrainerCallback
except ImportError as err:
    raise ImportError("runwatch.collectors.hf needs transformers: pip install 'runwatch[hf]'") from err

from runwatch.collectors.frameworks import CheckpointLedger, MonitorArgs, never_raises
from runwatch.collectors.monitor import Monitor, MonitorConfig
from runwatch.collectors.uploader import UploaderConfig
from runwatch.collectors.signals import final_layer

_CHECKPOINT_PREFIX = "checkpoint"  # the Trainer's checkpoint-<global_step> folders


class RunwatchTrainerCallback(TrainerCallback):
    """Records a Hugging Face Trainer run into a runwatch store; see the module docstring.

    ``activation_module`` is the module whose output is the final layer's
    activation: a module, a dotted name inside the model
    (``"transformer.h.11"``), or None to find the last block by structure.
    ``config``, ``meta``, ``spool``, ``upload`` and ``replicated_grads`` go to ``Monitor`` (a root may be an
    object-store URL, as there); ``skip_batches`` is the range a resumed fit skips, recorded with its resume
    event. Data-parallel replicas (plain DDP) are recognised from the wrapped model.
    """

    def __init__(self, root: str | Path, *, run: str, activation_module: nn.Module | str | None = None,
                 config: MonitorConfig | None = None, meta: Mapping[str, Any] | None = None,
                 skip_batches: tuple[int, int] | None = None, spool: str | Path | None = None,
                 upload: UploaderConfig | None = None, replicated_grads: bool | None = None) -> None:
        self.args = MonitorArgs(root, run=run, activation_module=activation_module, config=config, meta=meta,
                                skip_batches=skip_batches, spool=spool, upload=upload, replicated_grads=replicated_grads)
        self.monitor: Monitor | None = None
        self._ledger = CheckpointLedger()
        self._loss: torch.Tensor | None = None
        self._grad_norm: torch.Tensor | float | None = None
        self._lr: float | torch.Tensor | None = None
        self._last_event = time.perf_counter()
        self._undo: list[Callable[[], None]] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, model: nn.Module | None = None,
                       **kwargs: Any) -> None:
        """Called when training begins: a new segment, with a resume event when a checkpoint was restored."""
        self._close(finished=False)
        trainer, resumed_from = _calling_trainer(self)
        if trainer is None:
            warnings.warn("runwatch: the Trainer calling RunwatchTrainerCallback was not found; its loss and "
                          "gradient norm are not recorded", RuntimeWarning, stacklevel=2)
        else:
            self._keep_values(trainer)
        scaler = getattr(trainer.accelerator, "scaler", None) if trainer is not None else None
        self.monitor = self.args.make_monitor(
            model, getattr(trainer, "model_wrapped", None), framework=f"transformers {transformers.__version__}",
            resume_step=state.global_step if state.global_step > 0 else None, resume_checkpoint=resumed_from,
            scaler=scaler, activation_module=self._activation_module(model), precision=_precision(args))
        self._loss = self._grad_norm = self._lr = None
        self._last_event = time.perf_counter()

    @never_raises
    def on_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        """Called after the optimizer step, before the scheduler's: the learning rate this update used."""
        if optimizer is not None:
            self._lr = optimizer.param_groups[0]["lr"]

    @never_raises
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Called after each optimizer step, global_step already counting it: one row at that step."""
        if self.monitor is not None:
            counting = args.include_num_input_tokens_seen not in ("no", False)
            self.monitor.step(state.global_step, loss=self._loss, grad_norm=self._grad_norm, lr=self._lr,
                              tokens=state.num_input_tokens_seen if counting else None)
        self._loss = self._grad_norm = None
        self._last_event = time.perf_counter()

    @never_raises
    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Called after logging: a save that follows starts after it."""
        self._last_event = time.perf_counter()

    @never_raises
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Called after an evaluation: a save that follows starts after it."""
        self._last_event = time.perf_counter()

    @never_raises
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Called after a checkpoint save: checkpoint-<global_step> holds global_step updates."""
        if self.monitor is not None:
            # Absolute: the dashboard and the CLI check the file from their own working directory.
            path = Path(args.output_dir).absolute() / f"{_CHECKPOINT_PREFIX}-{state.global_step}"
            self._ledger.saved(self.monitor, state.global_step, path, time.perf_counter() - self._last_event)
        self._last_event = time.perf_counter()

    @never_raises
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Called when training ends normally: the run is finished."""
        if self.monitor is not None:
            self._ledger.check(self.monitor, state.global_step)
        self._close(finished=True)

    # -- helpers ----------------------------------------------------------------------------

    def _activation_module(self, model: nn.Module | None) -> nn.Module | None:
        given = self.args.activation_module
        if isinstance(given, str):
            return model.get_submodule(given) if model is not None else None
        if given is not None or model is None:
            return given
        return final_layer(model)

    def _keep_values(self, trainer: Trainer) -> None:
        """Keep what the Trainer's ``training_step`` and ``accelerator.clip_grad_norm_`` return (no sync)."""
        training_step = trainer.training_step
        clip_grad_norm_ = trainer.accelerator.clip_grad_norm_

        def kept_training_step(*args: Any, **kwargs: Any) -> torch.Tensor:
            loss = training_step(*args, **kwargs)
            self._keep_loss(loss)
            return loss

        def kept_clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
            self._grad_norm = clip_grad_norm_(*args, **kwargs)
            return self._grad_norm

        trainer.training_step = kept_training_step
        trainer.accelerator.clip_grad_norm_ = kept_clip_grad_norm_
        self._undo.append(lambda: vars(trainer).pop("training_step", None))
        self._undo.append(lambda: vars(trainer.accelerator).pop("clip_grad_norm_", None))

    @never_raises
    def _keep_loss(self, loss: Any) -> None:
        if isinstance(loss, torch.Tensor):  # summed over micro-batches on the device, as the Trainer does
            self._loss = loss if self._loss is None else self._loss + loss

    def _close(self, *, finished: bool) -> None:
        if self.monitor is not None:
            self.monitor.close(finished=finished)
        while self._undo:
            self._undo.pop()()


def _calling_trainer(callback: TrainerCallback) -> tuple[Trainer | None, str | None]:
    """The Trainer whose callback handler calls ``callback``, and the checkpoint its loop resumes from.

    ``on_train_begin`` is called from the Trainer's training loop, whose
    frame holds the Trainer (``self``) and the resolved
    ``resume_from_checkpoint``; the callback's own presence in that
    Trainer's handler makes the match certain.
    """
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer) and callback in owner.callback_handler.callbacks:
            resumed = frame.f_locals.get("resume_from_checkpoint")
            return owner, str(Path(resumed).absolute()) if isinstance(resumed, (str, Path)) else None
        frame = frame.f_back
    return None, None


def _precision(args: Any) -> str | None:
    if getattr(args, "fp16", False):
        return "fp16-mixed"
    if getattr(args, "bf16", False):
        return "bf16-mixed"
    return None
