"""RunwatchCallback on real Lightning training of a tiny GPT on the CPU, read back from the store."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from runwatch.app.judge import judge_run
from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches
from runwatch.collectors.lightning import RunwatchCallback
from runwatch.collectors.signals import activation_rms
from runwatch.data.store import Store
from tests.collectors.probes import RUNWATCH_DIR, SyncCounter

torch.set_num_threads(1)
CFG = TinyGPTConfig(d_model=32, num_layers=2)
BATCH = 4


class Batches(Dataset):
    """A fixed list of token batches (each item is one whole batch)."""

    def __init__(self, n: int) -> None:
        gen = synthetic_batches(CFG, batch_size=BATCH)
        self.items = [next(gen) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.items[i]


def make_module(pl: object, inject_inf_at: frozenset[int] = frozenset(), tokens_of: object = None) -> object:
    """A LightningModule around TinyGPT that keeps, for the test, what the callback should record."""

    class TinyModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = TinyGPT(CFG)
            self.micro_losses: list[torch.Tensor] = []
            self.pre_clip_norms: list[torch.Tensor] = []
            self.used_scales: list[float] = []
            self.acts: list[torch.Tensor] = []
            self.model.blocks[-1].register_forward_hook(
                lambda m, i, out: self.acts.append(activation_rms(out)) if m.training else None)

        def training_step(self, batch_BT: torch.Tensor, batch_idx: int) -> dict:
            batch_BT = batch_BT.squeeze(0)
            logits = self.model(batch_BT[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch_BT[:, 1:].flatten())
            self.micro_losses.append(loss.detach())
            tokens = batch_BT[:, :-1].numel() if tokens_of is None else tokens_of(batch_idx)
            return {"loss": loss, "tokens": tokens}

        def on_after_backward(self) -> None:
            if self.global_step + 1 in inject_inf_at:
                self.model.head.weight.grad[0, 0] = float("inf")

        def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
            # After unscaling, before clipping (callbacks ran just before): the test's own syncs.
            grads = [p.grad for p in self.parameters() if p.grad is not None]
            self.pre_clip_norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
            scaler = getattr(self.trainer.precision_plugin, "scaler", None)
            if scaler is not None:
                self.used_scales.append(scaler.get_scale())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=3e-3)

    return TinyModule()


def _trainer(pl: object, root: Path, run: str, max_steps: int, activation_module: str | None = None,
             **kw: object) -> tuple[object, RunwatchCallback]:
    callback = RunwatchCallback(root / "store", run=run, activation_module=activation_module)
    extra = kw.pop("callbacks", [])
    trainer = pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=str(root), callbacks=[callback, *extra], **kw)
    return trainer, callback


def test_fit_checkpoints_and_resume_are_recorded(tmp_path: Path) -> None:
    import lightning.pytorch as pl

    data = DataLoader(Batches(40), batch_size=None)
    ckpt_dir = tmp_path / "ckpt"
    # Keep the latest two: the step-4 checkpoint is deleted once step 12 is saved.
    saver = pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=4, save_top_k=2, monitor="step",
                                         mode="max")
    trainer, callback = _trainer(pl, tmp_path, "lt", 12, callbacks=[saver], gradient_clip_val=0.1,
                                 accumulate_grad_batches=2)
    module = make_module(pl)
    with SyncCounter(only_from=RUNWATCH_DIR) as syncs:
        trainer.fit(module, data)
    assert syncs.calls == []  # none by runwatch, over a whole fit (hooks, wrappers, flushes)
    assert callback.monitor.num_errors == 0

    with Store(tmp_path / "store") as store:
        rows = store.rows("lt")
        events = store.events("lt").to_pylist()
    assert rows["step"].to_pylist() == list(range(1, 13))  # the k-th update is step k
    micro = torch.stack(module.micro_losses).double()
    torch.testing.assert_close(torch.tensor(rows["loss"].to_pylist(), dtype=torch.float64),
                               micro.view(12, 2).mean(1))  # accumulated: the mean of the two micro-batches
    # Lightning's own clipping norm (kept from its clip_grad_norm_ call: pre-clip), not the clipped one.
    assert callback._clip_reports
    torch.testing.assert_close(torch.tensor(rows["grad_norm"].to_pylist(), dtype=torch.float64),
                               torch.stack(module.pre_clip_norms).double())
    assert min(rows["grad_norm"].to_pylist()) > 0.1
    torch.testing.assert_close(torch.tensor(rows["act_norm"].to_pylist(), dtype=torch.float64),
                               torch.stack(module.acts[1::2]).double())  # the step's last micro-batch
    assert rows["tokens"].to_pylist() == [2 * k * BATCH * CFG.seq_len for k in range(1, 13)]
    assert set(rows["lr"].to_pylist()) == {3e-3} and rows["loss_scale"].null_count == 12
    checkpoints = [(e["step"], json.loads(e["payload"])) for e in events if e["event"] == "checkpoint"]
    assert [s for s, _ in checkpoints] == [4, 8, 12]
    for step, payload in checkpoints[1:]:
        path = Path(payload["path"])
        assert path.name == f"epoch=0-step={step}.ckpt" and payload["bytes"] == path.stat().st_size
        assert 0 < payload["write_seconds"] < 60
    assert checkpoints[0][1]["bytes"] > 0 and not Path(checkpoints[0][1]["path"]).exists()
    deleted = [(e["step"], json.loads(e["payload"])) for e in events if e["event"] == "note"]
    assert deleted == [(12, {"path": checkpoints[0][1]["path"], "deleted": True, "checkpoint_step": 4})]

    # Resume from the step-8 checkpoint: a new segment, a resume event at step 8, rows from 9 on.
    resume_from = ckpt_dir / "epoch=0-step=8.ckpt"
    trainer2, callback2 = _trainer(pl, tmp_path, "lt", 11, accumulate_grad_batches=2)
    trainer2.fit(make_module(pl), data, ckpt_path=str(resume_from))
    with Store(tmp_path / "store") as store:
        segments = store.segments("lt").to_pylist()
        resume = [e for e in store.events("lt").to_pylist() if e["event"] == "resume"]
        main = store.main_line("lt")
    assert [(s["segment"], s["first_step"], s["last_step"], s["abandoned_from"]) for s in segments] == [
        (0, 1, 12, 9), (1, 9, 11, None)]
    assert [(e["segment"], e["step"]) for e in resume] == [(1, 8)]
    assert json.loads(resume[0]["payload"])["checkpoint"] == str(resume_from)
    assert main["step"].to_pylist() == list(range(1, 12))
    # The data position came back with the checkpoint: no reset to zero on resume.
    assert main["tokens"].to_pylist()[8:] == [2 * k * BATCH * CFG.seq_len for k in range(9, 12)]


def test_loss_scale_of_an_explicit_fp16_scaler(tmp_path: Path) -> None:
    """On the CPU, precision="16-mixed" becomes bf16 without a scaler: the scaler path needs the plugin given."""
    import lightning.pytorch as pl
    from lightning.pytorch.plugins import MixedPrecision

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=4)
    infs = frozenset({3, 9, 10})
    trainer, callback = _trainer(pl, tmp_path, "fp16", 14, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    module = make_module(pl, inject_inf_at=infs)
    with SyncCounter(only_from=RUNWATCH_DIR) as syncs:
        trainer.fit(module, DataLoader(Batches(20), batch_size=None))
    assert syncs.calls == []
    with Store(tmp_path / "store") as store:
        rows = store.rows("fp16")
        meta = store.meta("fp16")
    assert rows["step"].to_pylist() == list(range(1, 15))
    assert rows["loss_scale"].to_pylist() == module.used_scales  # the scale each update's backward used
    assert rows["found_inf"].to_pylist() == [s in infs for s in range(1, 15)]
    changes = [b / a for a, b in zip(module.used_scales, module.used_scales[1:]) if a != b]
    assert 2.0 in changes and 0.5 in changes  # growth and backoff both happened
    assert all(math.isfinite(x) for x in rows["loss"].to_pylist())
    assert meta["precision"] == "16-mixed" and meta["scaler"]["init_scale"] == 2.0**10
    assert meta["framework"].startswith("lightning ")


def test_pytorch_lightning_import_works_too(tmp_path: Path) -> None:
    pl = importlib.import_module("pytorch_lightning")
    trainer, callback = _trainer(pl, tmp_path, "ptl", 4, activation_module="model.blocks.0")  # a named module
    assert isinstance(callback, pl.Callback)
    module = make_module(pl)
    first_block: list[torch.Tensor] = []
    module.model.blocks[0].register_forward_hook(lambda m, i, out: first_block.append(activation_rms(out)))
    trainer.fit(module, DataLoader(Batches(8), batch_size=None))
    with Store(tmp_path / "store") as store:
        rows = store.rows("ptl")
        meta = store.meta("ptl")
    assert rows["step"].to_pylist() == [1, 2, 3, 4] and rows["grad_norm"].null_count == 0
    torch.testing.assert_close(torch.tensor(rows["act_norm"].to_pylist(), dtype=torch.float64),
                               torch.stack(first_block).double())
    assert meta["framework"].startswith("pytorch_lightning ") and meta["finished"] is True


def test_a_failing_hook_never_interrupts_training(tmp_path: Path) -> None:
    """Token counts whose shapes change make the callback's own addition raise: counted, and training goes on.

    (The first bad count is rejected by Monitor.step, which warns once; the
    failed additions after it are counted by the hook's guard. Without the
    guard the RuntimeError would end the fit at the second batch.)
    """
    import lightning.pytorch as pl

    trainer, callback = _trainer(pl, tmp_path, "bad", 6)
    module = make_module(pl, tokens_of=lambda i: torch.ones(2 + i % 2))  # (2,), then (3,): cannot be added
    with pytest.warns(RuntimeWarning, match="runwatch: .* failed"):
        trainer.fit(module, DataLoader(Batches(8), batch_size=None))
    assert trainer.global_step == 6 and callback.monitor.num_errors >= 3
    with Store(tmp_path / "store") as store:
        assert store.meta("bad")["finished"] is True  # the run was still closed normally


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: a real GradScaler and real host-device syncs")
def test_fp16_on_cuda_the_callback_never_syncs(tmp_path: Path) -> None:
    """Every hook of the callback that runs per step runs under ``set_sync_debug_mode("error")``.

    A synchronising CUDA call inside a hook raises there; the callback counts it
    in ``monitor.num_errors`` instead of interrupting training, so zero errors
    means zero syncs. Lightning's own code between the hooks runs normally.
    """
    import lightning.pytorch as pl

    def strict(hook: object) -> object:
        def run(*args: object, **kw: object) -> object:
            torch.cuda.set_sync_debug_mode("error")
            try:
                return hook(*args, **kw)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        return run

    with pytest.raises(RuntimeError, match="synchroniz"):  # the probe itself can fail
        strict(lambda: torch.ones(1, device="cuda").item())()
    infs = frozenset({3, 9, 10})
    callback = RunwatchCallback(tmp_path / "store", run="cuda16")
    for name in ("on_before_optimizer_step", "on_train_batch_end"):
        setattr(callback, name, strict(getattr(callback, name)))
    trainer = pl.Trainer(max_steps=14, accelerator="cuda", devices=1, precision="16-mixed", logger=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=str(tmp_path), callbacks=[callback])
    module = make_module(pl, inject_inf_at=infs)
    with SyncCounter(only_from=RUNWATCH_DIR) as syncs:
        trainer.fit(module, DataLoader(Batches(20), batch_size=None))
    assert syncs.calls == [] and callback.monitor.num_errors == 0
    with Store(tmp_path / "store") as store:
        rows = store.rows("cuda16")
    assert rows["step"].to_pylist() == list(range(1, 15))
    assert rows["loss_scale"].to_pylist() == module.used_scales
    assert rows["found_inf"].to_pylist() == [s in infs for s in range(1, 15)]
    assert rows["loss"].to_pylist() == pytest.approx([x.item() for x in module.micro_losses], rel=1e-6)


@pytest.mark.integration
def test_under_ddp_a_rank_slowed_inside_its_step_and_a_perturbed_replica_are_found(tmp_path: Path) -> None:
    """Two ranks under ``torchrun`` with Lightning's DDP strategy (``lightning_job.py``). Rank 1's ``training_step``
    sleeps 10 ms before it calls ``self(x)``: the model's forward is a call inside the step's call, and its time
    was lost (no straggler, and a hang there pinned on no rank). Its all-reduced gradients are off by 0.1%: the
    callback passed the unwrapped module, so the run was recorded without replicated gradients and the
    disagreement was never looked for. Both fail on 3a4887b."""
    job = Path(__file__).with_name("lightning_job.py")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(job), "--root", str(tmp_path), "--name", "ddp", "--steps", "200", "--slow-ms", "10"],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with Store(tmp_path) as store:
        report, meta = judge_run(store, "ddp"), store.meta("ddp")
    assert meta["replicated_grads"] is True
    alarms = [(f.kind, f.rank, f.evidence.get("section")) for f in report.findings
              if f.kind in ("straggler", "rank_disagreement") and f.severity != "info"]
    assert ("straggler", 1, "forward") in alarms and ("rank_disagreement", 1, None) in alarms, alarms
