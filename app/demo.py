"""``runwatch demo``: record real tiny training runs with faults, then serve the dashboard on them.

Everything shown is real: a tiny GPT trains on the CPU under ``Monitor``
(fp32 with a GradScaler, so the loss scale is recorded), checkpoints are real
``torch.save`` files, and the faults are what goes wrong in real pre-training:

- ``demo-rollback``: a few corrupted batches with an LR burst (a spike that
  recovers by itself), then an LR jump that sticks (a loss that does not come
  back); the run is restarted from the last checkpoint before it with the
  suspect batches skipped, leaving the bad stretch as an abandoned branch.
- ``demo-diverged``: the same faults with nobody on call yet: action needed.
- ``demo-healthy``: the same recipe without faults.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from runwatch.app.progress import Progress

if TYPE_CHECKING:  # torch is imported only when the demo trains: the dashboard works without it
    import torch

    from runwatch.collectors import Monitor

DEMO_RUNS = ("demo-rollback", "demo-diverged", "demo-healthy")
CHECKPOINT_DIR = "checkpoints"  # under the root, beside the run=<id> folders (never read as runs)


@dataclass(kw_only=True, frozen=True)
class DemoPlan:
    """Where the faults go; steps are optimizer steps (one batch each)."""

    num_steps: int = 480
    """Steps of the healthy run and of the rollback run's second segment end."""
    checkpoint_every: int = 40
    """Checkpoint interval in steps."""
    bad_batches: tuple[int, int] = (100, 103)
    """Corrupted batches (uniform random tokens) trained with a 10x LR burst: a spike that recovers."""
    lr_jump_at: int = 200
    """From here the LR is 100x and stays there: a loss that does not recover."""
    stop_after_jump: int = 220
    """How long the faulty segment runs on before someone stops it (the spike detector
    calls a loss that stays up for 200 steps unrecovered: action needed)."""
    rollback_after_jump: int | None = None
    """How long the rollback run's faulty segment runs before the restart (None: ``stop_after_jump``)."""
    skip_batches: int = 20
    """Batches skipped after the rollback, from ``lr_jump_at`` on (the PaLM recipe)."""
    batch_size: int = 16
    base_lr: float = 3e-3
    seed: int = 0

    @property
    def rollback_step(self) -> int:
        """The last clean checkpoint before the LR jump: checkpoint k holds the update of step k, and the first
        update with the jumped LR is ``lr_jump_at`` (its loss shows at the next step), so it is the latest
        checkpoint at or before ``lr_jump_at - 1``."""
        return (self.lr_jump_at - 1) // self.checkpoint_every * self.checkpoint_every


def _batches(plan: DemoPlan, seed: int, start: int) -> Iterator:
    from runwatch.app.tinygpt import TinyGPTConfig, synthetic_batches

    it = synthetic_batches(TinyGPTConfig(), plan.batch_size, seed=seed)
    for _ in range(start):  # the data position after `start` steps: deterministic, so a resume sees the same data
        next(it)
    return it


def _inject_faults(plan: DemoPlan, step: int, batch: torch.Tensor, lr: float, mon: Monitor) -> tuple[torch.Tensor, float]:
    """What goes wrong at ``step``: corrupted batches with an LR burst, then an LR jump that sticks."""
    import torch

    from runwatch.app.tinygpt import TinyGPTConfig

    if plan.bad_batches[0] <= step <= plan.bad_batches[1]:
        batch = torch.randint(0, TinyGPTConfig().vocab_size, batch.shape)  # uniform noise, not the Markov text
        lr *= 10.0
    if step >= plan.lr_jump_at:
        if step == plan.lr_jump_at:
            mon.event("config", step, lr_multiplier=100.0, note="pushed config with a 100x learning rate")
        lr *= 100.0
    return batch, lr


