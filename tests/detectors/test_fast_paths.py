"""Fast paths give the same values as the plain rule they stand for.

``row_median`` picks the middle order statistics by a min/max network (rows of 4), a sort, or a selection
(rows of 4096 and more); ``row_median_and_mad`` reads the deviations' middle values off the sorted rows.
Streaming must equal offline bit for bit, so each path must return exactly what sorting each row's finite
values and averaging the two middle ones returns, NaN, infinities and ties included. ``warmup_end`` reads the
LR from the front in growing prefixes and must answer as reading it whole does. A long segment's scanners run
side by side on threads and must find what they find one after another.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from runwatch.detectors import segment_scan
from runwatch.detectors.analysis import analyze
from runwatch.detectors.config import DEFAULT
from runwatch.detectors.core import PARTITION_FROM, SORT_ONCE_FROM, WIDE_ROW, row_median, row_median_and_mad
from runwatch.detectors.divergence import WARMUP_PREFIX, warmup_end


def plain_median(values: np.ndarray, min_finite: int | None) -> np.ndarray:
    need = max((values.shape[1] + 1) // 2 if min_finite is None else min_finite, 1)
    out = []
    for row in values:
        fin = np.sort(row[np.isfinite(row)])
        n = len(fin)
        out.append((fin[(n - 1) // 2] + fin[n // 2]) * 0.5 if n >= need and n else np.nan)
    return np.array(out)


def random_rows(rng: np.random.Generator, num_rows: int, width: int) -> np.ndarray:
    x = rng.normal(size=(num_rows, width)) if rng.random() < 0.5 else rng.integers(0, 4, (num_rows, width)) * 1.0
    if rng.random() < 0.4:
        x[rng.random(x.shape) < rng.random() * 0.5] = np.nan
    if rng.random() < 0.2:
        x[rng.random(x.shape) < 0.02] = np.inf
    return x


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 16, 63, 64, 1024, PARTITION_FROM, 15625])
def test_every_path_is_the_plain_median(width: int) -> None:
    rng = np.random.default_rng(width)
    for _ in range(20):
        x = random_rows(rng, int(rng.integers(1, 12)), width)
        m = None if rng.random() < 0.5 else int(rng.integers(1, width + 1))
        np.testing.assert_array_equal(row_median(x, m), plain_median(x, m))


@pytest.mark.parametrize("width", [7, 64, WIDE_ROW, 1024])
def test_median_and_mad_in_one_sort_equal_the_two_calls(width: int) -> None:
    rng = np.random.default_rng(width)
    rows = SORT_ONCE_FROM // width + 3  # past the size from which the sorted rows are reused
    for _ in range(15):
        x = random_rows(rng, rows, width)
        m = None if rng.random() < 0.5 else int(rng.integers(1, width + 1))
        med = row_median(x, m)
        got_med, got_mad = row_median_and_mad(x, m)
        np.testing.assert_array_equal(got_med, med)
        np.testing.assert_array_equal(got_mad, row_median(np.abs(x - med[:, None]), m))


def whole_warmup_end(steps: np.ndarray, lr: np.ndarray) -> int | None:
    ok = np.isfinite(lr) & (lr > 0)
    s, v = steps[ok], lr[ok]
    if len(v) < 3 or not v[1] > v[0]:
        return None
    rate = np.diff(np.log(v)) / np.maximum(np.diff(s), 1)
    stop = [i for i in range(len(rate)) if rate[i] <= 0 or (i > 0 and rate[i] > DEFAULT.lr.warmup_steepen * rate[i - 1])]
    return int(s[stop[0]]) if len(stop) else int(s[-1])


def test_the_warmup_end_read_from_the_front_is_the_whole_reading() -> None:
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(0, 10 * WARMUP_PREFIX))
        warm = int(rng.integers(0, n + 2))  # warm-ups shorter and longer than the first prefix
        lr = np.concatenate([np.linspace(1e-5, 1e-3, warm), np.full(max(n - warm, 0), 1e-3)])[:n]
        if rng.random() < 0.5:
            lr[rng.random(n) < rng.random() * 0.9] = np.nan  # sparse LR logging: few values in a prefix
        if rng.random() < 0.3:
            lr[rng.random(n) < 0.1] = 0.0
        if rng.random() < 0.3 and n:
            lr[int(rng.integers(0, n))] *= 50.0  # a burst, inside the warm-up or after it
        steps = np.arange(n) * int(rng.integers(1, 5))
        assert warmup_end(steps, lr, DEFAULT.lr) == whole_warmup_end(steps, lr)


def test_scanners_on_threads_find_what_they_find_one_after_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every detector's work on a run with incidents of each kind, on threads (a long segment's offline read)
    and one scanner after another: the same findings and advice, field by field."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    from detector_speed import synthetic_run

    n = 40_000
    run = synthetic_run(n)
    rows = pa.table({**run, "segment": np.zeros(n, np.int32), "main": np.ones(n, bool)})
    monkeypatch.setenv(segment_scan.THREADS_ENV, "2")  # the pool runs on a 1-core machine too
    reports = []
    for parallel_from in (1 << 62, 1024):
        monkeypatch.setattr(segment_scan, "PARALLEL_FROM", parallel_from)
        reports.append(analyze(rows, None))
    serial, threaded = (r.to_dict("synthetic") for r in reports)
    assert {f["kind"] for f in serial["findings"]} >= {"spike", "stall", "slowdown", "scaler_collapse"}
    assert threaded == serial
