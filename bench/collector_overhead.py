"""Benchmark: what recording costs a training step, Monitor against TensorBoard and wandb.

The same CPU training loop (a TinyGPT sized so a step takes >= 20 ms) runs in
four variants, each with its own identically initialised model: bare, with
``Monitor``, with ``torch.utils.tensorboard.SummaryWriter`` and with wandb in
offline mode, the peers logging the same four scalars (loss, grad norm, lr,
final-layer activation RMS) per step the way their docs show (``.item()``).
Variants are interleaved in blocks so drift in machine load hits all alike.
A second part measures how many rows per second Monitor's writer persists.

    .venv/bin/python bench/collector_overhead.py [--steps 200] [--block 10]

Prints a markdown table and saves JSON under bench/results/. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from runwatch.collectors import Monitor
from runwatch.collectors.monitor import MonitorConfig
from runwatch.collectors.signals import activation_rms
from runwatch.collectors.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches, train_step
from runwatch.collectors.writer import BackgroundWriter, MetricsBatch

RESULTS = Path(__file__).with_name("results")
MODEL = TinyGPTConfig(vocab_size=256, seq_len=64, d_model=128, num_layers=2, num_heads=4)
BATCH = 8


class Variant:
    """One model, optimizer and logger; ``step`` runs one timed training step."""

    def __init__(self, name: str, tmp: Path) -> None:
        torch.manual_seed(0)
        self.name, self.model = name, TinyGPT(MODEL)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.batches = synthetic_batches(MODEL, BATCH)
        self.times: list[float] = []
        self.act: torch.Tensor | None = None
        self.log: Callable[[int, torch.Tensor, torch.Tensor], None] = lambda step, loss, gn: None
        self.close: Callable[[], None] = lambda: None
        if name == "monitor":
            mon = Monitor(tmp / "runwatch", "bench", model=self.model, activation_module=self.model.blocks[-1],
                          config=MonitorConfig(flush_every_steps=50))
            self.log = lambda step, loss, gn: mon.step(step, loss=loss, grad_norm=gn, lr=1e-3,
                                                       tokens=(step + 1) * BATCH * MODEL.seq_len)
            self.close, self.monitor = mon.close, mon
        elif name in ("tensorboard", "wandb"):
            self.model.blocks[-1].register_forward_hook(self._keep_act)
            self._init_peer(name, tmp)

    def _keep_act(self, module: torch.nn.Module, inputs: object, output: object) -> None:
        self.act = activation_rms(output)

    def _init_peer(self, name: str, tmp: Path) -> None:
        if name == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(tmp / "tb"))

            def log_tb(step: int, loss: torch.Tensor, gn: torch.Tensor) -> None:
                writer.add_scalar("loss", loss.item(), step)  # .item(): what the TensorBoard docs show
                writer.add_scalar("grad_norm", gn.item(), step)
                writer.add_scalar("lr", 1e-3, step)
                writer.add_scalar("act_norm", self.act.item(), step)

            self.log, self.close = log_tb, writer.close
        else:
            try:
                import wandb
            except ImportError as err:
                raise ImportError("the wandb variant needs wandb: pip install wandb") from err
            run = wandb.init(project="runwatch-bench", dir=str(tmp), mode="offline")

            def log_wandb(step: int, loss: torch.Tensor, gn: torch.Tensor) -> None:
                run.log({"loss": loss.item(), "grad_norm": gn.item(), "lr": 1e-3, "act_norm": self.act.item()},
                        step=step)

            self.log, self.close = log_wandb, run.finish

    def step(self, step: int) -> None:
        start = time.perf_counter()
        loss, grad_norm = train_step(self.model, self.optimizer, next(self.batches))
        self.log(step, loss, grad_norm)
        self.times.append(time.perf_counter() - start)


def overhead_table(steps: int, block: int, warmup: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ.update(WANDB_MODE="offline", WANDB_DIR=str(tmp), WANDB_SILENT="true")
        variants = [Variant(n, tmp) for n in ("bare", "monitor", "tensorboard", "wandb")]
        for v in variants:  # warm-up, not timed
            for s in range(warmup):
                v.step(s)
            v.times.clear()
        step = warmup
        while len(variants[0].times) < steps:
            for v in variants:
                for s in range(step, step + block):
                    v.step(s)
            step += block
        for v in variants:
            v.close()
        errors = variants[1].monitor.num_errors
    bare = statistics.median(variants[0].times)
    return {
        "rows": [{"variant": v.name, "median_ms": 1e3 * statistics.median(v.times),
                  "mean_ms": 1e3 * statistics.fmean(v.times), "ratio_to_bare": statistics.median(v.times) / bare,
                  "num_steps": len(v.times)} for v in variants],
        "monitor_errors": errors,
    }


def writer_rows_per_second(num_rows: int, rows_per_flush: int) -> float:
    """Rows/s the background writer turns into Parquet files, flushes as Monitor makes them."""
    names = ["loss", "grad_norm", "act_norm", "lr"]
    values = torch.randn(rows_per_flush, len(names), dtype=torch.float64)
    present = np.ones((rows_per_flush, len(names)), dtype=bool)
    with tempfile.TemporaryDirectory() as tmp:
        writer = BackgroundWriter(tmp, max_queue=num_rows // rows_per_flush + 1)
        start = time.perf_counter()
        for first in range(0, num_rows, rows_per_flush):
            host = [{"step": first + i, "time": 1.7e9 + first + i, "tokens": (first + i) * 1024}
                    for i in range(rows_per_flush)]
            writer.submit(MetricsBatch("bench", 0, 0, host, names, values, present, None))
        writer.close(timeout=600)
        elapsed = time.perf_counter() - start
        assert writer.num_written_rows == num_rows and writer.num_errors == 0
    return num_rows / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps per variant (>= 200 for the README)")
    parser.add_argument("--block", type=int, default=10, help="steps per variant before rotating")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = overhead_table(args.steps, args.block, args.warmup)
    result["writer"] = [{"rows_per_flush": n, "rows_per_s": writer_rows_per_second(20_000, n)} for n in (50, 1000)]
    result["setup"] = {"model": str(MODEL), "batch": BATCH, "threads": args.threads, "torch": torch.__version__,
                       "cpu": platform.processor() or platform.machine(), "steps": args.steps, "block": args.block}
    print("| variant | median step (ms) | mean step (ms) | ratio to bare (median) |")
    print("|---|---:|---:|---:|")
    for row in result["rows"]:
        print(f"| {row['variant']} | {row['median_ms']:.2f} | {row['mean_ms']:.2f} | {row['ratio_to_bare']:.3f}x |")
    print()
    print("| writer batch (rows per flush) | rows/s persisted |")
    print("|---:|---:|")
    for row in result["writer"]:
        print(f"| {row['rows_per_flush']} | {row['rows_per_s']:,.0f} |")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"collector_overhead-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"\nsaved {out}")


if __name__ == "__main__":
    main()
