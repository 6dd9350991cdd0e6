"""The collector's background writer: flush tables in the record's schema, bounded memory."""

from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from runwatch.collectors.writer import BackgroundWriter, EventsBatch, MetricsBatch, RunMetaUpdate, WorkQueue, batch_table
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
