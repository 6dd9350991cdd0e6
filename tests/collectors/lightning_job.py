"""A LightningModule trained with Lightning's DDP strategy (gloo, CPU) under ``RunwatchCallback``; run by ``torchrun``.

    torchrun --standalone --nproc_per_node=2 lightning_job.py --root R --name NAME --steps N --slow-ms MS

Rank 1 is made faulty the two ways a replica goes wrong: its ``training_step`` sleeps ``--slow-ms`` before it calls
``self(x)`` (Lightning runs the step through the module's ``__call__`` under DDP, so the model's forward is a call
inside a call), and its all-reduced gradients are scaled by 1.001 (what a corrupt device does to one replica).
"""

from __future__ import annotations

import argparse
import os
import time

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches
from runwatch.collectors.lightning import RunwatchCallback

CFG = TinyGPTConfig(d_model=16, num_layers=1)


class Job(pl.LightningModule):
    def __init__(self, slow_s: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model, self.slow_s = TinyGPT(CFG), slow_s
        self.faulty = int(os.environ["RANK"]) == 1

    def forward(self, batch_BT: torch.Tensor) -> torch.Tensor:
        return self.model(batch_BT)

    def training_step(self, batch_BT: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.faulty:
            time.sleep(self.slow_s)
        batch_BT = batch_BT.squeeze(0)
        logits = self(batch_BT[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), batch_BT[:, 1:].flatten())

    def on_after_backward(self) -> None:  # after DDP's all-reduce, before the callback reads the norm
        if self.faulty:
            with torch.no_grad():
                for p in self.parameters():
                    p.grad.mul_(1.001)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--slow-ms", type=float, default=10.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = synthetic_batches(CFG, batch_size=2)
    batches = [next(gen) for _ in range(args.steps)]
    trainer = pl.Trainer(max_steps=args.steps, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         callbacks=[RunwatchCallback(args.root, run=args.name)])
    trainer.fit(Job(args.slow_ms / 1000), torch.utils.data.DataLoader(batches, batch_size=None))


if __name__ == "__main__":
    main()
