"""Where the collector's device-side signals come from, without a host sync.

- the gradient norm, when the loop did not pass one: one fused
  ``torch._foreach_norm`` pass per device, as a tensor;
- the final layer's activation norm: a forward hook, as a tensor;
- the loss scale and found-inf flag: the GradScaler's own device tensors
  (``_scale`` and the per-optimizer ``found_inf_per_device``), never
  ``get_scale()`` (which syncs).
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
    """Loss scale and found-inf of the current step from a GradScaler's device tensors.

    ``GradScaler.update()`` replaces ``_per_optimizer_states`` with a fresh,
    empty dict and updates ``_scale`` in place. So, without a sync: if the
    live dict holds ``found_inf_per_device`` entries, ``update()`` has not run
    yet for this step and the live tensors are this step's; if it is empty,
    the dict held since the previous step (filled by this step's
    ``unscale_``/``step``) is this step's, and the scale this step used is the
    snapshot taken at the previous step. Either call order in the loop works.
    The recorded ``loss_scale`` is the scale this step's backward used (the
    one that overflowed when ``found_inf`` is true); the halving shows at the
    next step.
    """

    def __init__(self, scaler: torch.amp.GradScaler) -> None:
        self.scaler = scaler
        self._held = scaler._per_optimizer_states
        self._held_consumed = False
        scale = scaler._scale
        # Before the first scaled backward _scale is None and the first step uses _init_scale.
        self._snapshot: torch.Tensor | float = scale.detach().clone() if scale is not None else float(scaler._init_scale)

    @property
    def enabled(self) -> bool:
        return bool(self.scaler.is_enabled())

    def read(self) -> tuple[torch.Tensor | float | None, torch.Tensor | None]:
        """(loss scale, number of devices that found an inf) for the step just taken."""
        if not self.enabled:
            return None, None
        live = self.scaler._per_optimizer_states
        scale = self.scaler._scale
        current = scale.detach().clone() if scale is not None else None
        if _found_infs(live):
            found, used_scale = _found_infs(live), current
            self._held_consumed = True
        else:
            fresh = self._held is not live and not self._held_consumed
            found, used_scale = (_found_infs(self._held) if fresh else []), self._snapshot
            self._held_consumed = False
        self._held = live
        if current is not None:
            self._snapshot = current  # the scale the next step uses when update() ran before us
        found_inf = None
        if found:
            first = found[0]
            found_inf = first.to(torch.float32) if len(found) == 1 else torch.stack(
                [t.to(first.device, torch.float32) for t in found]).sum()
        return used_scale, found_inf


def _found_infs(states: dict) -> list[torch.Tensor]:
    return [t for s in states.values() for t in s.get("found_inf_per_device", {}).values()]
