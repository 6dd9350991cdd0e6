"""Synthetic series for detector unit tests: a decaying loss with noise, a steady grad norm, tables like Store.rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def loss_curve(n: int, seed: int = 0, noise: float = 0.03, floor: float = 3.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    steps = np.arange(n)
    return floor + 2.0 * np.exp(-steps / 300) + rng.normal(0, noise, n)


def grad_curve(n: int, seed: int = 1, level: float = 0.3, spread: float = 0.08) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.exp(rng.normal(np.log(level), spread, n))


def rows_table(steps: np.ndarray, segment: int | np.ndarray = 0, **cols: np.ndarray) -> pa.Table:
    """A table shaped like ``Store.rows``: record columns present in ``cols``, segment and main."""
    steps = np.asarray(steps, dtype=np.int64)
    seg = np.broadcast_to(np.asarray(segment, dtype=np.int32), steps.shape)
    data = {"step": steps}
    for name, values in cols.items():
        arr = np.asarray(values)
        data[name] = pa.array(arr, type=pa.bool_() if arr.dtype == bool else pa.float64(), from_pandas=False)
    data["segment"] = pa.array(seg)
    later_first = {int(k): min([int(steps[seg == j].min()) for j in np.unique(seg) if j > k], default=None)
                   for k in np.unique(seg)}
    data["main"] = pa.array([later_first[int(k)] is None or int(s) < later_first[int(k)] for s, k in zip(steps, seg)])
    return pa.table(data)


def events_table(events: list[dict]) -> pa.Table:
    """A table shaped like ``Store.events`` from dicts with event, step, segment and payload (dict)."""
    import json

    schema = pa.schema([("segment", pa.int32()), ("rank", pa.int32()), ("event", pa.string()),
                        ("step", pa.int64()), ("time", pa.float64()), ("payload", pa.string())])
    return pa.Table.from_pylist([{"segment": e.get("segment", 0), "rank": 0, "event": e["event"], "step": e["step"],
                                  "time": e.get("time"), "payload": json.dumps(e.get("payload", {}))} for e in events],
                                schema=schema)
