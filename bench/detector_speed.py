"""Detector speed: every offline detector over a synthetic 1M-step run, and the streaming cost per row.

    .venv/bin/python bench/detector_speed.py [--steps 1000000] [--stream-rows 20000]

The synthetic run has every signal (loss, grad norm, act norm, fp16 loss scale
with ordinary backoffs, lr, wall time) and a few incidents (a recovered spike,
a stall, a slowdown, a scaler burst), so the detectors do real work. Prints a
markdown table; single-threaded numpy, and ``analyze()`` with a segment's scanners one after another and side
by side on threads (``RUNWATCH_SCAN_THREADS``; default the cores this process may use).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from runwatch.detectors.analysis import analyze  # noqa: E402
from runwatch.detectors.divergence import detect_divergence  # noqa: E402
from runwatch.detectors.nan import detect_nan, nonfinite_masks  # noqa: E402
from runwatch.detectors.scaler_collapse import detect_scaler_collapse  # noqa: E402
from runwatch.detectors.segment_scan import THREADS_ENV, scan_threads  # noqa: E402
from runwatch.detectors.slowdown import detect_slowdowns  # noqa: E402
from runwatch.detectors.spike import detect_spikes  # noqa: E402
from runwatch.detectors.stall import detect_stalls  # noqa: E402
from runwatch.detectors.streaming import StreamingAnalyzer  # noqa: E402


def synthetic_run(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    steps = np.arange(n, dtype=np.int64)
    loss = 2.0 + 8.0 * np.exp(-steps / (n / 50)) + rng.normal(0, 0.03, n)
    grad = np.exp(rng.normal(np.log(0.3), 0.1, n))
    act = 20.0 + rng.normal(0, 0.2, n)
    at = n // 2
    loss[at:at + 30] += 1.5 * np.exp(-np.arange(30) / 8)
    grad[at - 2:at + 5] *= 6
    step_time = rng.normal(0.5, 0.01, n)
    step_time[n // 3:n // 3 + 200] *= 2.0
    times = 1.7e9 + np.cumsum(step_time)
    times[n // 4:] += 600.0
    scale = np.full(n, 65536.0)
    scale[::1000] = 32768.0  # an overflow every 1000 steps, regrown at once: ordinary
    scale[3 * n // 4:3 * n // 4 + 12] = 65536.0 / 2.0 ** np.arange(1, 13)
    return {"step": steps, "loss": loss, "grad_norm": grad, "act_norm": act, "loss_scale": scale,
            "lr": np.full(n, 3e-4), "time": times}


def _timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def offline_table(run: dict[str, np.ndarray]) -> list[tuple[str, float]]:
    s = run["step"]
    present = np.ones(len(s), bool)
    rows = pa.table({**{k: v for k, v in run.items()}, "segment": np.zeros(len(s), np.int32), "main": present})
    return [
        ("spike", _timed(lambda: detect_spikes(s, run["loss"], run["grad_norm"]))),
        ("divergence", _timed(lambda: detect_divergence(s, run["loss"], run["grad_norm"], run["act_norm"], run["lr"]))),
        ("scaler_collapse", _timed(lambda: detect_scaler_collapse(s, run["loss_scale"]))),
        ("nan", _timed(lambda: detect_nan(s, nonfinite_masks(run["loss"], run["grad_norm"], run["act_norm"], present,
                                                             present, present, np.zeros(len(s), bool)), True))),
        ("stall", _timed(lambda: detect_stalls(s, run["time"]))),
        ("slowdown", _timed(lambda: detect_slowdowns(s[1:], np.diff(run["time"])))),
        ("analyze() (all detectors, segments, advice; from Arrow), scanners one after another",
         _timed(lambda: _with_scan_threads(1, lambda: analyze(rows, None)))),
        (f"analyze(), scanners side by side on {scan_threads()} threads (the default)", _timed(lambda: analyze(rows, None))),
    ]


def _with_scan_threads(threads: int, fn):
    before = os.environ.get(THREADS_ENV)
    os.environ[THREADS_ENV] = str(threads)
    try:
        return fn()
    finally:
        if before is None:
            del os.environ[THREADS_ENV]
        else:
            os.environ[THREADS_ENV] = before


def streaming_cost(run: dict[str, np.ndarray], num_rows: int) -> tuple[float, float, float]:
    """Microseconds per row: update() median and mean, update_many() in flushes of 100; checks agreement."""
    names = [k for k in run if k != "step"]
    rows = [{"step": int(run["step"][i]), **{k: float(run[k][i]) for k in names}} for i in range(num_rows)]
    sa = StreamingAnalyzer()
    per = np.empty(num_rows)
    for i, row in enumerate(rows):
        t0 = time.perf_counter()
        sa.update(row)
        per[i] = time.perf_counter() - t0
    table = pa.table({"step": run["step"][:num_rows], **{k: run[k][:num_rows] for k in names},
                      "segment": np.zeros(num_rows, np.int32), "main": np.ones(num_rows, bool)})
    assert sa.report().findings == analyze(table, None).findings, "streaming and offline disagree"
    batched = StreamingAnalyzer()
    t0 = time.perf_counter()
    for i in range(0, num_rows, 100):  # one collector flush of 100 rows at a time
        batched.update_many(rows[i:i + 100])
    per_row_batched = (time.perf_counter() - t0) / num_rows
    assert batched.report().findings == sa.report().findings, "batched and per-row streaming disagree"
    return float(np.median(per) * 1e6), float(per.mean() * 1e6), per_row_batched * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--stream-rows", type=int, default=20_000)
    args = parser.parse_args()
    run = synthetic_run(args.steps)
    print(f"## Detector speed ({args.steps:,} steps, every signal, single-threaded numpy)\n")
    print("| detector | seconds |\n|---|---:|")
    for name, seconds in offline_table(run):
        print(f"| {name} | {seconds:.3f} |")
    median_us, mean_us, batched_us = streaming_cost(synthetic_run(args.stream_rows, seed=1), args.stream_rows)
    print(f"\nStreaming over {args.stream_rows:,} rows (findings identical to offline):\n")
    print("| path | us per row |\n|---|---:|")
    print(f"| update(row), median | {median_us:.0f} |\n| update(row), mean | {mean_us:.0f} |")
    print(f"| update_many(100 rows), mean | {batched_us:.1f} |")


if __name__ == "__main__":
    main()
