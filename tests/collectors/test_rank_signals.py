"""What each rank records for the fleet detectors: forward and input-wait timing, heartbeat, host registration."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest
import torch

from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches, train_step
from runwatch.collectors import Monitor
from runwatch.collectors.monitor import MonitorConfig
from runwatch.collectors.rank_signals import has_replicated_grads
from runwatch.data.storage import merge_run_meta, read_heartbeats, read_run_meta
from runwatch.data.store import Store
from tests.collectors.probes import RUNWATCH_DIR, SyncCounter

CFG = TinyGPTConfig(d_model=16, num_layers=1)


class SlowForward(torch.nn.Module):
    """A model whose forward pass takes a known time (a sleep; five times longer in eval mode)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.lin, self.seconds = torch.nn.Linear(4, 4), seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds if self.training else 5 * self.seconds)
        return self.lin(x)


def test_forward_and_input_wait_are_timed_without_a_sync(tmp_path: Path) -> None:
    model = SlowForward(0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = Monitor(tmp_path, "timed", model=model, config=MonitorConfig(flush_every_steps=4))
    with SyncCounter(only_from=RUNWATCH_DIR) as syncs:
        for step in range(6):
            time.sleep(0.03)  # the input wait (a slow loader)
            for _ in range(2):  # two micro-batches: forward time is their sum
                model(torch.randn(2, 4)).sum().backward()
            model.eval()
            model(torch.randn(2, 4))  # an evaluation forward does not count
            model.train()
            opt.step()
            opt.zero_grad()
            mon.step(step, loss=torch.tensor(1.0))
    mon.close()
    assert syncs.calls == [] and mon.num_errors == 0
    with Store(tmp_path) as store:
        rows = store.rows("timed").to_pylist()
    # Two training forwards of 0.1 s each; the 0.5 s evaluation forward is not counted (with it: 0.7 s and more).
    # The upper bounds leave room for a loaded machine's late wake-ups, not for the other passes.
    assert all(0.2 <= r["forward_time"] < 0.65 for r in rows)
    # The 0.03 s wait before the first forward of each step, without the forward passes (0.2 s) in it.
    assert rows[0]["data_time"] is None and all(0.03 <= r["data_time"] < 0.2 for r in rows[1:])


class CallsItself(torch.nn.Module):
    """What Lightning does under DDP: ``training_step`` runs through the module's ``__call__`` (its forward
    swapped for the step), and the step calls ``self(x)``: a forward inside the forward."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.lin, self.seconds = torch.nn.Linear(4, 4), seconds

    def forward(self, x: torch.Tensor, outer: bool = False) -> torch.Tensor:
        if not outer:
            return self.lin(x)
        time.sleep(self.seconds)  # the step's own work before it calls the model (a slow device, a hang)
        return self(x)


def test_a_forward_called_inside_the_forward_is_timed_from_the_outer_call(tmp_path: Path) -> None:
    """The nested call's pre-hook restarted the clock: the time before it was in neither ``data_time`` nor
    ``forward_time``, so a rank slowed there was no straggler and a hang there was pinned on no rank."""
    model = CallsItself(0.1)
    mon = Monitor(tmp_path, "nested", model=model, config=MonitorConfig(flush_every_steps=4))
    for step in range(4):
        model(torch.randn(2, 4), outer=True).sum().backward()
        mon.step(step, loss=torch.tensor(1.0))
    mon.close()
    with Store(tmp_path) as store:
        rows = store.rows("nested").to_pylist()
    assert mon.num_errors == 0 and all(0.1 <= r["forward_time"] < 0.45 for r in rows), rows


def test_the_heartbeat_says_how_far_the_rank_got(tmp_path: Path) -> None:
    model = TinyGPT(CFG)
    opt = torch.optim.AdamW(model.parameters())
    batches = synthetic_batches(CFG, batch_size=2)
    mon = Monitor(tmp_path, "beat", model=model, config=MonitorConfig(heartbeat_seconds=0.1))
    train_step(model, opt, next(batches))
    mon.step(0, loss=torch.tensor(2.0))
    inputs = next(batches)[:, :-1]
    model(inputs)  # the next forward pass began and ended; the rank now waits (backward, a collective)
    waiting = time.time()
    time.sleep(0.35)
    # A beat is due every 0.1 s; a loaded CI machine (two test workers, fsync on a busy disk) can hold one back
    # for longer than the sleep, so wait up to 5 s for the first beat written during the wait.
    deadline = time.time() + 5.0
    beat = read_heartbeats(tmp_path, "beat")[(0, 0)]
    while beat["time"] <= waiting and time.time() < deadline:
        time.sleep(0.05)
        beat = read_heartbeats(tmp_path, "beat")[(0, 0)]
    assert (beat["step"], beat["phase"], beat["rank"], beat["every_s"]) == (0, "backward", 0, 0.1)
    # It kept beating while the rank waited (a beat written during the wait: a loaded machine may delay one, not
    # all of them), and it says when the phase began.
    assert beat["time"] > waiting and beat["phase_time"] < beat["time"]
    mon.close()
    assert read_heartbeats(tmp_path, "beat")[(0, 0)]["phase"] == "closed"


def _register(args: tuple[str, int]) -> None:
    root, rank = args
    merge_run_meta(root, "job", {"hosts": {"0": {str(rank): f"node{rank}"}}})


def test_every_rank_registers_its_host_at_once_and_none_is_lost(tmp_path: Path) -> None:
    merge_run_meta(tmp_path, "job", {"host": "node0", "world_size": 16})
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        pool.map(_register, [(str(tmp_path), r) for r in range(16)])
    meta = read_run_meta(tmp_path, "job")
    assert meta["hosts"] == {"0": {str(r): f"node{r}" for r in range(16)}} and meta["world_size"] == 16


def test_replicated_gradients_are_detected_or_declared() -> None:
    model = torch.nn.Linear(2, 2)
    assert not has_replicated_grads(model, None) and has_replicated_grads(model, True)
    assert not has_replicated_grads(None, None)


def test_a_single_process_run_registers_rank_0(tmp_path: Path) -> None:
    mon = Monitor(tmp_path, "solo", model=torch.nn.Linear(2, 2), replicated_grads=False)
    mon.step(0, loss=torch.tensor(1.0))
    mon.close()
    meta = json.loads((tmp_path / "run=solo" / "run.json").read_text())
    assert meta["hosts"] == {"0": {"0": meta["host"]}} and meta["replicated_grads"] is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: forward timing by CUDA events read at flush")
def test_cuda_forward_time_comes_from_events_read_off_the_training_thread(tmp_path: Path) -> None:
    model = TinyGPT(CFG).cuda()
    opt = torch.optim.AdamW(model.parameters(), capturable=True)
    batches = synthetic_batches(CFG, batch_size=8)
    mon = Monitor(tmp_path, "cuda", model=model, config=MonitorConfig(flush_every_steps=5, param_checksum_every=2))
    batch = [next(batches).cuda() for _ in range(12)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any sync on the training thread raises
    try:
        for step in range(12):
            loss, grad_norm = train_step(model, opt, batch[step])
            mon.step(step, loss=loss, grad_norm=grad_norm)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    mon.close()
    assert mon.num_errors == 0
    with Store(tmp_path) as store:
        rows = store.rows("cuda").to_pylist()
    assert len(rows) == 12 and all(r["forward_time"] is not None and r["forward_time"] > 0 for r in rows)
    assert [r["param_norm"] is not None for r in rows] == [s % 2 == 0 for s in range(12)]


@pytest.mark.parametrize("finished", [True, False])
def test_a_run_closed_unfinished_is_called_stalled_when_it_does_not_come_back(tmp_path: Path, finished: bool) -> None:
    """``close(finished=False)`` (training stopped by an exception) keeps the run live, so that a run which does not
    come back is called stalled. A review: its heartbeat said "closed" all the same, the stall rule skips closed
    ranks, and the run read HEALTHY an hour later, where one killed before close() read STALLED. A finished run
    is not stalled, however long after."""
    from runwatch.app.check import run_check

    model = TinyGPT(CFG)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = synthetic_batches(CFG, 4, seed=0)
    mon = Monitor(tmp_path, "crashed", model=model, config=MonitorConfig(flush_every_steps=8))
    for step in range(40):
        loss, grad_norm = train_step(model, opt, next(data))
        mon.step(step, loss=loss, grad_norm=grad_norm)
    mon.close(finished=finished)
    later = run_check(tmp_path, "crashed", now=time.time() + 3600)
    assert later.health == ("healthy" if finished else "stalled"), later.findings
