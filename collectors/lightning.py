"""PyTorch Lightning: ``Trainer(callbacks=[RunwatchCallback(root, run=...)])`` records the run.

One ``Monitor.step`` per optimizer step, at step = ``trainer.global_step``
after the update (the k-th update is step k, so ``ModelCheckpoint`` at
global step k is a checkpoint at step k and the next logged step is k+1):

- loss: the training step's (summed over accumulated micro-batches, which
  Lightning already divides by their number), as the device tensor;
- gradient norm: Lightning's own when ``gradient_clip_val`` clips by norm
  (what ``clip_grad_norm_`` returned), else one fused pass after unscaling;
- loss scale and skipped steps: the precision plugin's GradScaler, if any;
- activation norm: a forward hook on the final block (found by structure,
  or given), learning rate, and tokens/samples when ``training_step``
  returns them (``{"loss": loss, "tokens": n}``, n for this batch; the
  running total is kept in the callback's checkpoint state);
- checkpoints: every ``trainer.save_checkpoint`` (``ModelCheckpoint``'s too),
  with its blocking write time and size, and those ``save_top_k`` deleted
  later as notes (seen at the next save); ``fit(ckpt_path=...)`` starts a new
  segment with a resume event at the checkpoint's step.

No hook syncs the host with the device. Works with ``lightning`` and
``pytorch_lightning``: the callback subclasses the ``Callback`` of each one
installed, so either Trainer accepts it. Install: ``pip install 'runwatch[lightning]'``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runwatch.collectors.frameworks import CheckpointLedger, MonitorArgs, never_raises
from runwatch.collectors.monitor import Monitor, MonitorConfig
from runwatch.collectors.uploader import UploaderConfig
from runwatch.collectors.signals import final_layer, fused_grad_norm

_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


def _callback_bases() -> tuple[type, ...]:
    """The ``Callback`` class of each Lightning package: those already imported, else those installed."""
    names = [n for n in _PACKAGES if n in sys.modules] or [
        n for n in _PACKAGES if importlib.util.find_spec(n.split(".")[0]) is not None]
    if not names:
        raise ImportError("runwatch.collectors.lightning needs Lightning: pip install 'runwatch[lightning]'")
    return tuple(importlib.import_module(n).Callback for n in names)


class RunwatchCallback(*_callback_bases()):
    """Records a Lightning run into a runwatch store; see the module docstring.

    ``activation_module`` is the module whose output is the final layer's
    activation: a module, a dotted name inside the LightningModule
    (``"model.blocks.11"``), or None to find the last block by structure.
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
        self.tokens: int | torch.Tensor = 0
        self.samples: int | torch.Tensor = 0
        self._loss: torch.Tensor | None = None
        self._grad_norm: torch.Tensor | None = None
        self._recorded_step = 0
        self._clip_reports = False
        self._undo: list[Callable[[], None]] = []

    # -- checkpointed state: the data position survives a resume ------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "samples": self.samples}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.tokens, self.samples = state_dict.get("tokens", 0), state_dict.get("samples", 0)

    # -- hooks ------------------------------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: nn.Module) -> None:
        """Called when training begins: a new segment, with a resume event when a checkpoint was restored."""
        self._close(finished=False)  # a previous fit that ended without on_train_end
        ckpt = trainer.ckpt_path
        self.monitor = self.args.make_monitor(
            pl_module, getattr(trainer.strategy, "model", None), framework=_framework(trainer),
            resume_step=trainer.global_step if ckpt is not None else None, resume_checkpoint=ckpt,
            scaler=getattr(trainer.precision_plugin, "scaler", None),
            activation_module=self._activation_module(pl_module), precision=str(trainer.precision))
        self._recorded_step = trainer.global_step
        self._loss = self._grad_norm = None
        self._clip_reports = self._keep_clip_norm(trainer)
        self._time_saves(trainer)

    @never_raises
    def on_before_optimizer_step(self, trainer: Any, pl_module: nn.Module, optimizer: Any) -> None:
        """Called after backward and unscaling, before clipping: the fused norm, unless clipping reports one."""
        clips = (trainer.gradient_clip_val or 0) > 0 and (trainer.gradient_clip_algorithm or "norm") == "norm"
        if not (clips and self._clip_reports):
            self._grad_norm = fused_grad_norm(pl_module.parameters())

    @never_raises
    def on_train_batch_end(self, trainer: Any, pl_module: nn.Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Called after each batch; records once per optimizer step, at step = global_step."""
        if self.monitor is None:
            return
        self._take_outputs(outputs)
        if trainer.global_step == self._recorded_step:
            return  # accumulating gradients: no update yet
        self._recorded_step = trainer.global_step
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
        self.monitor.step(trainer.global_step, loss=self._loss, grad_norm=self._grad_norm, lr=lr,
                          tokens=self.tokens if _reported(self.tokens) else None,
                          samples=self.samples if _reported(self.samples) else None)
        self._loss = self._grad_norm = None

    @never_raises
    def on_train_end(self, trainer: Any, pl_module: nn.Module) -> None:
        """Called when training ends normally: the run is finished."""
        if self.monitor is not None:
            self._ledger.check(self.monitor, trainer.global_step)
        self._close(finished=True)

    @never_raises
    def on_exception(self, trainer: Any, pl_module: nn.Module, exception: BaseException) -> None:
        """Called when fit raises: keep what was recorded; the run stays live (and may turn stalled)."""
        self._close(finished=False)

    @never_raises
    def teardown(self, trainer: Any, pl_module: nn.Module, stage: str) -> None:
        """Called at the end of fit/validate/test: nothing of ours stays wrapped."""
        self._unwrap()

    # -- helpers ----------------------------------------------------------------------------

    def _activation_module(self, pl_module: nn.Module) -> nn.Module:
        given = self.args.activation_module
        if isinstance(given, str):
            return pl_module.get_submodule(given)
        return given if given is not None else final_layer(pl_module)

    def _take_outputs(self, outputs: Any) -> None:
        """Sum this batch's loss into the step's (device adds, no sync) and count its tokens and samples."""
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            loss = loss.detach()
            self._loss = loss if self._loss is None else self._loss + loss
        if isinstance(outputs, Mapping):
            self.tokens = _add(self.tokens, outputs.get("tokens"))
            self.samples = _add(self.samples, outputs.get("samples"))

    def _keep_clip_norm(self, trainer: Any) -> bool:
        """Make the precision plugin keep the norm that ``clip_grad_norm_`` returns; False if it is not Lightning's.

        Lightning's ``clip_grad_by_norm`` computes the norm and drops it;
        this does the same call and keeps the result. Plugins with their own
        clipping (FSDP, DeepSpeed) are left alone: the fused pass is used.
        """
        plugin = trainer.precision_plugin
        if getattr(type(plugin), "clip_grad_by_norm", None) is None or \
                type(plugin).clip_grad_by_norm.__qualname__ != "Precision.clip_grad_by_norm":
            return False

        def clip_grad_by_norm(optimizer: Any, clip_val: float) -> None:
            self._grad_norm = torch.nn.utils.clip_grad_norm_(plugin.main_params(optimizer), clip_val)

        plugin.clip_grad_by_norm = clip_grad_by_norm
        self._undo.append(lambda: vars(plugin).pop("clip_grad_by_norm", None))
        return True

    def _time_saves(self, trainer: Any) -> None:
        """Record every checkpoint the trainer writes, with the time the save blocked training."""
        save = trainer.save_checkpoint

        def save_checkpoint(filepath: Any, *args: Any, **kwargs: Any) -> None:
            start = time.perf_counter()
            save(filepath, *args, **kwargs)
            if self.monitor is not None:
                self._ledger.saved(self.monitor, trainer.global_step, filepath, time.perf_counter() - start)

        trainer.save_checkpoint = save_checkpoint
        self._undo.append(lambda: vars(trainer).pop("save_checkpoint", None))

    def _unwrap(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _close(self, *, finished: bool) -> None:
        if self.monitor is not None:
            self.monitor.close(finished=finished)
        self._unwrap()


def _add(total: int | torch.Tensor, count: Any) -> int | torch.Tensor:
    if isinstance(count, torch.Tensor):
        return count.detach() + total  # stays on the device
    return total + count if isinstance(count, int) else total


def _reported(count: int | torch.Tensor) -> bool:
    return isinstance(count, torch.Tensor) or count > 0


def _framework(trainer: Any) -> str:
    package = type(trainer).__module__.split(".")[0]
    return f"{package} {getattr(sys.modules.get(package), '__version__', '?')}"
