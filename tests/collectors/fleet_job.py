"""A tiny GPT trained with DDP over gloo under ``Monitor``, with one rank made faulty; run by ``torchrun``.

    torchrun --standalone --nproc_per_node=2 fleet_job.py --root R --name NAME --fault slow|pause|perturb|none

- ``slow``: from ``--at`` on, the faulty rank's forward pass takes ``--seconds`` longer (a sleep inside its
  first block: a slow device);
- ``pause``: at step ``--at`` the faulty rank waits ``--seconds`` before its forward pass (a stuck input
  pipeline or a stopped host), and every other rank waits for it in the all-reduce;
- ``perturb``: from ``--at`` on, the faulty rank's gradients are scaled by 1.001 after the all-reduce (what a
  corrupt device or memory does to one replica: its update differs, silently);
- ``none``: the healthy control.

Every ``torch.distributed`` collective is counted, with the calls made from runwatch's code apart; each rank
writes its counts to ``--out/rank<r>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import runwatch.data  # noqa: F401  (its directory is one of RUNWATCH_DIRS)
from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches, train_step
from runwatch.collectors import Monitor
from runwatch.collectors.monitor import MonitorConfig

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
               "broadcast_object_list", "barrier", "monitored_barrier", "reduce", "reduce_scatter",
               "reduce_scatter_tensor", "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all",
               "all_to_all_single", "send", "recv", "isend", "irecv", "batch_isend_irecv")
RUNWATCH_DIRS = tuple(str(Path(sys.modules[name].__file__).resolve().parent)
                      for name in ("runwatch.collectors", "runwatch.data"))
"""The code that runs inside a training process (the collectors and the storage they write through)."""


def count_collectives() -> dict[str, int]:
    """Wrap every collective; count all calls, and those with a runwatch frame on the stack."""
    counts = {"total": 0, "from_runwatch": 0}

    def wrap(name: str) -> None:
        original = getattr(dist, name)

        def counted(*args: object, **kw: object) -> object:
            counts["total"] += 1
            frame = sys._getframe(1)
            while frame is not None:
                if frame.f_code.co_filename.startswith(RUNWATCH_DIRS):
                    counts["from_runwatch"] += 1
                    break
                frame = frame.f_back
            return original(*args, **kw)

        setattr(dist, name, counted)

    for name in COLLECTIVES:
        if hasattr(dist, name):
            wrap(name)
    return counts


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--name", required=True, help="run name")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--fault", choices=("none", "slow", "pause", "perturb"), default="none")
    p.add_argument("--faulty-rank", type=int, default=1)
    p.add_argument("--at", type=int, default=100)
    p.add_argument("--seconds", type=float, default=0.01)
    p.add_argument("--save-every", type=int, default=0, help="rank 0 saves a checkpoint every N steps (0: never)")
    args = p.parse_args()
    torch.set_num_threads(1)
    counts = count_collectives()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    cfg = TinyGPTConfig(d_model=32, num_layers=2)
    model = TinyGPT(cfg)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = synthetic_batches(cfg, batch_size=4, seed=rank)
    faulty = rank == args.faulty_rank
    state = {"step": 0}
    if args.fault == "slow" and faulty:
        def slow_block(module: torch.nn.Module, inputs: object) -> None:
            if state["step"] >= args.at:
                time.sleep(args.seconds)

        model.blocks[0].register_forward_pre_hook(slow_block)

    def perturb(module: torch.nn.Module) -> None:
        if args.fault == "perturb" and faulty and state["step"] >= args.at:
            with torch.no_grad():
                for param in module.parameters():
                    param.grad.mul_(1.001)

    mon = Monitor(args.root, args.name, model=ddp, activation_module=model.blocks[-1],
                  config=MonitorConfig(flush_every_steps=25, flush_every_seconds=0.5, heartbeat_seconds=0.5,
                                       param_checksum_every=10))
    for step in range(args.steps):
        state["step"] = step
        if args.fault == "pause" and faulty and step == args.at:
            time.sleep(args.seconds)
        loss, grad_norm = train_step(ddp, optimizer, next(batches), after_backward=perturb)
        mon.step(step, loss=loss, grad_norm=grad_norm, lr=1e-3)
        if args.save_every and step % args.save_every == 0 and step and rank == 0:
            path = Path(args.root).parent / "ckpt" / f"step-{step}.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            torch.save({"model": model.state_dict(), "opt": optimizer.state_dict()}, path)
            mon.checkpoint(step, path, write_seconds=time.perf_counter() - started)
    mon.close()
    dist.barrier()  # the script's own collective: proves the counter counts
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, f"rank{rank}.json").write_text(json.dumps({**counts, "num_errors": mon.num_errors}))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
