"""Every line kind a format prints is read or counted, never fatal; checkpoints mean the state after update s.

Each case is a line (or a few) as the tool prints it, from the tool's source
or a real log: the import must succeed and put the value in its column.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runwatch.collectors.importers import (
    deepspeed,
    fairseq_text,
    hf_trainer,
    llmc,
    megatron,
    metaseq,
    modded_nanogpt,
    nanogpt,
)
from runwatch.collectors.importers.base import ParsedLog

MEG = (" iteration {it:8d}/    1000 | consumed samples: {s:12d} | elapsed time per iteration (ms): 1000.0 |"
       " learning rate: 1.000E-04 | global batch size:     4 | lm loss: 2.0E+00 | loss scale: 4096.0 |"
       " number of skipped iterations:   0 | number of nan iterations:   0 |")
DS = "[2023-04-18 01:46:53,259] [INFO] [{src}] {text}"
STEP10 = DS.format(src="logging.py:96:log_dist", text="[Rank 0] step=10, skipped=0, lr=[1e-05], mom=[(0.9, 0.95)]")


def _parse(tmp_path: Path, module, text: str) -> ParsedLog:
    path = tmp_path / "train.log"
    path.write_text(text)
    return module.parse([path])


def _rows(parsed: ParsedLog) -> dict[int, dict]:
    return {r["step"]: r for r in parsed.metrics.to_pylist()}


@pytest.mark.parametrize("module, text, step, column, value", [
    # llm.c's logger.h: s:%d eval:%.4f is the HellaSwag accuracy; unknown keys are extras.
    (llmc, "s:0 trl:3.0 lr:0.1 norm:1.0\ns:250 tel:2.5\ns:250 eval:0.2437\n", 250, "val_hellaswag_acc", 0.2437),
    (llmc, "s:0 trl:3.0 lr:0.1 norm:1.0\ns:1 lr:0.1 trl:2.9\n", 1, "loss", 2.9),
    (llmc, "s:0 trl:3.0 lr:0.1 norm:1.0\ns:1 trl:2.9 tok:524288\n", 1, "tok", 524288.0),
    # modded-nanogpt records after Nov 2024 print no training loss.
    (modded_nanogpt, "step:0/1770 val_loss:10.8258 train_time:0ms step_avg:0.03ms\n"
                     "step:1/1770 train_time:433ms step_avg:433.40ms\n", 1, "step_avg", 0.4334),
    # Megatron-LM: named validation sets, and the end-of-training lines on the validation and test sets.
    (megatron, MEG.format(it=10, s=40) + "\n validation-wiki loss at iteration 10 | lm loss value: 2.1E+00 |"
               " lm loss PPL: 8.1E+00 |\n", 10, "val_wiki_loss", 2.1),
    (megatron, MEG.format(it=10, s=40) + "\n validation loss at iteration 10 on validation set | lm loss value:"
               " 1.7E+00 | lm loss PPL: 5.4E+00 |\n", 10, "val_loss", 1.7),
    (megatron, MEG.format(it=10, s=40) + "\n validation loss at iteration 10 on test set | lm loss value: 1.8E+00 |"
               " lm loss PPL: 6.0E+00 |\n", 10, "test_ppl", 6.0),
    # DeepSpeed's fp16 optimizers spell the overflow differently from the ZeRO scaler.
    (deepspeed, STEP10 + "\n" + DS.format(src="fused_optimizer.py:171:step", text="[deepspeed] fp16 dynamic loss scale"
               " overflow! Skipping step. Attempted loss scale: 2048, reducing to 1024") + "\n", 11, "loss_scale", 1024.0),
    (deepspeed, STEP10 + "\n" + DS.format(src="fused_optimizer.py:269:step", text="[Rank 0] Overflow detected. Skipping"
               " step. Attempted loss scale: 2048.0, reducing to 1024.0") + "\n", 11, "attempted_loss_scale", 2048.0),
    # bf16 with a scaler: the overflow is printed without a scale.
    (deepspeed, STEP10 + "\n" + DS.format(src="loss_scaler.py:183:update_scale",
               text="[deepspeed] OVERFLOW! Rank 0 Skipping step.") + "\n", 11, "found_inf", True),
])
def test_known_line_kinds_are_read(tmp_path: Path, module, text: str, step: int, column: str, value: object) -> None:
    row = _rows(_parse(tmp_path, module, text))[step]
    assert row[column] == pytest.approx(value)


def test_deepspeed_other_ranks_copies_are_counted_not_read(tmp_path: Path) -> None:
    over = "[deepspeed] OVERFLOW! Rank {r} Skipping step. Attempted loss scale: 2048, reducing to 1024"
    text = "\n".join([STEP10] + [DS.format(src="stage_1_and_2.py:1769:step", text=over.format(r=r)) for r in range(4)])
    parsed = _parse(tmp_path, deepspeed, text + "\n")
    assert parsed.num_ignored == 3 and _rows(parsed)[11]["loss_scale"] == 1024.0 and len(_rows(parsed)) == 2


def test_hf_summary_and_final_save_are_counted_not_read(tmp_path: Path) -> None:
    text = ("{'loss': 2.5, 'learning_rate': 1e-05, 'epoch': 0.1}\n"
            "{'train_runtime': 12.0, 'train_samples_per_second': 3.0, 'train_loss': 2.5, 'epoch': 0.1}\n"
            "[INFO|trainer.py:2753] 2023-02-06 18:39:45,439 >> Saving model checkpoint to out\n")
    parsed = _parse(tmp_path, hf_trainer, text)
    assert parsed.num_ignored == 2 and parsed.metrics.num_rows == 1 and parsed.events == []


@pytest.mark.parametrize("module, text, expected", [
    # Megatron: "iteration k" is printed after update k; the save at iteration k holds k updates.
    (megatron, MEG.format(it=50, s=200) + "\nsaving checkpoint at iteration      50 to /ckpt\n"
               "  successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 50\n"
               + MEG.format(it=51, s=204) + "\n", [("checkpoint", 50), ("resume", 50)]),
    # HF Trainer: checkpoint-k is saved once global_step reached k.
    (hf_trainer, "\r  5%|▌         | 100/2000 [00:10<03:10,  9.90it/s]\r          \r"
                 "{'loss': 2.5, 'learning_rate': 1e-05, 'epoch': 0.1}\n"
                 "\r  5%|▌         | 100/2000 [00:10<03:10,  9.90it/s]"
                 "[INFO|trainer.py:2753] 2023-02-06 18:39:45,439 >> Saving model checkpoint to out/checkpoint-100\n"
                 "[INFO|trainer.py:1702] 2023-02-06 19:00:00,000 >>   Continuing training from global step 100\n",
     [("checkpoint", 100), ("resume", 100)]),
    # fairseq: "saved checkpoint ... (epoch E @ U updates" after U updates.
    (fairseq_text, "2020-10-01 12:00:00 | INFO | train_inner | epoch 001:    100 / 1000 loss=9.1, num_updates=500\n"
                   "2020-10-01 12:00:05 | INFO | fairseq.checkpoint_utils | Saved checkpoint c/c_1_500.pt (epoch 1 @ 500"
                   " updates, score 8.2) (writing took 3.5 seconds)\n"
                   "2020-10-01 13:00:00 | INFO | fairseq.trainer | Loaded checkpoint c/c_1_500.pt (epoch 1 @ 500 updates)\n"
                   "2020-10-01 13:00:10 | INFO | train_inner | epoch 001:    101 / 1000 loss=9.0, num_updates=501\n",
     [("checkpoint", 500), ("resume", 500)]),
    (metaseq, '2021-10-05 12:01:00 | INFO | train_inner | {"epoch": 1, "loss": "9.1", "num_updates": "500"}\n'
              "2021-10-05 12:02:40 | INFO | metaseq.checkpoint_utils | Saved checkpoint c/c_1_500.pt (epoch 1 @ 500"
              " updates, score 8.2)\n", [("checkpoint", 500)]),
    # nanoGPT saves ckpt.pt at the top of iteration k, before its update: the state after update k-1.
    (nanogpt, "step 3000: train loss 4.0390, val loss 4.0427\nsaving checkpoint to out\n"
              "iter 3000: loss 4.2490, time 35392.33ms, mfu 13.85%\nResuming training from out\n"
              "step 3000: train loss 4.0390, val loss 4.0427\niter 3000: loss 4.2490, time 35392.33ms, mfu 13.85%\n",
     [("checkpoint", 2999), ("resume", 2999)]),
    # DeepSpeed names a checkpoint global_stepN after N engine steps.
    (deepspeed, STEP10 + "\n" + DS.format(src="logging.py:96:log_dist", text="[Rank 0] Saving model checkpoint: "
               "out/global_step10/mp_rank_00_model_states.pt") + "\n", [("checkpoint", 10)]),
])
def test_checkpoint_step_is_the_state_after_that_update(tmp_path: Path, module, text: str,
                                                        expected: list[tuple[str, int]]) -> None:
    parsed = _parse(tmp_path, module, text)
    assert [(e["event"], e["step"]) for e in parsed.events] == expected


def test_nanogpt_resume_starts_a_segment_whose_first_step_follows_the_checkpoint(tmp_path: Path) -> None:
    from runwatch.collectors.importers import import_logs
    from runwatch.data.store import Store

    text = ("step 3000: train loss 4.0390, val loss 4.0427\nsaving checkpoint to out\n"
            "iter 3000: loss 4.2490, time 353.33ms, mfu 13.85%\niter 3010: loss 4.2, time 353.33ms, mfu 13.85%\n"
            "Resuming training from out\nstep 3000: train loss 4.0390, val loss 4.0427\n"
            "iter 3000: loss 4.2490, time 353.33ms, mfu 13.85%\n")
    path = tmp_path / "train.log"
    path.write_text(text)
    import_logs("nanogpt", [path], tmp_path / "store", "n")
    with Store(tmp_path / "store") as store:
        segs = [(s["segment"], s["first_step"]) for s in store.segments("n").to_pylist()]
        events = [(e["event"], e["step"], e["segment"]) for e in store.events("n").to_pylist()]
    assert segs == [(0, 3000), (1, 3000)]
    assert events == [("checkpoint", 2999, 0), ("resume", 2999, 1)]


def test_a_bar_per_epoch_counts_on_across_epochs(tmp_path: Path) -> None:
    """tqdm over each epoch's batches: the second epoch's 3/10 is step 13, not a restart at 3."""
    bar = "\r{pct:3d}%|{bar:10s}| {n}/10 [00:0{n}<00:10,  1.00s/it]"
    over = ("[2023-06-07 08:00:{s:02d},000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0"
            " Skipping step. Attempted loss scale: {old}, reducing to {new}\n")
    text = "".join(bar.format(pct=10 * n, bar="█" * n, n=n) for n in range(0, 11)) + "\n"
    text += "".join(bar.format(pct=10 * n, bar="█" * n, n=n) for n in range(0, 3))
    text += over.format(s=13, old=1024, new=512) + bar.format(pct=30, bar="███", n=3) + "\n"
    parsed = _parse(tmp_path, deepspeed, text)
    assert [(r["step"], r["loss_scale"]) for r in parsed.metrics.to_pylist()] == [(13, 512.0)]
    assert parsed.metrics["segment"].to_pylist() == [0]
