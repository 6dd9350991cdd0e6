"""The collector's background writer: flushed batches in, Parquet and JSONL files out.

``Monitor`` hands over one ``MetricsBatch`` per flush (host values already
copied off the device, or being copied, with an event to wait on), events and
run metadata, in order, through a queue bounded in metric batches. One daemon thread turns each
item into an Arrow table and writes it through ``runwatch.data.storage``
(temporary name, then rename). A failed item is counted and warned about once,
and the thread keeps going: the observer never kills the patient.
"""

from __future__ import annotations

import threading
import warnings
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from runwatch.data.record import METRIC_FIELDS, conform_metrics
from runwatch.data.storage import (
    StagedWrite,
    events_jsonl,
    part_name,
    partition_dir,
    write_bytes_atomic,
    write_parquet_atomic,
)

_RECORD_TYPES: dict[str, pa.DataType] = {f.name: f.type for f in METRIC_FIELDS}


@dataclass
class MetricsBatch:
    """The rows of one flush: host-side values plus a host copy of the device buffer.

    ``device_values`` is an (n, num_columns) float tensor on the CPU (pinned
    when it came from CUDA); ``ready`` is the CUDA event recorded after the
    non-blocking copy into it, or None when the copy already completed.
    ``present`` marks which device columns each row actually set.
    """

    run: str
    segment: int
    rank: int
    host_rows: list[dict[str, Any]]
    device_columns: list[str] = field(default_factory=list)
    device_values: Any = None  # torch.Tensor (n, num_columns), or None without device values
    present: np.ndarray | None = None  # (n, num_columns) bool
    ready: Any = None  # torch.cuda.Event | None

    @property
    def num_rows(self) -> int:
        return len(self.host_rows)


@dataclass
class EventsBatch:
    """Events of one partition, written as one JSONL part."""

    run: str
    segment: int
    rank: int
    events: list[dict[str, Any]]


@dataclass
class RunMetaUpdate:
    """Keys merged into the run's ``run.json``."""

    run: str
    meta: dict[str, Any]


WriterItem = MetricsBatch | EventsBatch | RunMetaUpdate


def _host_column(rows: list[dict[str, Any]], name: str) -> tuple[np.ndarray, np.ndarray]:
    values = np.full(len(rows), np.nan, dtype=np.float64)
    valid = np.zeros(len(rows), dtype=bool)
    for i, row in enumerate(rows):
        v = row.get(name)
        if v is not None:
            values[i], valid[i] = float(v), True
    return values, valid


def batch_table(batch: MetricsBatch) -> pa.Table:
    """The Arrow table of one flush, in the record's schema (extras as float64)."""
    rows = batch.host_rows
    names: list[str] = []
    for row in rows:
        names.extend(k for k in row if k not in names)
    names.extend(c for c in batch.device_columns if c not in names)
    device = batch.device_values.numpy() if batch.device_values is not None else None
    arrays, fields = [], []
    for name in names:
        if name == "step":
            arr = pa.array([int(r["step"]) for r in rows], pa.int64())
        else:
            values, valid = _host_column(rows, name)
            if device is not None and name in batch.device_columns:
                j = batch.device_columns.index(name)
                on_device = batch.present[:, j]
                values = np.where(on_device, device[:, j], values)
                valid = valid | on_device
            arr = pa.array(values, pa.float64(), mask=~valid)
            target = _RECORD_TYPES.get(name, pa.float64())
            if target == pa.bool_():
                # found_inf arrives as a count of overflowing devices: any is a skip.
                arr = pa.array(np.where(valid, values != 0, False), pa.bool_(), mask=~valid)
            elif target != pa.float64():
                arr = arr.cast(target)
        arrays.append(arr)
        fields.append(pa.field(name, arr.type))
    return conform_metrics(pa.Table.from_arrays(arrays, schema=pa.schema(fields)))


class WorkQueue:
    """FIFO of writer items, bounded in metric batches: when full, the oldest metrics batch makes room.

    Events and run metadata are few and small, and are never dropped: a lost
    checkpoint event would mislead the rollback advisor, a lost "finished"
    would make a finished run look stalled.
    """

    def __init__(self, max_metrics: int) -> None:
        self._items: deque[WriterItem | None] = deque()
        self._cond = threading.Condition()
        self._max_metrics = max_metrics
        self._num_metrics = 0

    def put(self, item: WriterItem | None) -> MetricsBatch | None:
        """Append ``item``; return the metrics batch dropped to make room, if any. Never blocks."""
        dropped = None
        with self._cond:
            if isinstance(item, MetricsBatch):
                if self._num_metrics >= self._max_metrics:
                    dropped = next(x for x in self._items if isinstance(x, MetricsBatch))
                    self._items.remove(dropped)
                else:
                    self._num_metrics += 1
            self._items.append(item)
            self._cond.notify()
        return dropped

    def get(self) -> WriterItem | None:
        with self._cond:
            while not self._items:
                self._cond.wait()
            item = self._items.popleft()
            if isinstance(item, MetricsBatch):
                self._num_metrics -= 1
            return item

    def empty(self) -> bool:
        with self._cond:
            return not self._items


class BackgroundWriter:
    """A daemon thread draining a bounded queue of ``WriterItem``s into the store.

    ``submit`` never blocks: when ``max_queue`` metric batches wait, the oldest
    is dropped (and its rows counted), so memory stays bounded when the disk is
    slower than the loop. ``close`` drains and joins.
    """

    def __init__(self, root: str | Path, *, max_queue: int, name: str = "runwatch-writer") -> None:
        self.root = Path(root)
        self._queue = WorkQueue(max_queue)
        self._lock = threading.Lock()
        self.num_errors = 0
        self.num_dropped_rows = 0
        self.num_written_rows = 0
        self.num_files = 0
        self._warned = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, item: WriterItem) -> None:
        """Queue ``item``; if ``max_queue`` metric batches already wait, drop the oldest of them."""
        dropped = self._queue.put(item)
        if dropped is not None:
            self._count_drop(dropped, "the writer cannot keep up; dropped the oldest waiting batch")

    def close(self, timeout: float) -> bool:
        """Write everything queued, stop the thread; False if it did not finish in ``timeout`` seconds."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _count_drop(self, item: WriterItem | None, why: str) -> None:
        with self._lock:
            self.num_errors += 1
            if isinstance(item, MetricsBatch):
                self.num_dropped_rows += item.num_rows
        self._warn_once(why)

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"runwatch: {message} (further errors are only counted)", RuntimeWarning, stacklevel=2)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(item)
            except Exception as err:  # a failed write must not end the thread
                self._count_drop(item, f"writing to {self.root} failed: {type(err).__name__}: {err}")

    def _write(self, item: WriterItem) -> None:
        if isinstance(item, MetricsBatch):
            if item.ready is not None:
                item.ready.synchronize()  # waits for this flush's copy only, off the training thread
            table = batch_table(item)
            path = partition_dir(self.root, item.run, item.segment, item.rank) / part_name("metrics", "parquet")
            write_parquet_atomic(table, path)
            with self._lock:
                self.num_written_rows += table.num_rows
                self.num_files += 1
        elif isinstance(item, EventsBatch):
            data = events_jsonl(item.events)
            path = partition_dir(self.root, item.run, item.segment, item.rank) / part_name("events", "jsonl")
            write_bytes_atomic(data, path)
            with self._lock:
                self.num_files += 1
        else:
            with StagedWrite(self.root) as staged:
                staged.add_run_meta(item.run, _plain(item.meta))


def _plain(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (_plain(v) if isinstance(v, Mapping) else v) for k, v in meta.items()}
