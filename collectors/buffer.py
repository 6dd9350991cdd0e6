"""The collector's device-side step buffer: per-step tensors stay on the device until a flush.

A preallocated (capacity, num_columns) tensor on the training device holds
one row per step. ``put`` writes all of a step's tensors into their row with
one fused ``torch._foreach_copy_`` (one device operation, whatever the number
of fields; values are cast to the buffer's dtype on the device). Nothing
leaves the device. ``drain`` starts one non-blocking copy of the filled rows
to (pinned, on CUDA) host memory and records an event the writer thread
waits on, so the training thread never waits for the device.

A *lagged* column holds, in some rows, a value read one step late: the
GradScaler's scale read after ``update()`` is the scale of the next step, so
that row's recorded value is the previous row's raw value. ``drain`` shifts
those rows on the device (a few operations per flush, none per step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import torch

_INITIAL_COLUMNS = 8


@dataclass(frozen=True, eq=False)
class RowLayout:
    """Where one kind of step's tensors go: column indices, and the cell picker for a row."""

    names: tuple[str, ...]
    columns: np.ndarray  # (k,) int: the column of each name
    pick: Callable[[Sequence[torch.Tensor]], tuple[torch.Tensor, ...]]  # a row's cells -> the k target cells
    lagged: int | None  # the column whose value in these rows belongs to the previous row, if any


def picker(indices: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """``seq -> tuple(seq[i] for i in indices)`` at C speed (``itemgetter`` returns a bare item for one index)."""
    if not indices:
        return lambda seq: ()
    if len(indices) == 1:
        (i,) = indices
        return lambda seq: (seq[i],)
    return itemgetter(*indices)


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
        self._layouts: dict[tuple[tuple[str, ...], str | None], RowLayout] = {}
        self._rows: list[RowLayout] = []  # the layout of each filled row
        self._carry: dict[int, torch.Tensor | float] = {}  # lagged column -> raw value of the row before row 0
        self._allocate(_INITIAL_COLUMNS)

    @property
    def num_rows(self) -> int:
        return len(self._rows)

    @property
    def full(self) -> bool:
        return len(self._rows) >= self.capacity

    def _allocate(self, width: int) -> None:
        values = torch.empty((self.capacity, width), dtype=self.dtype, device=self.device)
        if hasattr(self, "_values"):  # widening (a new tensor-valued extra): a device-side copy, no sync
            values[:, : self._values.shape[1]].copy_(self._values)
        self._values = values
        # One 0-dim view per cell, made here once: a step picks its cells instead of
        # indexing the tensor (each index would be a dispatched op on the training thread).
        self._cells = [row.unbind(0) for row in values.unbind(0)]

    def layout(self, names: tuple[str, ...], lagged: str | None = None) -> RowLayout:
        """The layout of a row holding ``names`` (in that order); ``lagged`` names a lagged column."""
        key = (names, lagged)
        found = self._layouts.get(key)
        if found is not None:
            return found
        for name in names:
            if name not in self.columns:
                self.columns[name] = len(self.columns)
        if len(self.columns) > self._values.shape[1]:
            self._allocate(2 * len(self.columns))
        columns = [self.columns[n] for n in names]
        made = RowLayout(names, np.array(columns, dtype=np.intp), picker(columns),
                         None if lagged is None else self.columns[lagged])
        self._layouts[key] = made
        return made

    def put(self, layout: RowLayout, tensors: Sequence[torch.Tensor], lag_start: torch.Tensor | float | None = None,
            ) -> None:
        """Append one row: ``tensors[i]`` is the value of ``layout.names[i]``, a 1-element tensor.

        One fused copy for the whole row, enqueued on the device; no sync.
        ``lag_start`` is the value before the first row of a lagged column
        (used once, by the first row that lags).
        """
        row = len(self._rows)
        if row >= self.capacity:
            raise RuntimeError("StepBuffer.put on a full buffer; drain it first")
        if tensors:
            grad = torch.is_grad_enabled()
            # Copies into the buffer must never join the autograd graph (a loss that still
            # requires grad would chain every step's graph to the buffer).
            torch._C._set_grad_enabled(False)
            try:
                # non_blocking: a host-side value goes up without waiting; device values are device copies.
                torch._foreach_copy_(layout.pick(self._cells[row]), tensors, non_blocking=True)
            finally:
                torch._C._set_grad_enabled(grad)
        if layout.lagged is not None and lag_start is not None:
            self._carry.setdefault(layout.lagged, lag_start)
        self._rows.append(layout)

    def drain(self) -> tuple[list[str], torch.Tensor | None, np.ndarray | None, Any]:
        """Hand the filled rows over: (column names, host tensor, present mask, ready event).

        The device-to-host copy is non-blocking on CUDA; the returned event is
        recorded after it, and later ``put``s on the same stream are ordered
        after the copy, so the rows can be overwritten at once.
        """
        rows, self._rows = self._rows, []
        n, num_cols = len(rows), len(self.columns)
        if n == 0 or num_cols == 0:
            return [], None, None, None
        present = np.zeros((n, num_cols), dtype=bool)
        lag_runs: list[tuple[int, int, int]] = []
        for start, stop, layout in _runs(rows):
            present[start:stop, layout.columns] = True
            if layout.lagged is not None:
                lag_runs.append((start, stop, layout.lagged))
        with torch.no_grad():
            self._resolve_lags(n, lag_runs)
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
        return names, host, present, event

    def _resolve_lags(self, n: int, lag_runs: list[tuple[int, int, int]]) -> None:
        """Rows of a lagged column take the raw value of the row before (device ops, once per flush)."""
        for j, start_value in list(self._carry.items()):
            column = self._values[:n, j]
            last_raw = column[n - 1 :].clone()  # the row before the next flush's first row
            runs = [(a, b) for a, b, col in lag_runs if col == j]
            if runs:
                before = start_value if isinstance(start_value, torch.Tensor) else torch.full(
                    (1,), start_value, dtype=self.dtype, device=self.device)
                shifted = torch.cat([before.reshape(1).to(self.dtype), column[: n - 1]])
                for a, b in runs:
                    column[a:b].copy_(shifted[a:b])
            self._carry[j] = last_raw


def _runs(rows: list[RowLayout]) -> list[tuple[int, int, RowLayout]]:
    """Maximal runs of consecutive rows sharing a layout: (start, stop, layout)."""
    runs: list[tuple[int, int, RowLayout]] = []
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i] is not rows[start]:
            runs.append((start, i, rows[start]))
            start = i
    return runs
