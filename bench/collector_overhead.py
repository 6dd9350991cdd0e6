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
from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches, train_step
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
        self.round_medians: list[float] = []  # median step time of each interleaved block
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


def overhead_table(steps: int, block: int, warmup: int, names: tuple[str, ...]) -> dict:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ.update(WANDB_MODE="offline", WANDB_DIR=str(tmp), WANDB_SILENT="true")
        variants = [Variant(n, tmp) for n in names]
        for v in variants:  # warm-up, not timed
            for s in range(warmup):
                v.step(s)
            v.times.clear()
        step, num_rounds = warmup, 0
        while len(variants[0].times) < steps:
            # Rotate the order every round so no variant always runs right after another.
            for v in variants[num_rounds % len(variants):] + variants[: num_rounds % len(variants)]:
                for s in range(step, step + block):
                    v.step(s)
                v.round_medians.append(statistics.median(v.times[-block:]))
            step, num_rounds = step + block, num_rounds + 1
        for v in variants:
            v.close()
        errors = next((v.monitor.num_errors for v in variants if v.name == "monitor"), None)
    bare = statistics.median(variants[0].times)
    return {
        "rows": [{"variant": v.name, "median_ms": 1e3 * statistics.median(v.times),
                  "mean_ms": 1e3 * statistics.fmean(v.times), "ratio_to_bare": statistics.median(v.times) / bare,
                  # Each block against bare's block of the same round: cancels drift in machine load.
                  "paired_ratio": statistics.median(
                      m / b for m, b in zip(v.round_medians, variants[0].round_medians, strict=True)),
                  "num_steps": len(v.times)} for v in variants],
        "monitor_errors": errors,
    }


def logging_call_cost(num_calls: int) -> list[dict]:
    """Microseconds one step's logging call costs the training thread, without training around it.

    Steps of a CPU loop are noisy on a shared machine; this isolates what each
    logger adds per step. On a CPU ``.item()`` is cheap (no device to wait
    for); on a GPU it is a sync that stalls the pipeline, which this cannot show.
    """
    loss, grad_norm, act = torch.tensor(2.5), torch.tensor(1.25), torch.tensor(0.75)
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for name in ("monitor", "tensorboard", "wandb"):
            variant = Variant(name, tmp)
            if name == "monitor":  # a bounded queue sized for this burst: nothing may be dropped here
                variant.monitor.close()
                mon = Monitor(tmp / "runwatch", "calls", config=MonitorConfig(flush_every_steps=50, max_queue=4096))
                variant.log = lambda step, loss, gn: mon.step(step, loss=loss, grad_norm=gn, lr=1e-3,
                                                              act_norm=act, tokens=step * 512)
                variant.close, variant.monitor = mon.close, mon
            variant.act = act
            for step in range(100):
                variant.log(step, loss, grad_norm)
            start = time.perf_counter()
            for step in range(100, 100 + num_calls):
                variant.log(step, loss, grad_norm)
            rows.append({"variant": name, "us_per_step": 1e6 * (time.perf_counter() - start) / num_calls})
            variant.close()
            if name == "monitor":
                assert variant.monitor.num_errors == 0, "the monitor dropped rows in the call benchmark"
    return rows


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
    parser.add_argument("--block", type=int, default=5, help="steps per variant before rotating")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--variants", default="bare,monitor,tensorboard,wandb", help="comma-separated, bare first")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = overhead_table(args.steps, args.block, args.warmup, tuple(args.variants.split(",")))
    result["calls"] = logging_call_cost(2000)
    result["writer"] = [{"rows_per_flush": n, "rows_per_s": writer_rows_per_second(20_000, n)} for n in (50, 1000)]
    result["setup"] = {"model": str(MODEL), "batch": BATCH, "threads": args.threads, "torch": torch.__version__,
                       "cpu": platform.processor() or platform.machine(), "steps": args.steps, "block": args.block}
    print("| variant | median step (ms) | mean step (ms) | ratio to bare (medians) | paired ratio (per round) |")
    print("|---|---:|---:|---:|---:|")
    for r in result["rows"]:
        print(f"| {r['variant']} | {r['median_ms']:.2f} | {r['mean_ms']:.2f} | {r['ratio_to_bare']:.3f}x "
              f"| {r['paired_ratio']:.3f}x |")
    print()
    print("| logger | cost per step on the training thread (us) |")
    print("|---|---:|")
    for row in result["calls"]:
        print(f"| {row['variant']} | {row['us_per_step']:.1f} |")
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
