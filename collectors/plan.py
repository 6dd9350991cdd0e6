"""What one kind of ``Monitor.step`` records, decided once instead of per field per step.

A step's values (loss, grad norm, ..., extras) are tensors (recorded on the
device), numbers (recorded on the host), absent or bad. Which is which
depends only on their types and names, so ``Monitor`` makes one
``StepPlan`` per kind of step and then handles every later step of that
kind with two C-level ``itemgetter`` calls and one fused device copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from runwatch.collectors.buffer import RowLayout, picker
from runwatch.data.record import METRIC_COLUMNS, is_valid_extra_name

_HOST_SCALARS = (bool, int, float, np.integer, np.floating)
_RECORD_FIELDS = frozenset(METRIC_COLUMNS) - {"step", "time"}

FIELD_NAMES = ("loss", "grad_norm", "lr", "tokens", "samples", "act_norm", "loss_scale", "found_inf")


@dataclass(eq=False)
class StepPlan:
    """What one kind of step records: which values are tensors (device), numbers (host) or bad.

    Made once per kind of step (the types of the values and the extra
    names); a step then picks its tensors and numbers with two ``itemgetter``
    calls. A later value under the same name replaces an earlier one (a
    passed ``act_norm`` beats the hook's).
    """

    device_names: tuple[str, ...]
    pick_device: Callable[[tuple], tuple]
    host_names: tuple[str, ...]
    pick_host: Callable[[tuple], tuple]
    errors: tuple[Exception, ...]
    lagged: str | None
    layout: RowLayout | None = None  # where these tensors go in the monitor's buffer, once it exists

    @classmethod
    def make(cls, names: tuple[str, ...], types: tuple[type, ...], lagged: str | None) -> "StepPlan":
        last = {name: i for i, name in enumerate(names)}
        device, host, errors = [], [], []
        for i, (name, kind) in enumerate(zip(names, types)):
            if kind is type(None) or last[name] != i:
                continue
            if name not in _RECORD_FIELDS and not is_valid_extra_name(name):
                errors.append(ValueError(f"{name!r} is not a valid extra scalar name"))
            elif issubclass(kind, torch.Tensor):
                device.append(i)
            elif issubclass(kind, _HOST_SCALARS):
                host.append(i)
            else:
                errors.append(TypeError(f"{name}: expected a number or a tensor, got {kind.__name__}"))
        # Only the scaler's own reading lags, not a value passed under the same name.
        lags = lagged is not None and last.get(lagged) == FIELD_NAMES.index(lagged) and last[lagged] in device
        return cls(tuple(names[i] for i in device), picker(device), tuple(names[i] for i in host), picker(host),
                   tuple(errors), lagged if lags else None)
