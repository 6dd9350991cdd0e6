"""A real run with injected crashes: a tiny GPT trained on the CPU under ``Monitor``, saving real checkpoints
(``torch.save`` plus a known pause, a slow filesystem), crashing with an exception at planned steps and
resumed from a planned checkpoint after a known downtime. ``Truth`` is what the harness saw with its own
bookkeeping: the tests compare ``runwatch advise`` with it.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches, train_step
from runwatch.collectors import Monitor
from runwatch.collectors.monitor import MonitorConfig

CFG = TinyGPTConfig(d_model=32, num_layers=2)
BATCH = 8


class InjectedCrash(RuntimeError):
    """What a dead node looks like from the training loop."""


@dataclass(kw_only=True, frozen=True)
class CrashPlan:
    """Where the run crashes and what it resumes from (steps are optimizer steps, one batch each)."""

    total: int = 120
    every: int = 20
    """Checkpoint every this many steps (after the step's update: the README loop)."""
    crashes: tuple[tuple[int, int], ...] = ((67, 40), (95, 80))
    """(crash after this step's row, resume from this checkpoint); the first resumes from an older checkpoint
    than the newest (a rollback past a suspect one), so a checkpoint lies on the abandoned branch."""
    save_pause: float = 0.2
    """Seconds each save blocks beyond torch.save (a slow filesystem): the checkpoint cost to find."""
    downtime: float = 0.5
    """Seconds between a crash and the restart (rescheduling the job)."""
    pass_write_seconds: bool = True
    """Whether the loop passes its measured save time to ``Monitor.checkpoint``."""


@dataclass
class Truth:
    """What the harness measured with its own clock and counters."""

    write_seconds: dict[tuple[int, int], float] = field(default_factory=dict)
    """(segment, step) -> the save's blocking time, timed around it by the loop."""
    sizes: dict[tuple[int, int], int] = field(default_factory=dict)
    row_time: dict[tuple[int, int], float] = field(default_factory=dict)
    """(segment, step) -> wall clock right after ``mon.step`` returned."""
    paths: dict[int, Path] = field(default_factory=dict)

    def seconds_per_step(self, segment: int) -> float:
        times = [t for (seg, _), t in sorted(self.row_time.items()) if seg == segment]
        return statistics.median(b - a for a, b in itertools.pairwise(times))


def _segment(root: Path, run: str, plan: CrashPlan, truth: Truth, segment: int, start: int,
             crash_at: int | None, resume_from: int | None) -> None:
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    if resume_from is not None:
        state = torch.load(truth.paths[resume_from], weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    batches = synthetic_batches(CFG, BATCH)
    for _ in range(start):  # the data position after `start` steps
        next(batches)
    mon = Monitor(root, run, model=model, config=MonitorConfig(flush_every_steps=16),
                  resume_step=resume_from, resume_checkpoint=None if resume_from is None else truth.paths[resume_from])
    assert mon.segment == segment
    crashed = False
    try:
        for step in range(start, plan.total):
            loss, grad_norm = train_step(model, optimizer, next(batches))
            mon.step(step, loss=loss, grad_norm=grad_norm, lr=3e-3, tokens=(step + 1) * BATCH * CFG.seq_len)
            truth.row_time[(segment, step)] = time.time()
            if step == crash_at:
                raise InjectedCrash(f"injected crash after step {step}")
            if step % plan.every == 0 and step > 0:
                path = root / "ckpt" / f"seg{segment}-step{step}.pt"
                t0 = time.perf_counter()
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
                time.sleep(plan.save_pause)
                seconds = time.perf_counter() - t0
                truth.write_seconds[(segment, step)] = seconds
                truth.sizes[(segment, step)] = path.stat().st_size
                truth.paths[step] = path
                mon.checkpoint(step, path, write_seconds=seconds if plan.pass_write_seconds else None)
    except InjectedCrash:
        crashed = True
    finally:
        mon.close(finished=not crashed)  # a crashed run stays live, as the README's loop does


def train_with_crashes(root: Path, run: str, plan: CrashPlan = CrashPlan()) -> Truth:
    """Train ``run`` under ``root`` through every planned crash and resume; return the harness's truth."""
    torch.set_num_threads(1)
    (root / "ckpt").mkdir(parents=True, exist_ok=True)
    truth = Truth()
    start, resume_from = 0, None
    for segment, (crash_at, resume_step) in enumerate([*plan.crashes, (None, None)]):
        _segment(root, run, plan, truth, segment, start, crash_at, resume_from)
        if crash_at is None:
            break
        time.sleep(plan.downtime)
        start, resume_from = resume_step + 1, resume_step
    return truth
