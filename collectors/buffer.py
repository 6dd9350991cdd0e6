"""The collector's device-side step buffer: per-step tensors stay on the device until a flush.

Each ``put`` copies 0-dim tensors into one row of a preallocated
(capacity, num_columns) tensor on the training device; nothing leaves the
device. ``drain`` starts one non-blocking copy of the filled rows to (pinned,
on CUDA) host memory and records an event the writer thread waits on, so the
training thread never waits for the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_INITIAL_COLUMNS = 8


class StepBuffer:
    """Rows of device values, one column per tensor-valued field name."""

    def __init__(self, device: torch.device, capacity: int, *, pin_memory: bool = True) -> None:
        self.device = device
        self.capacity = capacity
        # float64 keeps a float32 loss exact and integer counts exact up to 2**53;
        # MPS has no float64.
        self.dtype = torch.float32 if device.type == "mps" else torch.float64
        self.pin_memory = pin_memory and device.type == "cuda"
        self.columns: dict[str, int] = {}
        self._values = torch.empty((capacity, _INITIAL_COLUMNS), dtype=self.dtype, device=device)
        self._present = np.zeros((capacity, _INITIAL_COLUMNS), dtype=bool)
        self.num_rows = 0

    @property
    def full(self) -> bool:
        return self.num_rows >= self.capacity

    def _column(self, name: str) -> int:
        j = self.columns.get(name)
        if j is None:
            j = len(self.columns)
            if j >= self._values.shape[1]:
                # Rare (a new tensor-valued extra): widen; a device-side copy, no sync.
                wider = torch.empty((self.capacity, 2 * j), dtype=self.dtype, device=self.device)
                wider[:, :j].copy_(self._values)
                self._values = wider
                self._present = np.concatenate([self._present, np.zeros_like(self._present)], axis=1)
            self.columns[name] = j
        return j

    def put(self, values: dict[str, torch.Tensor]) -> None:
        """Append one row; each value is a 1-element tensor, copied (and cast) on its device."""
        if self.full:
            raise RuntimeError("StepBuffer.put on a full buffer; drain it first")
        row = self.num_rows
        self._present[row] = False
        for name, value in values.items():
            j = self._column(name)
            # copy_ casts; a host value goes up without blocking. Only a value on another
            # device than the buffer's (a misuse) would make this a blocking copy.
            non_blocking = value.device.type == "cpu"
            self._values[row, j].copy_(value.detach().reshape(()), non_blocking=non_blocking)
            self._present[row, j] = True
        self.num_rows += 1

    def drain(self) -> tuple[list[str], torch.Tensor | None, np.ndarray | None, Any]:
        """Hand the filled rows over: (column names, host tensor, present mask, ready event).

        The device-to-host copy is non-blocking on CUDA; the returned event is
        recorded after it, and later ``put``s on the same stream are ordered
        after the copy, so the rows can be overwritten at once.
        """
        n, num_cols = self.num_rows, len(self.columns)
        self.num_rows = 0
        if n == 0 or num_cols == 0:
            return [], None, None, None
        names = sorted(self.columns, key=self.columns.__getitem__)
        host = torch.empty((n, num_cols), dtype=self.dtype, pin_memory=self.pin_memory)
        event = None
        if self.device.type == "cuda":
            host.copy_(self._values[:n, :num_cols], non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            # CPU: a plain copy. Other accelerators: a synchronous copy once per flush.
            host.copy_(self._values[:n, :num_cols])
        return names, host, self._present[:n, :num_cols].copy(), event
