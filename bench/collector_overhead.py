"""Benchmark: what recording costs the training thread, Monitor against TensorBoard and wandb (offline).

All in one run, side by side, on the same machine at the same time:

1. **In training.** The same training loop (a TinyGPT) in four variants,
   each with its own identically initialised model: bare, with ``Monitor``,
   with ``torch.utils.tensorboard.SummaryWriter`` and with wandb in offline
   mode; the peers log the same scalars (loss, grad norm, lr, final-layer
   activation RMS, tokens) per step the way their docs show (``.item()``).
   Each variant lives in its own process (so one logger's background
   threads never run inside another's timings), and they run one at a time
   in interleaved blocks, the order rotated every round, so drift in
   machine load hits all alike. Per variant: the logging call's
   cost on the training thread (median and mean, timed around the call) and
   the whole-step time; the paired ratio is each block's mean step time over
   bare's block of the same round, the median over rounds.
2. **Back to back.** The logging calls alone, with no training between them
   (same processes, interleaved blocks): the worst case for a logger with a
   background writer, whose thread then competes with every call.
3. **Writer throughput**: rows per second Monitor's writer persists.

    .venv/bin/python bench/collector_overhead.py [--steps 400] [--calls 20000]
    .venv/bin/python bench/collector_overhead.py --device cuda   # the GPU step overhead; needs CUDA

On a GPU each ``.item()`` is a host-device sync that stalls the launch
queue; ``Monitor`` makes none. ``--device cuda`` times blocks of steps with
one synchronize per block, so the peers' syncs show in the step time.
Prints markdown tables and saves JSON under bench/results/. Not a test.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import torch

from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches, train_step
from runwatch.collectors import Monitor
from runwatch.collectors.signals import activation_rms
from runwatch.collectors.writer import BackgroundWriter, MetricsBatch

RESULTS = Path(__file__).with_name("results")
MODELS = {  # (model, batch): a CPU step of ~25 ms; a GPU step long enough not to be launch-bound
    "cpu": (TinyGPTConfig(vocab_size=256, seq_len=64, d_model=128, num_layers=2, num_heads=4), 8),
    "cuda": (TinyGPTConfig(vocab_size=4096, seq_len=256, d_model=512, num_layers=4, num_heads=8), 16),
}
POOL = 32  # distinct batches per variant
LogFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]


def make_logger(name: str, tmp: Path, model: torch.nn.Module | None = None) -> tuple[LogFn, Callable[[], None]]:
    """(log(step, loss, grad_norm, act), close) for one logger; ``model`` lets Monitor hook it itself."""
    if name == "monitor":
        hooked = model is not None
        mon = Monitor(tmp / "runwatch", f"bench-{time.monotonic_ns()}", model=model,
                      activation_module=model.blocks[-1] if hooked else None)

        def log_monitor(step: int, loss: torch.Tensor, gn: torch.Tensor, act: torch.Tensor) -> None:
            # With a model, the activation norm comes from Monitor's own hook; else it is passed.
            mon.step(step, loss=loss, grad_norm=gn, lr=1e-3, tokens=step * 512, **({} if hooked else {"act_norm": act}))

        def close_monitor() -> None:
            mon.close()
            assert mon.num_errors == 0, f"the monitor counted {mon.num_errors} errors"

        return log_monitor, close_monitor
    if name == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(tmp / f"tb-{time.monotonic_ns()}"))

        def log_tb(step: int, loss: torch.Tensor, gn: torch.Tensor, act: torch.Tensor) -> None:
            writer.add_scalar("loss", loss.item(), step)  # .item(): what the TensorBoard docs show
            writer.add_scalar("grad_norm", gn.item(), step)
            writer.add_scalar("lr", 1e-3, step)
            writer.add_scalar("act_norm", act.item(), step)
            writer.add_scalar("tokens", step * 512, step)

        return log_tb, writer.close
    try:
        import wandb
    except ImportError as err:
        raise ImportError("the wandb variant needs wandb: pip install 'runwatch[bench]'") from err
    run = wandb.init(project="runwatch-bench", dir=str(tmp), mode="offline")

    def log_wandb(step: int, loss: torch.Tensor, gn: torch.Tensor, act: torch.Tensor) -> None:
        run.log({"loss": loss.item(), "grad_norm": gn.item(), "lr": 1e-3, "act_norm": act.item(),
                 "tokens": step * 512}, step=step)

    return log_wandb, run.finish


class Variant:
    """One model, optimizer and logger (or none: ``bare``), living in its own worker process."""

    def __init__(self, name: str, tmp: Path, device: torch.device) -> None:
        cfg, self.batch = MODELS[device.type]
        torch.manual_seed(0)
        self.name, self.device, self.model = name, device, TinyGPT(cfg).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        # A pool made before timing, cycled: the synthetic sampler takes 6 ms a batch for the CPU model and
        # 0.4 s for the GPU one, which would otherwise sit inside every timed step.
        made = synthetic_batches(cfg, self.batch)
        self.batches = itertools.cycle([next(made).to(device) for _ in range(POOL)])
        self.calls: list[float] = []  # seconds, per logging call in training
        self.blocks: list[float] = []  # mean step seconds, per block
        self.bare_calls: list[float] = []  # seconds, per back-to-back logging call
        self.act = torch.zeros((), device=device)
        self.log: LogFn | None = None
        self.close: Callable[[], None] = lambda: None
        if name == "monitor":
            self.log, self.close = make_logger(name, tmp, self.model)
            self.log_alone, self.close_alone = make_logger(name, tmp)  # no model: act_norm passed, as the peers
        elif name != "bare":
            self.model.blocks[-1].register_forward_hook(self._keep_act)
            self.log, self.close = make_logger(name, tmp)
            self.log_alone, self.close_alone = self.log, lambda: None

    def _keep_act(self, module: torch.nn.Module, inputs: object, output: object) -> None:
        self.act = activation_rms(output)

    def train_block(self, first: int, n: int, timed: bool = True) -> None:
        start = time.perf_counter()
        for step in range(first, first + n):
            loss, grad_norm = train_step(self.model, self.optimizer, next(self.batches))
            if self.log is not None:
                t0 = time.perf_counter()
                self.log(step, loss, grad_norm, self.act)
                if timed:
                    self.calls.append(time.perf_counter() - t0)
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # once per block: the peers' per-step syncs stay in their step time
        if timed:
            self.blocks.append((time.perf_counter() - start) / n)

    def call_block(self, first: int, n: int, timed: bool = True) -> None:
        """``n`` logging calls back to back, with fixed values (step numbers far from training's)."""
        loss, grad_norm = torch.tensor(2.5, device=self.device), torch.tensor(1.25, device=self.device)
        act = torch.tensor(0.75, device=self.device)
        for step in range(10**9 + first, 10**9 + first + n):
            t0 = time.perf_counter()
            self.log_alone(step, loss, grad_norm, act)
            if timed:
                self.bare_calls.append(time.perf_counter() - t0)


def _worker(name: str, device: str, tmp: str, conn: Connection) -> None:
    """Runs one variant's blocks on command, so each logger's background threads live in their own process."""
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    os.environ.update(WANDB_MODE="offline", WANDB_DIR=tmp, WANDB_SILENT="true")
    variant = Variant(name, Path(tmp), torch.device(device))
    conn.send("ready")
    while (msg := conn.recv()) is not None:
        kind, first, n, timed = msg
        (variant.train_block if kind == "train" else variant.call_block)(first, n, timed)
        conn.send("done")
    variant.close()
    if name != "bare":
        variant.close_alone()
    conn.send({"calls": variant.calls, "blocks": variant.blocks, "bare_calls": variant.bare_calls})


def run_side_by_side(names: tuple[str, ...], device: str, steps: int, block: int, warmup: int,
                     calls: int) -> dict[str, dict]:
    """Interleaved blocks, one variant running at a time, the order rotated every round."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        pipes = {}
        for name in names:
            parent, child = ctx.Pipe()
            ctx.Process(target=_worker, args=(name, device, tmp, child), daemon=True).start()
            pipes[name] = parent
        for conn in pipes.values():
            assert conn.recv() == "ready"

        def rounds(kind: str, who: tuple[str, ...], total: int, size: int, warm: int) -> None:
            for name in who:
                pipes[name].send((kind, 0, warm, False))
                pipes[name].recv()
            for r, first in enumerate(range(warm, warm + total, size)):
                k = r % len(who)  # rotate: no variant always runs right after another
                for name in who[k:] + who[:k]:
                    pipes[name].send((kind, first, size, True))
                    pipes[name].recv()

        rounds("train", names, steps, block, warmup)
        if calls:
            loggers = tuple(n for n in names if n != "bare")
            rounds("calls", loggers, calls, block * 20, 500)
        results = {}
        for name, conn in pipes.items():
            conn.send(None)
            results[name] = conn.recv()
    return results


def in_training(results: dict[str, dict], block: int) -> list[dict]:
    bare = results["bare"]["blocks"]
    return [{"variant": name, **_call_stats(r["calls"]), "step_median_ms": 1e3 * statistics.median(r["blocks"]),
             "step_mean_ms": 1e3 * statistics.fmean(r["blocks"]),
             "paired_ratio": statistics.median(b / a for a, b in zip(bare, r["blocks"], strict=True)),
             "num_steps": len(r["blocks"]) * block} for name, r in results.items()]


def back_to_back(results: dict[str, dict]) -> list[dict]:
    return [{"variant": name, **_call_stats(r["bare_calls"])} for name, r in results.items() if r["bare_calls"]]


def _call_stats(seconds: list[float]) -> dict:
    if not seconds:
        return {}
    us = 1e6 * np.asarray(seconds)
    return {"call_median_us": float(np.median(us)), "call_mean_us": float(us.mean()),
            "call_p99_us": float(np.percentile(us, 99)), "num_calls": len(us)}


def writer_rows_per_second(num_rows: int, rows_per_flush: int) -> float:
    """Rows/s the background writer turns into Parquet files, flushes as Monitor makes them."""
    names = ["loss", "grad_norm", "act_norm"]
    values = torch.randn(rows_per_flush, len(names), dtype=torch.float64)
    present = np.ones((rows_per_flush, len(names)), dtype=bool)
    with tempfile.TemporaryDirectory() as tmp:
        writer = BackgroundWriter(tmp, max_queue=num_rows // rows_per_flush + 1)
        start = time.perf_counter()
        for first in range(0, num_rows, rows_per_flush):
            host = [{"step": first + i, "time": 1.7e9 + first + i, "lr": 1e-3, "tokens": (first + i) * 1024}
                    for i in range(rows_per_flush)]
            writer.submit(MetricsBatch("bench", 0, 0, host, names, values, present, None))
        writer.close(timeout=600)
        elapsed = time.perf_counter() - start
        assert writer.num_written_rows == num_rows and writer.num_errors == 0
    return num_rows / elapsed


def _print_tables(result: dict) -> None:
    print("In training (logging call timed on the training thread; step = whole training step):\n")
    print("| variant | call median (us) | call mean (us) | step median (ms) | step mean (ms) | paired step ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in result["in_training"]:
        call = (f"{r['call_median_us']:.1f} | {r['call_mean_us']:.1f}" if "call_median_us" in r else "- | -")
        print(f"| {r['variant']} | {call} | {r['step_median_ms']:.2f} | {r['step_mean_ms']:.2f} "
              f"| {r['paired_ratio']:.3f}x |")
    if result.get("back_to_back"):
        print("\nBack to back (logging calls only):\n")
        print("| logger | call median (us) | call mean (us) | p99 (us) |")
        print("|---|---:|---:|---:|")
        for r in result["back_to_back"]:
            print(f"| {r['variant']} | {r['call_median_us']:.1f} | {r['call_mean_us']:.1f} | {r['call_p99_us']:.0f} |")
    for part in ("in_training", "back_to_back"):
        rows = {r["variant"]: r for r in result.get(part, [])}
        if "monitor" in rows and "tensorboard" in rows:
            ratio = rows["tensorboard"]["call_mean_us"] / rows["monitor"]["call_mean_us"]
            print(f"\n{part}: TensorBoard's mean call / Monitor's = {ratio:.1f}x (target >= 10x)")
    if result.get("writer"):
        print("\n| writer batch (rows per flush) | rows/s persisted |\n|---:|---:|")
        for row in result["writer"]:
            print(f"| {row['rows_per_flush']} | {row['rows_per_s']:,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="timed training steps per variant")
    parser.add_argument("--block", type=int, default=10, help="steps (or calls) per variant before rotating")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20_000, help="back-to-back calls per logger (0: skip)")
    parser.add_argument("--variants", default="bare,monitor,tensorboard,wandb", help="comma-separated, bare first")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda measures the GPU step overhead and needs CUDA; this machine has none")
    os.environ["BENCH_THREADS"] = str(args.threads)
    names = tuple(args.variants.split(","))
    if names[0] != "bare":
        parser.error("--variants must start with bare (the anchor of the step ratios)")
    raw = run_side_by_side(names, args.device, args.steps, args.block, args.warmup, args.calls)
    result = {"in_training": in_training(raw, args.block), "back_to_back": back_to_back(raw)}
    if args.device == "cpu":
        result["writer"] = [{"rows_per_flush": n, "rows_per_s": writer_rows_per_second(20_000, n)}
                            for n in (50, 500)]
    cfg, batch = MODELS[args.device]
    result["setup"] = {"model": str(cfg), "batch": batch, "threads": args.threads, "torch": torch.__version__,
                       "device": torch.cuda.get_device_name() if args.device == "cuda" else
                       (platform.processor() or platform.machine()), "steps": args.steps, "block": args.block,
                       "calls": args.calls}
    _print_tables(result)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"collector_overhead-{args.device}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"\nsaved {out}")


if __name__ == "__main__":
    main()
