"""The collector's background writer: flushed batches in, Parquet and JSONL files out.

``Monitor`` hands over one ``MetricsBatch`` per flush (host values already
copied off the device, or being copied, with an event to wait on), events and
run metadata, in order, through a queue bounded both in metric batches and in
event batches (``put`` is O(1): when full, the oldest batch of that kind is
dropped and counted). One daemon thread turns each item into an Arrow table
and writes it through ``runwatch.data.storage`` (temporary name, then rename).
A value that does not fit its column (a ``tokens`` of 1.5, an integer too
large for a float) becomes null and is counted; the rest of its batch is
written. A failed item is counted and warned about once, and the thread keeps
going: the observer never kills the patient.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from runwatch.collectors.rank_signals import Heartbeat, read_forward_seconds
from runwatch.data.locks import PartitionClaim
from runwatch.data.record import METRIC_FIELDS, conform_metrics
from runwatch.data.storage import (
    events_jsonl,
    merge_run_meta,
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
    timings: list[tuple[int, list]] = field(default_factory=list)
    """(row, [(start, end) CUDA events]) of the forward passes timed on a GPU, read after ``ready``."""
    give_back: Any = None  # called with the events once read, for reuse

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


_INT64_LIMIT = 2.0**63
_INT_COLUMNS = frozenset(name for name, t in _RECORD_TYPES.items() if pa.types.is_integer(t) and name != "step")


def _host_column(rows: list[dict[str, Any]], name: str) -> tuple[np.ndarray, np.ndarray, list[tuple[int, Any]]]:
    """float64 values and validity of one host column, and the (row, value) pairs no float can hold."""
    values = np.full(len(rows), np.nan, dtype=np.float64)
    valid = np.zeros(len(rows), dtype=bool)
    bad = []
    for i, row in enumerate(rows):
        v = row.get(name)
        if v is not None:
            try:
                values[i], valid[i] = float(v), True
            except (OverflowError, TypeError, ValueError):
                bad.append((i, v))
    return values, valid, bad


def _int_column(rows: list[dict[str, Any]], name: str, values: np.ndarray,
                valid: np.ndarray) -> tuple[pa.Array, list[tuple[int, Any]]]:
    """int64 of a count column; a cell that is not a whole number in range is null and reported."""
    ok = valid & np.isfinite(values) & (values == np.floor(values)) & (np.abs(values) < _INT64_LIMIT)
    ints = np.where(ok, values, 0).astype(np.int64)
    for i, row in enumerate(rows):  # host ints stay exact beyond 2**53
        v = row.get(name)
        if ok[i] and isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            ints[i] = int(v)
    bad = [(int(i), rows[i].get(name, float(values[i]))) for i in np.flatnonzero(valid & ~ok)]
    return pa.array(ints, pa.int64(), mask=~ok), bad


def batch_table(batch: MetricsBatch) -> pa.Table:
    """The Arrow table of one flush in the record's schema (extras as float64); see ``convert_batch``."""
    return convert_batch(batch)[0]


def convert_batch(batch: MetricsBatch) -> tuple[pa.Table, list[str]]:
    """The Arrow table of one flush in the record's schema (extras as float64), and the bad cells.

    A value its column cannot hold is stored as null and described in the
    returned list; a row whose step is not a 64-bit integer is left out (and
    described). Never raises for a bad value.
    """
    keep = [i for i, r in enumerate(batch.host_rows) if _is_int64(r.get("step"))]
    problems = [f"step={r.get('step')!r} (not a 64-bit integer: row left out)"
                for r in batch.host_rows if not _is_int64(r.get("step"))]
    rows = [batch.host_rows[i] for i in keep] if problems else batch.host_rows
    names: list[str] = []
    for row in rows:
        names.extend(k for k in row if k not in names)
    names.extend(c for c in batch.device_columns if c not in names)
    device = batch.device_values.numpy() if batch.device_values is not None else None
    present = batch.present
    if problems and device is not None:
        device, present = device[keep], present[keep]
    arrays, fields = [], []
    for name in names:
        if name == "step":
            arr = pa.array([int(r["step"]) for r in rows], pa.int64())
        else:
            values, valid, bad = _host_column(rows, name)
            if device is not None and name in batch.device_columns:
                j = batch.device_columns.index(name)
                values = np.where(present[:, j], device[:, j], values)
                valid = valid | present[:, j]
            arr, more = _to_record_type(rows, name, values, valid)
            problems += [f"{name}={v!r}" for _, v in bad + more]
        arrays.append(arr)
        fields.append(pa.field(name, arr.type))
    return conform_metrics(pa.Table.from_arrays(arrays, schema=pa.schema(fields))), problems


