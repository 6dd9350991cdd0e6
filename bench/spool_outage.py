"""How long an object-store outage a Monitor's spool rides out: real parts, measured bytes per row.

A Monitor flushes every ``flush_every_steps`` (500) steps or every
``flush_every_seconds`` (10 s), whichever comes first, so at r steps/s a part
holds min(500, 10 r) rows, and small parts cost more bytes per row (each has
a Parquet footer). For each step rate this writes parts of that size with the
writer's own code path (``conform_metrics`` + ``write_parquet_atomic``, the
fields the README loop logs, random values as real losses are) and turns the
measured bytes per second into the outage a spool of ``--spool-gib`` rides
out (one rank per spool; ranks that share a spool divide it).

    .venv/bin/python bench/spool_outage.py --spool-gib 1
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from runwatch.collectors.monitor import MonitorConfig
from runwatch.data.record import conform_metrics, metrics_table
from runwatch.data.storage import part_name, write_parquet_atomic

RATES = (0.2, 1, 10, 100, 1000)


def bytes_per_row(directory: Path, rows_per_part: int, num_rows: int = 20_000) -> float:
    rng = np.random.default_rng(0)
    size, step = 0, 0
    while step < num_rows:
        rows = [{"step": s, "time": 1.7e9 + s * 0.1, "loss": 2.0 + rng.random(), "grad_norm": rng.random(),
                 "loss_scale": 65536.0, "act_norm": 1.0 + rng.random() * 0.01, "lr": 3e-4,
                 "tokens": (s + 1) * 4096} for s in range(step, step + rows_per_part)]
        path = write_parquet_atomic(conform_metrics(metrics_table(rows)), directory / part_name("metrics", "parquet"))
        size += path.stat().st_size
        step += rows_per_part
    return size / step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spool-gib", type=float, default=1.0)
    args = parser.parse_args()
    cfg = MonitorConfig()
    spool = args.spool_gib * (1 << 30)
    print(f"| steps/s | rows per part | bytes per row | bytes/s | outage a {args.spool_gib:g} GiB spool rides out |")
    print("|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for rate in RATES:
            rows = max(1, min(cfg.flush_every_steps, round(cfg.flush_every_seconds * rate)))
            per_row = bytes_per_row(Path(tmp), rows)
            seconds = spool / (per_row * rate)
            lasts = f"{seconds / 86400:,.1f} days" if seconds >= 2 * 86400 else f"{seconds / 3600:,.1f} hours"
            print(f"| {rate:g} | {rows} | {per_row:,.1f} | {per_row * rate:,.0f} | {lasts} |")


if __name__ == "__main__":
    main()