def _train_segment(root: Path, run: str, plan: DemoPlan, *, start: int, stop: int, faults: bool,
                   progress: Progress, resume_from: Path | None = None, skip: tuple[int, int] | None = None,
                   finished: bool = False) -> None:
    """Train steps [start, stop) under a fresh Monitor (a new segment), checkpointing as it goes.

    ``finished``: the run ends here normally and says so (a ``note`` event with
    status "finished"), so the dashboard does not call it stalled later.
    """
    import torch

    from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, cosine_lr, set_lr, train_step
    from runwatch.collectors import Monitor
    from runwatch.collectors.monitor import MonitorConfig

    seed = plan.seed + (1 if run == "demo-diverged" else 0)  # its own curve; healthy and rollback share one
    torch.manual_seed(seed)
    cfg = TinyGPTConfig()
    model = TinyGPT(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=plan.base_lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**14, growth_interval=50)
    if resume_from is not None:
        state = torch.load(resume_from, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
    data = _batches(plan, seed, start)
    ckpt_dir = root / CHECKPOINT_DIR / run
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    # A resume from the checkpoint of step s (the state after update s) trains on from step s + 1.
    mon = Monitor(root, run, model=model, scaler=scaler, activation_module=model.blocks[-1],
                  config=MonitorConfig(flush_every_steps=25, flush_every_seconds=2.0),
                  resume_step=start - 1 if resume_from is not None else None, resume_checkpoint=resume_from,
                  skip_batches=skip, meta={"demo": True})
    with mon:
        for step in range(start, stop):
            batch = next(data)
            if skip is not None and skip[0] <= step <= skip[1]:
                progress.advance(f"{run} skip {step}")  # the skipped batch is consumed, not trained on
                continue
            lr = cosine_lr(step, base_lr=plan.base_lr, warmup=30, total=plan.num_steps + 100)
            if faults:
                batch, lr = _inject_faults(plan, step, batch, lr, mon)
            set_lr(optimizer, lr)
            loss, grad_norm = train_step(model, optimizer, batch, scaler=scaler)
            tokens = (step + 1) * plan.batch_size * cfg.seq_len
            mon.step(step, loss=loss, grad_norm=grad_norm, lr=lr, tokens=tokens, samples=(step + 1) * plan.batch_size)
            if step > 0 and step % plan.checkpoint_every == 0 and step < stop - 1:
                # The README loop: after step s's update, save and record checkpoint s.
                path = ckpt_dir / f"step-{step:06d}.pt"
                t0 = time.perf_counter()
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "scaler": scaler.state_dict(), "step": step}, path)
                mon.checkpoint(step, path, write_seconds=time.perf_counter() - t0)
            progress.advance(f"{run} step {step}")
        if finished:
            mon.event("note", stop - 1, status="finished", note="training completed")


def record_demo(root: str | Path, plan: DemoPlan | None = None, *, runs: tuple[str, ...] = DEMO_RUNS,
                progress_out: TextIO = sys.stderr) -> list[str]:
    """Record the demo runs (all, or the named subset) under ``root``; returns their names."""
    plan = plan or DemoPlan()
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    fault_stop = plan.lr_jump_at + plan.stop_after_jump
    resume = plan.rollback_step
    rollback_stop = plan.lr_jump_at + (plan.stop_after_jump if plan.rollback_after_jump is None
                                       else plan.rollback_after_jump)
    cost = {"demo-healthy": plan.num_steps, "demo-diverged": fault_stop,
            "demo-rollback": rollback_stop + plan.num_steps - resume - 1}
    progress = Progress(sum(cost[r] for r in runs), "recording the demo runs", progress_out, unit="steps")
    if "demo-healthy" in runs:
        _train_segment(root, "demo-healthy", plan, start=0, stop=plan.num_steps, faults=False,
                       progress=progress, finished=True)
    if "demo-diverged" in runs:  # nobody has acted yet, and the trainer died: action needed, then stalled
        _train_segment(root, "demo-diverged", plan, start=0, stop=fault_stop, faults=True, progress=progress)
    if "demo-rollback" in runs:
        _train_segment(root, "demo-rollback", plan, start=0, stop=rollback_stop, faults=True, progress=progress)
        checkpoint = root / CHECKPOINT_DIR / "demo-rollback" / f"step-{resume:06d}.pt"
        skip = (plan.lr_jump_at, plan.lr_jump_at + plan.skip_batches - 1)
        _train_segment(root, "demo-rollback", plan, start=resume + 1, stop=plan.num_steps, faults=False,
                       progress=progress, resume_from=checkpoint, skip=skip, finished=True)
    progress.close("done")
    return list(runs)


def has_demo(root: Path) -> bool:
    from runwatch.data.storage import data_files

    return all(data_files(root, run, "metrics") for run in DEMO_RUNS)


def clear_demo(root: Path) -> None:
    """Remove only what the demo wrote (its runs and checkpoints), never anything else under root."""
    from runwatch.data.storage import run_dir

    for run in DEMO_RUNS:
        shutil.rmtree(run_dir(root, run), ignore_errors=True)
        shutil.rmtree(root / CHECKPOINT_DIR / run, ignore_errors=True)


def main(args: argparse.Namespace) -> int:
    try:
        import torch
    except ImportError as err:
        raise RuntimeError("the demo trains a model: pip install 'runwatch[torch]' (or torch)") from err
    root = Path(args.root).expanduser().resolve()
    if not args.no_dashboard:  # a taken port fails now, not after a minute of training
        from runwatch.app.serve import check_port

        check_port(args.host, args.port)
    if getattr(args, "fresh", False) or (root.exists() and not has_demo(root)):
        clear_demo(root)
    if has_demo(root):
        print(f"demo runs already recorded under {root} (pass --fresh to record them again)")
    else:
        torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
        print(f"recording the demo runs under {root} (real CPU training, about a minute)")
        t0 = time.perf_counter()
        record_demo(root)
        print(f"recorded {', '.join(DEMO_RUNS)} in {time.perf_counter() - t0:.0f} s")
    if args.no_dashboard:
        print(f"open it with: runwatch dashboard --root {root}")
        return 0
    from runwatch.app.serve import serve

    return serve(root, host=args.host, port=args.port)
