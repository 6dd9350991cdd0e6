"""A tiny GPT training run under ``Monitor``, run as a subprocess by the collector tests.

Prints ``step <n>`` after each ``Monitor.step`` returns and a final JSON line
with the monitor's counters, so a parent can kill it mid-run or check that
training went on despite an unwritable root. Under ``torchrun`` it trains
with DDP over gloo and every rank records its own shard.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
import warnings

import torch

from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches, train_step
from runwatch.collectors import Monitor
from runwatch.collectors.monitor import MonitorConfig


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--name", default="sub", help="run name")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--flush-every", type=int, default=10)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--fsize-limit", type=int, default=None, help="RLIMIT_FSIZE in bytes (a full disk)")
    parser.add_argument("--distributed", action="store_true")
    parser.add_argument("--no-close", action="store_true", help="exit without Monitor.close() (atexit must flush)")
    parser.add_argument("--spool", default=None, help="local spool for an object-store --root")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.fsize_limit is not None:
        # Python ignores SIGXFSZ, so a write past the limit fails with EFBIG like a full disk.
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize_limit, args.fsize_limit))
    if args.distributed:
        torch.distributed.init_process_group("gloo")
    torch.manual_seed(0)
    cfg = TinyGPTConfig(d_model=32, num_layers=1)
    model = TinyGPT(cfg)
    train_model = torch.nn.parallel.DistributedDataParallel(model) if args.distributed else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rank = int(os.environ.get("RANK", 0))
    batches = synthetic_batches(cfg, batch_size=4, seed=rank)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = Monitor(args.root, args.name, model=model, activation_module=model.blocks[-1],
                      config=MonitorConfig(flush_every_steps=args.flush_every, flush_every_seconds=3600),
                      spool=args.spool)
        for step in range(args.steps):
            loss, grad_norm = train_step(train_model, optimizer, next(batches))
            mon.step(step, loss=loss, grad_norm=grad_norm, lr=1e-3, tokens=(step + 1) * 4 * cfg.seq_len)
            print(f"step {step}", flush=True)
            if args.sleep:
                time.sleep(args.sleep)
        if not args.no_close:
            mon.close()
    result = {"steps_done": args.steps, "num_errors": mon.num_errors, "num_dropped_rows": mon.num_dropped_rows,
              "num_written_rows": mon.num_written_rows,
              "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]}
    print("RESULT " + json.dumps(result), flush=True)
    if args.distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