def _is_int64(step: Any) -> bool:
    return isinstance(step, (int, np.integer)) and not isinstance(step, bool) and -(2**63) <= int(step) < 2**63


def _to_record_type(rows: list[dict[str, Any]], name: str, values: np.ndarray,
                    valid: np.ndarray) -> tuple[pa.Array, list[tuple[int, Any]]]:
    target = _RECORD_TYPES.get(name, pa.float64())
    if target == pa.bool_():
        # found_inf arrives as a count of overflowing devices: any is a skip.
        return pa.array(np.where(valid, values != 0, False), pa.bool_(), mask=~valid), []
    if name in _INT_COLUMNS:
        return _int_column(rows, name, values, valid)
    return pa.array(values, pa.float64(), mask=~valid), []


IDLE = object()
"""What ``WorkQueue.get`` returns when its wait timed out."""


class WorkQueue:
    """FIFO of writer items, bounded in metric batches and in event batches; every operation O(1).

    When ``max_metrics`` metric batches wait, a new one drops the oldest
    waiting metric batch; likewise for ``max_events`` event batches (a hung
    writer must not make memory grow, whatever the loop does). Run metadata
    updates (two per monitor) are never dropped. A dropped item stays in the
    FIFO as a tombstone that ``get`` skips; tombstones are swept out when they
    outnumber the live items, so the FIFO stays bounded too.
    """

    def __init__(self, max_metrics: int, max_events: int = 1024) -> None:
        self._items: deque[list] = deque()  # [item] cells; a dropped item's cell holds _DROPPED
        self._by_kind: dict[type, deque[list]] = {MetricsBatch: deque(), EventsBatch: deque()}
        self._limits = {MetricsBatch: max_metrics, EventsBatch: max_events}
        self._num_dropped_cells = 0
        self._cond = threading.Condition()

    def put(self, item: WriterItem | None) -> WriterItem | None:
        """Append ``item``; return the batch dropped to make room, if any. Never blocks."""
        dropped = None
        cell = [item]
        with self._cond:
            waiting = self._by_kind.get(type(item))
            if waiting is not None:
                if len(waiting) >= self._limits[type(item)]:
                    victim = waiting.popleft()
                    dropped, victim[0] = victim[0], _DROPPED
                    self._num_dropped_cells += 1
                    if self._num_dropped_cells > len(self._items) // 2 + 16:
                        self._items = deque(c for c in self._items if c[0] is not _DROPPED)
                        self._num_dropped_cells = 0
                waiting.append(cell)
            self._items.append(cell)
            self._cond.notify()
        return dropped

    def get(self, timeout: float | None = None) -> WriterItem | None | object:
        """The next item; ``IDLE`` when ``timeout`` seconds passed without one."""
        with self._cond:
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                while not self._items:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return IDLE
                    self._cond.wait(left)
                cell = self._items.popleft()
                if cell[0] is _DROPPED:
                    self._num_dropped_cells = max(0, self._num_dropped_cells - 1)
                    continue
                waiting = self._by_kind.get(type(cell[0]))
                if waiting is not None:
                    waiting.popleft()  # the oldest live item of its kind is this one: the FIFO keeps order
                return cell[0]

    def take_same_partition(self, first: MetricsBatch, limit: int) -> list[MetricsBatch]:
        """Metric batches of ``first``'s partition waiting right behind it (at most ``limit``); never blocks."""
        taken: list[MetricsBatch] = []
        with self._cond:
            while self._items and len(taken) < limit:
                item = self._items[0][0]
                if item is _DROPPED:
                    self._items.popleft()
                    self._num_dropped_cells = max(0, self._num_dropped_cells - 1)
                    continue
                if not (isinstance(item, MetricsBatch) and (item.run, item.segment, item.rank)
                        == (first.run, first.segment, first.rank)):
                    break
                self._items.popleft()
                self._by_kind[MetricsBatch].popleft()
                taken.append(item)
        return taken

    def empty(self) -> bool:
        with self._cond:
            return all(c[0] is _DROPPED for c in self._items)

    def __len__(self) -> int:
        """Items held, tombstones included (what memory holds)."""
        with self._cond:
            return len(self._items)


_DROPPED = object()


