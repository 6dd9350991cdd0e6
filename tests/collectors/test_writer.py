"""The collector's background writer: flush tables in the record's schema, bounded memory."""

from __future__ import annotations

import math
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from runwatch.collectors.writer import (
    BackgroundWriter,
    EventsBatch,
    MetricsBatch,
    RunMetaUpdate,
    WorkQueue,
    batch_table,
)
from runwatch.data.record import METRIC_COLUMNS
from runwatch.data.store import Store


def test_batch_table_merges_host_and_device_values() -> None:
    names = ["loss", "found_inf", "tokens", "lr", "custom"]
    values = torch.tensor([[1.5, 0.0, 100.0, 0.1, 7.0],
                           [math.nan, 1.0, 200.0, 0.0, 0.0],
                           [math.inf, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    present = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=bool)
    host = [{"step": 10, "time": 1.0}, {"step": 11, "time": 2.0, "lr": 0.2}, {"step": 12, "time": 3.0, "tokens": 300}]
    table = batch_table(MetricsBatch("r", 0, 0, host, names, values, present, None))
    assert tuple(table.column_names[: len(METRIC_COLUMNS)]) == METRIC_COLUMNS
    assert table.schema.field("found_inf").type == pa.bool_() and table.schema.field("tokens").type == pa.int64()
    assert table["step"].to_pylist() == [10, 11, 12]
    assert table["found_inf"].to_pylist() == [False, True, None]
    assert table["tokens"].to_pylist() == [100, 200, 300]  # device rows and a host row
    assert table["lr"].to_pylist() == [0.1, 0.2, None]
    assert table["custom"].to_pylist() == [7.0, None, None]
    loss = table["loss"].to_pylist()
    assert loss[0] == 1.5 and math.isnan(loss[1]) and math.isinf(loss[2])
    assert table["grad_norm"].null_count == 3


def test_full_queue_drops_the_oldest_and_counts(tmp_path: Path) -> None:
    small = [{"step": i, "time": float(i), "loss": 1.0} for i in range(5)]
    big = [{"step": i, "time": float(i), "loss": 1.0, "tokens": i} for i in range(300_000)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writer = BackgroundWriter(tmp_path, max_queue=2)
        writer.submit(MetricsBatch("q", 0, 0, big))
        while not writer._queue.empty():  # the thread took the big batch and is busy writing it
            time.sleep(0.001)
        for i in range(10):
            writer.submit(MetricsBatch("q", 0, 0, [{**r, "step": 1_000_000 + 10 * i + r["step"]} for r in small]))
        assert writer.close(timeout=120)
    assert writer.num_errors == 8 and writer.num_dropped_rows == 40
    assert writer.num_written_rows == 300_000 + 10
    assert len([w for w in caught if "cannot keep up" in str(w.message)]) == 1
    with Store(tmp_path) as store:
        steps = store.rows("q")["step"].to_pylist()
    # The newest two batches survive: memory is bounded by max_queue, recent rows are kept.
    assert steps[300_000:] == [1_000_080 + i for i in range(5)] + [1_000_090 + i for i in range(5)]


def test_a_full_queue_never_drops_events_or_run_metadata(tmp_path: Path) -> None:
    queue = WorkQueue(max_metrics=1)
    first, second = MetricsBatch("q", 0, 0, [{"step": 1}]), MetricsBatch("q", 0, 0, [{"step": 2}])
    checkpoint = EventsBatch("q", 0, 0, [{"event": "checkpoint", "step": 1, "path": "c/1"}])
    finished = RunMetaUpdate("q", {"finished": True})
    assert queue.put(first) is None and queue.put(checkpoint) is None and queue.put(finished) is None
    assert queue.put(second) is first  # only a metrics batch makes room
    assert [queue.get() for _ in range(3)] == [checkpoint, finished, second] and queue.empty()


def test_a_bad_value_nulls_its_cell_and_the_batch_is_written(tmp_path: Path) -> None:
    """Issue 9.6: one bad `tokens` value used to drop the whole flush."""
    rows = [{"step": i, "time": float(i), "loss": 2.0 - i / 100, "tokens": 1000 * i} for i in range(50)]
    rows[10]["tokens"] = 1.5  # not a whole number
    rows[20]["tokens"] = float("nan")
    rows[30]["tokens"] = 1e30  # beyond int64
    rows[40]["my_extra"] = 10**400  # no float holds it
    rows[41]["tokens"] = 2**60 + 1  # exact, beyond float precision
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writer = BackgroundWriter(tmp_path, max_queue=4)
        writer.submit(MetricsBatch("r", 0, 0, rows))
        assert writer.close(timeout=60)
    assert writer.num_written_rows == 50 and writer.num_dropped_rows == 0
    assert writer.num_bad_values == 4 and writer.num_errors == 4
    assert len([w for w in caught if "did not fit their column" in str(w.message)]) == 1
    with Store(tmp_path) as store:
        got = store.rows("r").to_pylist()
    tokens = [r["tokens"] for r in got]
    assert tokens[10] is None and tokens[20] is None and tokens[30] is None and tokens[41] == 2**60 + 1
    assert tokens[9] == 9000 and [r["loss"] for r in got] == [2.0 - i / 100 for i in range(50)]
    assert got[40]["my_extra"] is None


class _StuckCopy:
    """A device-to-host copy that never completes: the writer thread waits on it forever (a hung GPU)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def synchronize(self) -> None:
        self.release.wait()


def test_a_hung_writer_keeps_memory_bounded_and_put_constant_time(tmp_path: Path) -> None:
    """Issue 9.7: with the writer hung, 200k steps with a checkpoint every 100 queued 2,064 items."""
    stuck = _StuckCopy()
    writer = BackgroundWriter(tmp_path, max_queue=8, max_events=64)
    writer.submit(MetricsBatch("r", 0, 0, [{"step": -1}], ready=stuck))
    while not writer._queue.empty():  # the thread holds the stuck batch
        time.sleep(0.001)

    def flushes(lo: int, hi: int) -> float:
        t0 = time.perf_counter()
        for k in range(lo, hi):  # a flush every 50 steps, a checkpoint every 100
            writer.submit(MetricsBatch("r", 0, 0, [{"step": 50 * k + i} for i in range(50)]))
            if k % 2:
                writer.submit(EventsBatch("r", 0, 0, [{"event": "checkpoint", "step": 50 * k + 49, "path": "c"}]))
        return time.perf_counter() - t0

    early = flushes(0, 400)
    flushes(400, 3600)
    late = flushes(3600, 4000)  # 200,000 steps in all
    assert len(writer._queue) <= 2 * (8 + 64) + 16  # live items plus a bounded number of tombstones
    assert writer.num_dropped_rows == (4000 - 8) * 50 and writer.num_dropped_events == 2000 - 64
    assert late < 10 * early + 0.05  # no scan past the waiting events: as fast at the end as at the start
    stuck.release.set()
    assert writer.close(timeout=60)
    with Store(tmp_path) as store:
        assert store.rows("r").num_rows == 1 + 8 * 50 and store.events("r").num_rows == 64
