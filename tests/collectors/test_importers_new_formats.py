"""nanoGPT, Hugging Face Trainer and GPT-NeoX (megatron) lines as those programs print them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from runwatch.collectors.importers import LogFormatError, detect_format, hf_trainer, megatron, nanogpt

NANOGPT = """Overriding config with config/train_gpt2.py:
tokens per iteration will be: 491,520
number of parameters: 123.69M
using fused AdamW: True
step 0: train loss 10.9876, val loss 10.9880
iter 0: loss 10.9903, time 30728.83ms, mfu -100.00%
iter 10: loss 9.1234, time 1099.34ms, mfu 15.34%
step 20: train loss 8.0390, val loss 8.0427
saving checkpoint to out
iter 20: loss 8.2490, time 35392.33ms, mfu 13.85%
iter 30: loss nan, time 1019.95ms, mfu 14.12%
"""

HF = """***** Running training *****
  Num examples = 1000
 3%|▎         | 10/300 [00:05<02:10,  2.2it/s]{'loss': 2.3456, 'grad_norm': 1.234, 'learning_rate': 4.9e-05, 'epoch': 0.01}
{'loss': nan, 'grad_norm': tensor(nan, device='cuda:0'), 'learning_rate': 4.8e-05, 'epoch': 0.02}
{'eval_loss': 2.1, 'eval_runtime': 3.2, 'eval_samples_per_second': 10.5, 'epoch': 0.02}
{'loss': '2.346', 'grad_norm': '1.234', 'learning_rate': '4.7e-05', 'epoch': '0.03'}
{'train_runtime': 100.5, 'train_samples_per_second': 3.0, 'train_steps_per_second': 0.3, 'train_loss': 2.4, 'epoch': 0.03}
"""

NEOX = """NeoXArgs.from_ymls() ['configs/125M.yml']
 samples/sec: 51.234 | iteration       10/      50 | elapsed time per iteration (ms): 9876.5 | learning rate: 1.234E-04 | approx flops per GPU: 150.3TFLOPS | lm_loss: 7.123456E+00 | loss scale: 65536.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
 samples/sec: 51.234 | iteration       20/      50 | elapsed time per iteration (ms): 9876.5 | learning rate: 1.234E-04 | approx flops per GPU: 1.2PFLOPS | lm_loss: 6.123456E+00 | loss scale: 65536.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
 validation results at iteration 20 | lm_loss value: 6.9E+00 | lm_loss_ppl value: 990 |
 iteration       30/      50 | elapsed time per iteration (ms): 9876.5 | learning rate: 1.234E-04 | approx flops per GPU: 150.3TFLOPS | lm_loss: 5.123456E+00 | loss scale: 32768.0 | number of skipped iterations:   1 | number of nan iterations:   0 |
"""


def _write(tmp_path: Path, text: str, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_nanogpt_rows_eval_fold_and_checkpoint(tmp_path: Path) -> None:
    path = _write(tmp_path, NANOGPT)
    assert detect_format(path) == "nanogpt"
    parsed = nanogpt.parse([path])
    rows = {r["step"]: r for r in parsed.metrics.to_pylist()}
    assert sorted(rows) == [0, 10, 20, 30]
    assert rows[0]["mfu"] is None  # -100.00% means "not measured yet"
    assert rows[10]["loss"] == 9.1234 and rows[10]["step_time"] == pytest.approx(1.09934) and rows[10]["mfu"] == 15.34
    assert rows[20]["val_loss"] == 8.0427 and rows[20]["eval_train_loss"] == 8.039 and rows[20]["loss"] == 8.249
    assert math.isnan(rows[30]["loss"])
    # Saved at the top of iteration 20, before its update: the state after update 19.
    assert parsed.events == [{"event": "checkpoint", "step": 19, "path": "out/ckpt.pt", "overwrites": True,
                              "row_index": 3}]


def test_nanogpt_timestamps_and_old_lr_format(tmp_path: Path) -> None:
    path = _write(tmp_path, "2023-03-22 09:30:39 iter 5: loss 3.9883, time 1099.34ms, lr 6.00e-04\n")
    row = nanogpt.parse([path]).metrics.to_pylist()[0]
    assert row["time"] == 1679477439.0 and row["lr"] == 6e-4


def test_nanogpt_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "iter 1: loss 2.0, time 5.0ms, mfu 1.00%\niter 2: loss ??, time 5ms\n")
    with pytest.raises(LogFormatError, match=r"train\.log:2: expected a nanoGPT line"):
        nanogpt.parse([path])
    assert nanogpt.parse([path], skip_bad_lines=True).num_skipped == 1


def test_hf_trainer_dicts_numbered_in_order(tmp_path: Path) -> None:
    path = _write(tmp_path, HF)
    assert detect_format(path) == "hf-trainer"
    rows = hf_trainer.parse([path]).metrics.to_pylist()
    assert [r["step"] for r in rows] == [1, 2, 3]  # the summary dict is not a row
    assert rows[0]["loss"] == 2.3456 and rows[0]["grad_norm"] == 1.234 and rows[0]["lr"] == 4.9e-05
    assert math.isnan(rows[1]["loss"]) and math.isnan(rows[1]["grad_norm"])  # tensor(nan, ...) read as NaN
    assert rows[1]["val_loss"] == 2.1 and rows[1]["eval_runtime"] == 3.2 and rows[1]["epoch"] == 0.02
    assert rows[2]["loss"] == 2.346 and rows[2]["epoch"] == 0.03  # recent versions print quoted floats


def test_hf_trainer_state_json_uses_real_steps(tmp_path: Path) -> None:
    state = {"global_step": 50, "log_history": [
        {"epoch": 0.1, "grad_norm": 1.0, "learning_rate": 1e-5, "loss": 2.0, "step": 25},
        {"epoch": 0.2, "grad_norm": 0.9, "learning_rate": 2e-5, "loss": 1.8, "step": 50},
        {"epoch": 0.2, "eval_loss": 1.9, "eval_runtime": 2.0, "step": 50}]}
    path = _write(tmp_path, json.dumps(state, indent=2), "trainer_state.json")
    assert detect_format(path) == "hf-trainer"
    rows = hf_trainer.parse([path]).metrics.to_pylist()
    assert [r["step"] for r in rows] == [25, 50]
    assert rows[1]["val_loss"] == 1.9 and rows[1]["loss"] == 1.8


def test_hf_trainer_without_dicts_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(LogFormatError, match="no Trainer log dicts"):
        hf_trainer.parse([_write(tmp_path, "nothing here\n")])


def test_gpt_neox_lines_read_by_megatron(tmp_path: Path) -> None:
    path = _write(tmp_path, NEOX)
    assert detect_format(path) == "megatron"
    rows = {r["step"]: r for r in megatron.parse([path]).metrics.to_pylist()}
    assert sorted(rows) == [10, 20, 30]
    assert rows[10]["loss"] == pytest.approx(7.123456) and rows[10]["samples_sec"] == 51.234
    assert rows[10]["approx_flops_per_gpu"] == pytest.approx(150.3e12)
    assert rows[20]["approx_flops_per_gpu"] == pytest.approx(1.2e15)
    assert rows[20]["val_loss"] == 6.9 and rows[20]["val_ppl"] == 990
    assert rows[30]["found_inf"] is True and rows[30]["loss_scale"] == 32768.0 and rows[30]["samples_sec"] is None


def test_gpt_neox_bad_flops_unit_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, " iteration 1/ 5 | approx flops per GPU: 1.2XFLOPS | lm_loss: 2.0 |\n")
    with pytest.raises(LogFormatError, match="train.log:1"):
        megatron.parse([path])
