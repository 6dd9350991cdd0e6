"""Where the collector's device-side signals come from, without a host sync.

- the gradient norm, when the loop did not pass one: one fused
  ``torch._foreach_norm`` pass per device, as a tensor;
- the final layer's activation norm: a forward hook, as a tensor;
- the loss scale and found-inf flag: the GradScaler's own device tensors
  (``_scale`` and the per-optimizer ``found_inf_per_device``), never
  ``get_scale()`` (which syncs), all read in ``ScalerReader``;
- which module is the final layer, when the caller does not say.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import nn


def fused_grad_norm(params: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """L2 norm over all gradients as a 0-dim tensor (None without gradients); no sync.

    Like ``clip_grad_norm_``: ``_foreach_norm`` grouped per device and dtype,
    then the norm of the per-tensor norms. Non-finite gradients give a
    non-finite norm, which is recorded as it is.
    """
    grads = [p.grad for p in params if p.grad is not None and not p.grad.is_sparse]
    if not grads:
        return None
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault((g.device, g.dtype), []).append(g)
    first_device = grads[0].device
    norms = []
    for group in groups.values():
        norms.extend(n.to(first_device, torch.float32) for n in torch._foreach_norm(group, 2.0))
    return torch.linalg.vector_norm(torch.stack(norms), 2.0)


def activation_rms(output: object) -> torch.Tensor | None:
    """RMS of a module output, sqrt(mean(x**2)) over all elements, as a float32 tensor.

    RMS rather than the plain L2 norm so the value does not grow with batch
    size, sequence length or width: runs of different shapes compare. For a
    tuple or list output the first tensor is used (the hidden states).
    """
    if isinstance(output, (tuple, list)):
        output = next((t for t in output if isinstance(t, torch.Tensor)), None)
    if not isinstance(output, torch.Tensor) or output.numel() == 0:
        return None
    with torch.no_grad():
        norm = torch.linalg.vector_norm(output.detach(), 2.0, dtype=torch.float32)
        return norm / math.sqrt(output.numel())


def final_layer(model: nn.Module) -> nn.Module:
    """The module whose output is the final layer's activation, found by structure.

    The last block of the model's shallowest stack of blocks (an
    ``nn.ModuleList``, else an ``nn.Sequential``): ``blocks[-1]``,
    ``transformer.h[-1]``, ``model.layers[-1]``. Shallowest, so that lists
    inside a block (experts, heads) are not taken for the stack. Without one,
    the last module that holds parameters.
    """
    for kind in (nn.ModuleList, nn.Sequential):
        stacks = [(name.count("."), i, m) for i, (name, m) in enumerate(model.named_modules())
                  if isinstance(m, kind) and len(m) > 0]
        if stacks:
            _, _, stack = min(stacks, key=lambda s: (s[0], -s[1]))
            return stack[-1]
    leaves = [m for m in model.modules() if next(m.parameters(recurse=False), None) is not None]
    return leaves[-1] if leaves else model


def register_activation_hook(
    module: nn.Module, sink: Callable[[torch.Tensor], None], on_error: Callable[[Exception], None]
) -> torch.utils.hooks.RemovableHandle:
    """Forward hook on ``module`` passing the RMS of its output to ``sink``.

    Only forwards in training mode count, so an evaluation pass between steps
    does not overwrite the training value. With gradient accumulation the
    last micro-batch's value wins.
    """

    def hook(mod: nn.Module, inputs: object, output: object) -> None:
        try:
            if mod.training:
                rms = activation_rms(output)
                if rms is not None:
                    sink(rms)
        except Exception as err:  # the observer never kills the patient
            on_error(err)

    return module.register_forward_hook(hook)


class ScalerReader:
    """The one place that reads a GradScaler: this step's loss scale and found-inf, and its settings.

    Never ``get_scale()`` (a sync): the scaler's own device tensors, put in
    the step's row as they are (no copy here; the buffer's one copy per row
    takes their value in stream order).

    ``GradScaler.update()`` replaces ``_per_optimizer_states`` with a fresh,
    empty dict and updates ``_scale`` in place. So, without a sync: if the
    live dict holds ``found_inf_per_device`` entries, ``update()`` has not run
    yet for this step and the live tensors are this step's. If it is empty,
    the dict held since the previous step (filled by this step's
    ``unscale_``/``step``) is this step's, and the live ``_scale`` is already
    the *next* step's: the row records it raw and is marked lagged, and the
    buffer gives the row the previous row's raw value (the scale this step
    used). Either call order in the loop works, as long as it stays the same.
    The recorded ``loss_scale`` is the scale this step's backward used (the
    one that overflowed when ``found_inf`` is true); a halving shows at the
    next step.
    """

    def __init__(self, scaler: torch.amp.GradScaler) -> None:
        self.scaler = scaler
        self._held = scaler._per_optimizer_states
        self._held_consumed = False
        scale = scaler._scale
        # Made mid-run: the scale before our first step is the live one (one device copy, once).
        # Otherwise it is _init_scale, read at the step (a load_state_dict may change it before).
        self._start: torch.Tensor | None = scale.detach().clone() if scale is not None else None

    @property
    def enabled(self) -> bool:
        return bool(self.scaler.is_enabled())

    def settings(self) -> dict[str, float | int]:
        """init_scale, growth_factor, backoff_factor, growth_interval: plain Python numbers, no sync."""
        s = self.scaler
        return {"init_scale": float(s._init_scale), "growth_factor": float(s.get_growth_factor()),
                "backoff_factor": float(s.get_backoff_factor()), "growth_interval": int(s.get_growth_interval())}

    def read(self) -> tuple[torch.Tensor | float | None, torch.Tensor | None, torch.Tensor | float | None]:
        """(loss scale, devices that found an inf, lag start) for the step just taken.

        ``lag start`` is None when the loss scale is the one this step used;
        otherwise the loss scale is the next step's (see the class docstring)
        and ``lag start`` is the scale before the first step.
        """
        if not self.scaler.is_enabled():
            return None, None, None
        live = self.scaler._per_optimizer_states
        found = _found_infs(live)
        lag_start: torch.Tensor | float | None = None
        if found:
            self._held_consumed = True
        else:
            fresh = self._held is not live and not self._held_consumed
            found = _found_infs(self._held) if fresh else []
            self._held_consumed = False
            lag_start = self._start if self._start is not None else float(self.scaler._init_scale)
        self._held = live
        scale = self.scaler._scale
        if scale is None:  # no scaled backward yet: the first one will use _init_scale
            return float(self.scaler._init_scale), _count(found), None
        return scale, _count(found), lag_start


def _found_infs(states: dict) -> list[torch.Tensor]:
    return [t for s in states.values() for t in s.get("found_inf_per_device", {}).values()]


def _count(found: list[torch.Tensor]) -> torch.Tensor | None:
    """Devices that found an inf, as one tensor: the scaler's own for one device (no op), else a sum."""
    if not found:
        return None
    if len(found) == 1:
        return found[0]
    return torch.stack([t.to(found[0].device, torch.float32) for t in found]).sum()
