"""Importer throughput on big synthetic logs (lines per second, one core).

Run: ``taskset -c 0 .venv/bin/python bench/import_speed.py [--lines 2000000] [--repeat 3]``.
Files are generated in a temporary directory (not timed). For each format it
reports parse-only lines/s (the issue's target metric: >= 500k lines/s on one
core) and parse + store write (``import_logs`` into a fresh store), best and
median of ``--repeat`` runs, with the load average before and after, since the
machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
import pyarrow as pa  # noqa: E402

pa.set_cpu_count(1)
pa.set_io_thread_count(1)

from runwatch.collectors.importers import import_logs, llmc, megatron, modded_nanogpt  # noqa: E402

NOISE = [
    "time (ms) | forward-compute: 1021.33 | backward-compute: 2051.12 | optimizer: 30.10 | batch-generator: 2.01",
    "[2021-05-27 21:32:10,181] [INFO] [logging.py:60:log_dist] [Rank 0] rank=0 time (ms) | train_batch: 0.00",
    "  checkpoint_activations .......................... False",
    "> building train, validation, and test datasets ...",
]


def _llmc(n: int, rng: np.random.Generator) -> str:
    loss = rng.uniform(2, 4, n)
    return "".join(f"s:{i} tel:{x:.4f}\n" if i % 250 == 0 else f"s:{i} trl:{x:.4f} lr:0.000600 norm:0.{i % 97:02d}\n"
                   for i, x in enumerate(loss))


def _modded(n: int, rng: np.random.Generator) -> str:
    loss = rng.uniform(2, 4, n)
    return "".join(f"step:{i}/{n} train_loss:{x:.4f} train_time:{i * 1700}ms step_avg:1700.{i % 99:02d}ms\n"
                   for i, x in enumerate(loss))


def _megatron(n: int, rng: np.random.Generator) -> str:
    """One iteration line in five, the rest noise, like a real Megatron stdout."""
    out = []
    for i in range(n):
        if i % 5 == 0:
            step = i // 5 + 1
            out.append(f" iteration {step:8d}/ 1000000 | consumed samples: {step * 512:12d} | elapsed time per iteration "
                       f"(ms): 1234.5 | learning rate: 1.500E-04 | global batch size:   512 | lm loss: {2 + (i % 100) / 100:.6E} "
                       "| loss scale: 65536.0 | grad norm: 1.234 | number of skipped iterations:   0 | "
                       "number of nan iterations:   0 |\n")
        else:
            out.append(NOISE[i % len(NOISE)] + "\n")
    return "".join(out)


def _timed(fn: Callable[[], object], repeat: int) -> tuple[list[float], object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"load average before: {os.getloadavg()[0]:.2f}, cpus allowed: {len(os.sched_getaffinity(0))}")
    print("| format | lines | MB | parse s (best / median) | parse lines/s (best / median) | rows "
          "| parse+write s (best / median) | parse+write lines/s (best) |\n|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, fmt, gen, module in (("llmc", "llmc", _llmc, llmc),
                                       ("modded-nanogpt", "modded-nanogpt", _modded, modded_nanogpt),
                                       ("megatron (noisy)", "megatron", _megatron, megatron)):
            path = Path(tmp) / f"{name.split()[0]}.log"
            path.write_text(gen(args.lines, rng))
            parse_t, parsed = _timed(lambda: module.parse([path]), args.repeat)
            counter = iter(range(args.repeat))
            write_t, _ = _timed(lambda: import_logs(fmt, [path], Path(tmp) / f"store-{fmt}-{next(counter)}", "bench"),
                                args.repeat)
            mb = path.stat().st_size / 1e6
            best, med = min(parse_t), statistics.median(parse_t)
            print(f"| {name} | {args.lines:,} | {mb:.0f} | {best:.2f} / {med:.2f} | {args.lines / best:,.0f} / "
                  f"{args.lines / med:,.0f} | {parsed.metrics.num_rows:,} | {min(write_t):.2f} / "
                  f"{statistics.median(write_t):.2f} | {args.lines / min(write_t):,.0f} |")
            path.unlink()
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