class BackgroundWriter:
    """A daemon thread draining a bounded queue of ``WriterItem``s into the store.

    ``submit`` never blocks: when ``max_queue`` metric batches (or
    ``max_events`` event batches) wait, the oldest of that kind is dropped and
    counted, so memory stays bounded when the disk is slower than the loop.
    ``close`` drains and joins; the thread releases the partition ``claim``
    when it ends, so the partition stays claimed while anything may still
    be written into it.
    """

    def __init__(self, root: str | Path, *, max_queue: int, max_events: int = 1024,
                 claim: PartitionClaim | None = None, name: str = "runwatch-writer",
                 heartbeat: Heartbeat | None = None) -> None:
        self.root = Path(root)
        self.heartbeat = heartbeat  # rewritten every ``heartbeat.every_s`` seconds, busy or idle
        self._queue = WorkQueue(max_queue, max_events)
        self._lock = threading.Lock()
        self._claim = claim
        self.num_errors = 0
        self.num_dropped_rows = 0
        self.num_dropped_events = 0
        self.num_bad_values = 0
        self.num_written_rows = 0
        self.num_files = 0
        self._warned = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, item: WriterItem) -> None:
        """Queue ``item``; if its kind's bound is reached, drop the oldest waiting batch of that kind."""
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
            elif isinstance(item, EventsBatch):
                self.num_dropped_events += len(item.events)
        self._warn_once(why)

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"runwatch: {message} (further errors are only counted)", RuntimeWarning, stacklevel=2)

    def _run(self) -> None:
        next_beat = time.monotonic()
        try:
            while True:
                wait = None if self.heartbeat is None else max(next_beat - time.monotonic(), 0.0)
                item = self._queue.get(wait)
                if item is None:
                    self._beat()  # the last one says "closed" when the monitor closed
                    return
                if item is not IDLE:
                    self._write_caught(item)
                if self.heartbeat is not None and time.monotonic() >= next_beat:
                    self._beat()
                    next_beat = time.monotonic() + self.heartbeat.every_s
        finally:
            if self._claim is not None:
                self._claim.release()

    def _write_caught(self, item: WriterItem) -> None:
        # Behind? The batches of this partition waiting right after it go into the same file:
        # one write and one fsync catch up on all of them.
        items = [item, *self._queue.take_same_partition(item, 31)] if isinstance(item, MetricsBatch) else [item]
        try:
            self._write(items)
        except Exception as err:  # a failed write must not end the thread
            for lost in items:
                self._count_drop(lost, f"writing to {self.root} failed: {type(err).__name__}: {err}")

    def _beat(self) -> None:
        if self.heartbeat is None:
            return
        try:
            self.heartbeat.write()
        except Exception as err:  # a lost heartbeat costs liveness detail only, never the metrics
            self._count_drop(None, f"writing the heartbeat failed: {type(err).__name__}: {err}")

    def _write_metrics(self, batches: list[MetricsBatch]) -> None:
        """One Parquet part from consecutive batches of one partition."""
        tables = []
        for batch in batches:
            if batch.ready is not None:
                batch.ready.synchronize()  # waits for this flush's copy only, off the training thread
            for row, pairs in batch.timings:
                batch.host_rows[row]["forward_time"] = read_forward_seconds(pairs)
                if batch.give_back is not None:
                    batch.give_back(pairs)
            table, problems = convert_batch(batch)
            if problems:
                with self._lock:
                    self.num_bad_values += len(problems)
                    self.num_errors += len(problems)
                    self.num_dropped_rows += batch.num_rows - table.num_rows
                self._warn_once(f"{len(problems)} value(s) did not fit their column and were stored as null "
                                f"(first: {problems[0]})")
            tables.append(table)
        table = tables[0] if len(tables) == 1 else conform_metrics(pa.concat_tables(tables, promote_options="permissive"))
        first = batches[0]
        write_parquet_atomic(table, partition_dir(self.root, first.run, first.segment, first.rank)
                             / part_name("metrics", "parquet"))
        with self._lock:
            self.num_written_rows += table.num_rows
            self.num_files += 1

    def _write(self, items: list[WriterItem]) -> None:
        item = items[0]
        if isinstance(item, MetricsBatch):
            self._write_metrics(items)
        elif isinstance(item, EventsBatch):
            data = events_jsonl(item.events)
            path = partition_dir(self.root, item.run, item.segment, item.rank) / part_name("events", "jsonl")
            write_bytes_atomic(data, path)
            with self._lock:
                self.num_files += 1
        else:
            merge_run_meta(self.root, item.run, _plain(item.meta))  # ranks register concurrently: locked merge


def _plain(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (_plain(v) if isinstance(v, Mapping) else v) for k, v in meta.items()}
