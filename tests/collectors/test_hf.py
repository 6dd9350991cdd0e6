"""RunwatchTrainerCallback on real Hugging Face Trainer training of a tiny GPT-2 built from a config (no download)."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from the hub: the model is built from a config in code

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from runwatch.app.tinygpt import TinyGPTConfig, synthetic_batches
from runwatch.collectors.hf import RunwatchTrainerCallback
from runwatch.data.store import Store
from tests.collectors.probes import RUNWATCH_DIR, SyncCounter

torch.set_num_threads(1)
SEQ = 32
TOKENS = TinyGPTConfig(vocab_size=64, seq_len=SEQ)


def _dataset(n: int) -> list[dict[str, torch.Tensor]]:
    batches = synthetic_batches(TOKENS, batch_size=n)
    ids = next(batches)[:, :SEQ]
    return [{"input_ids": row, "labels": row} for row in ids]


def _model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2))


def _trainer(tmp_path: Path, run: str, max_steps: int, **kw: object) -> tuple[Trainer, RunwatchTrainerCallback]:
    callback = RunwatchTrainerCallback(tmp_path / "store", run=run)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=max_steps, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, learning_rate=3e-3, max_grad_norm=0.1, logging_steps=1,
        save_strategy="steps", save_steps=4, save_total_limit=2, report_to=[], include_num_input_tokens_seen="all",
        disable_tqdm=True, seed=0, dataloader_num_workers=0, **{"use_cpu": True, **kw})
    return Trainer(model=_model(), args=args, train_dataset=_dataset(96), callbacks=[callback]), callback


def test_trainer_loss_grad_norm_checkpoints_and_resume(tmp_path: Path) -> None:
    trainer, callback = _trainer(tmp_path, "hf", 12)
    with SyncCounter(only_from=RUNWATCH_DIR) as syncs:
        trainer.train()
    assert syncs.calls == [] and syncs.num_other > 0  # the Trainer syncs for its own logs; runwatch never
    assert callback.monitor.num_errors == 0
    logged = [h for h in trainer.state.log_history if "grad_norm" in h]  # the Trainer's own, via .item()

    with Store(tmp_path / "store") as store:
        rows = store.rows("hf")
        events = store.events("hf").to_pylist()
    assert rows["step"].to_pylist() == list(range(1, 13)) == [h["step"] for h in logged]
    assert rows["loss"].to_pylist() == pytest.approx([h["loss"] for h in logged], rel=1e-6)
    assert rows["grad_norm"].to_pylist() == pytest.approx([h["grad_norm"] for h in logged], rel=1e-6)
    assert min(rows["grad_norm"].to_pylist()) > 0.1  # pre-clip (max_grad_norm=0.1), as the Trainer reports it
    assert rows["lr"].to_pylist() == pytest.approx([h["learning_rate"] for h in logged])
    assert rows["tokens"].to_pylist() == [k * 2 * 4 * SEQ for k in range(1, 13)]
    assert rows["act_norm"].null_count == 0 and rows["loss_scale"].null_count == 12  # CPU: no scaler

    checkpoints = [(e["step"], json.loads(e["payload"])) for e in events if e["event"] == "checkpoint"]
    assert [(s, Path(p["path"]).name) for s, p in checkpoints] == [(4, "checkpoint-4"), (8, "checkpoint-8"),
                                                                    (12, "checkpoint-12")]
    assert all(p["bytes"] > 10_000 and 0 < p["write_seconds"] < 60 for _, p in checkpoints)
    notes = [(e["step"], json.loads(e["payload"])) for e in events if e["event"] == "note"]
    # save_total_limit=2 deleted checkpoint-4 when checkpoint-12 was written.
    assert notes == [(12, {"path": checkpoints[0][1]["path"], "deleted": True, "checkpoint_step": 4})]

    # resume_from_checkpoint: a new segment from checkpoint-8, its first row at step 9.
    trainer2, _ = _trainer(tmp_path, "hf", 10)
    trainer2.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-8"))
    with Store(tmp_path / "store") as store:
        segments = store.segments("hf").to_pylist()
        resume = [e for e in store.events("hf").to_pylist() if e["event"] == "resume"]
        main = store.main_line("hf")
        meta = store.meta("hf")
    assert [(s["segment"], s["first_step"], s["last_step"], s["abandoned_from"]) for s in segments] == [
        (0, 1, 12, 9), (1, 9, 10, None)]
    assert [(e["segment"], e["step"]) for e in resume] == [(1, 8)]
    assert json.loads(resume[0]["payload"])["checkpoint"] == str(tmp_path / "out" / "checkpoint-8")
    assert main["step"].to_pylist() == list(range(1, 11))
    assert main["tokens"].to_pylist()[8:] == [k * 2 * 4 * SEQ for k in (9, 10)]  # restored with the state
    assert meta["framework"].startswith("transformers ") and meta["finished"] is True


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Trainer has a GradScaler only for fp16 on CUDA")
def test_fp16_loss_scale_on_cuda(tmp_path: Path) -> None:
    trainer, callback = _trainer(tmp_path, "hf16", 8, fp16=True, use_cpu=False)
    used: list[float] = []

    class ScaleProbe(TrainerCallback):
        def on_pre_optimizer_step(self, args: object, state: object, control: object, **kw: object) -> None:
            used.append(trainer.accelerator.scaler.get_scale())  # the test's own sync, after unscaling

    trainer.add_callback(ScaleProbe())
    with SyncCounter(only_from=RUNWATCH_DIR) as syncs:  # the Trainer's own logging syncs; runwatch must not
        trainer.train()
    assert syncs.calls == []
    with Store(tmp_path / "store") as store:
        rows = store.rows("hf16")
        meta = store.meta("hf16")
    assert rows["loss_scale"].to_pylist() == used and rows["found_inf"].null_count == 0
    assert meta["precision"] == "fp16-mixed" and meta["scaler"]["init_scale"] == used[0]
    assert callback.monitor.num_errors == 0


def test_an_object_store_root_a_relative_output_dir_and_the_batches_a_resume_skips(
        tmp_path: Path, s3_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The callback made a ``Path`` of its root: ``s3://bucket/prefix`` became a local folder named ``s3:``, and
    nothing reached the bucket. A relative ``output_dir`` was stored as it was, so a checkpoint's file was
    looked for from the CLI's or the dashboard's own directory. Fails on 3a4887b."""
    from tests.collectors.test_monitor_s3 import FAST

    monkeypatch.chdir(tmp_path)

    def trainer(max_steps: int, skip: tuple[int, int] | None = None) -> Trainer:
        callback = RunwatchTrainerCallback(s3_root, run="hf-s3", spool=tmp_path / "spool", upload=FAST,
                                           skip_batches=skip)
        args = TrainingArguments(output_dir="out", max_steps=max_steps, per_device_train_batch_size=4,
                                 learning_rate=3e-3, logging_steps=1, save_strategy="steps", save_steps=4,
                                 report_to=[], disable_tqdm=True, seed=0, use_cpu=True)
        return Trainer(model=_model(), args=args, train_dataset=_dataset(96), callbacks=[callback])

    trainer(8).train()
    trainer(10, skip=(5, 6)).train(resume_from_checkpoint="out/checkpoint-4")
    assert not (tmp_path / "s3:").exists()
    with Store(s3_root) as store:
        segments = [(s["segment"], s["first_step"], s["last_step"]) for s in store.segments("hf-s3").to_pylist()]
        events = store.events("hf-s3").to_pylist()
    assert segments == [(0, 1, 8), (1, 5, 10)], segments
    ckpt = str(tmp_path / "out" / "checkpoint-4")
    paths = [json.loads(e["payload"])["path"] for e in events if e["event"] == "checkpoint"]
    assert paths[:2] == [ckpt, str(tmp_path / "out" / "checkpoint-8")], paths
    [resume] = [json.loads(e["payload"]) for e in events if e["event"] == "resume"]
    assert resume["checkpoint"] == ckpt and resume["skip_batches"] == [5, 6], resume
