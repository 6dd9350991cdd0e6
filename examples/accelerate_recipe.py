"""Recording an Accelerate training loop with runwatch: the recipe the README shows, runnable.

    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_recipe.py --root runs --run tiny
    accelerate launch ... examples/accelerate_recipe.py --root runs --run tiny --resume-from ckpt/step-20

On a machine without GPUs, set ``ACCELERATE_USE_CPU=true`` for the same
command: Accelerate then runs the processes as multi-CPU with gloo
(``--cpu`` alone starts a single process unless MPI is set up).

Every process records its own ``rank=<r>`` shard. The gradient norm is the
one ``accelerator.clip_grad_norm_`` returns (it unscales first under fp16);
the loss scale comes from ``accelerator.scaler`` (fp16 on CUDA; None
otherwise). A checkpoint is saved after the update of its step, so
``step-k`` holds k updates and the next logged step is k+1.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator

from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches
from runwatch.collectors import Monitor


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="runwatch store")
    parser.add_argument("--run", required=True)
    parser.add_argument("--ckpt", default="ckpt", help="checkpoint folder")
    parser.add_argument("--steps", type=int, default=40, help="train until this step")
    parser.add_argument("--save-every", type=int, default=20)
    parser.add_argument("--resume-from", default=None, help="a step-<k> folder written by this script")
    parser.add_argument("--mixed-precision", default="no", choices=["no", "fp16", "bf16"])
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> Monitor:
    """Train to ``args.steps`` under a Monitor; returns the (closed) monitor."""
    torch.set_num_threads(1)

    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    torch.manual_seed(0)
    cfg = TinyGPTConfig(d_model=32, num_layers=2)
    model = TinyGPT(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    first = 1
    if args.resume_from is not None:
        accelerator.load_state(args.resume_from)
        first = int(Path(args.resume_from).name.removeprefix("step-")) + 1
    batches = synthetic_batches(cfg, batch_size=4, seed=accelerator.process_index * 1000 + first)
    tokens_per_step = 4 * cfg.seq_len * accelerator.num_processes

    raw = accelerator.unwrap_model(model)
    mon = Monitor(args.root, args.run, model=raw, scaler=accelerator.scaler, activation_module=raw.blocks[-1],
                  resume_step=first - 1 if args.resume_from else None, resume_checkpoint=args.resume_from)
    for step in range(first, args.steps + 1):
        batch = next(batches).to(accelerator.device)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        accelerator.backward(loss)
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        mon.step(step, loss=loss.detach(), grad_norm=grad_norm, lr=optimizer.param_groups[0]["lr"],
                 tokens=step * tokens_per_step)
        if step % args.save_every == 0:
            start = time.perf_counter()
            path = Path(args.ckpt) / f"step-{step}"
            accelerator.save_state(str(path))
            mon.checkpoint(step, path, write_seconds=time.perf_counter() - start)
    mon.close()
    return mon


if __name__ == "__main__":
    train(parse_args())
