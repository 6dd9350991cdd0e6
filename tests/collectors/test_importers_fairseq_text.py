"""fairseq plain-text logs (old ``| epoch`` and hydra-era ``| INFO | train_inner |`` lines) as fairseq prints them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from runwatch.collectors.importers import LogFormatError, detect_format, fairseq_text
from runwatch.data.store import Store

# fairseq 0.10-0.12 (hydra) stdout, `--log-format simple`, fp16 with an overflow burst inside an interval.
NEW = """2020-10-01 11:59:58 | INFO | fairseq_cli.train | model transformer_lm, criterion CrossEntropyCriterion
2020-10-01 11:59:59 | INFO | fairseq.trainer | begin training epoch 1
2020-10-01 12:00:00 | INFO | train_inner | epoch 001:    100 / 1000 loss=9.1, nll_loss=9.1, ppl=548.75, wps=20123.4, ups=1.52, wpb=13248, bsz=26, num_updates=100, lr=1.25e-05, gnorm=1.2, loss_scale=128, train_wall=66, gb_free=10.1, wall=70
2020-10-01 12:01:05 | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0
2020-10-01 12:01:06 | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 32.0
2020-10-01 12:01:10 | INFO | train_inner | epoch 001:    200 / 1000 loss=8.2, nll_loss=8.2, ppl=294.07, wps=20533.1, ups=1.55, wpb=13248, bsz=26, num_updates=198, lr=2.5e-05, gnorm=0.9, loss_scale=32, train_wall=64, gb_free=10.1, wall=135
2020-10-01 12:02:00 | INFO | fairseq_cli.train | begin validation on "valid" subset
2020-10-01 12:02:03 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 8.3 | nll_loss 8.3 | ppl 315.17 | wps 51234.5 | wpb 2039.1 | bsz 4 | num_updates 250 | best_loss 8.3
2020-10-01 12:02:04 | INFO | fairseq.checkpoint_utils | Saved checkpoint checkpoints/checkpoint_1_250.pt (epoch 1 @ 250 updates, score 8.3) (writing took 2.1 seconds)
2020-10-01 12:02:04 | INFO | fairseq_cli.train | end of epoch 1 (average epoch stats below)
2020-10-01 12:02:04 | INFO | train | epoch 001 | loss 8.6 | nll_loss 8.6 | ppl 388.02 | wps 20301 | ups 1.53 | wpb 13248 | bsz 26 | num_updates 250 | lr 3.125e-05 | gnorm 1.05 | loss_scale 32 | train_wall 160 | gb_free 10.1 | wall 166
2020-10-01 12:02:05 | INFO | fairseq.trainer | begin training epoch 2
2020-10-01 12:03:10 | INFO | train_inner | epoch 002:     50 / 1000 loss=7.9, nll_loss=7.9, ppl=238.86, wps=20712, ups=1.56, wpb=13248, bsz=26, num_updates=300, lr=3.75e-05, gnorm=0.8, loss_scale=32, train_wall=64, gb_free=10.1, wall=231
"""

# fairseq 0.6 stdout, `--log-format simple` (train_inner with `clip=0%`), the summary repeating the last inner step.
OLD = """| [en] dictionary: 40000 types
| num. model params: 213383168
| epoch 027:    100 / 377 loss=6.343, nll_loss=4.984, ppl=31.65, wps=164346, ups=0.4, wpb=364096, bsz=11907, num_updates=10100, lr=0.000626286, gnorm=0.390, clip=0%, oom=0, loss_scale=0.500, wall=23080, train_wall=21383
| WARNING: overflow detected, setting loss scale to: 0.25
| epoch 027:    200 / 377 loss=6.301, nll_loss=4.950, ppl=30.91, wps=164201, ups=0.4, wpb=364096, bsz=11907, num_updates=10199, lr=0.000626, gnorm=0.41, clip=100%, oom=0, loss_scale=0.250, wall=23330, train_wall=21600
| epoch 027 | loss 6.320 | nll_loss 4.970 | ppl 31.30 | wps 164300 | ups 0.4 | wpb 364096 | bsz 11907 | num_updates 10199 | lr 0.000626 | gnorm 0.400 | clip 50% | oom 0 | loss_scale 0.250 | wall 23331 | train_wall 21601
| epoch 027 | valid on 'valid' subset | valid_loss 8.30118 | valid_nll_loss 7.15366 | valid_ppl 142.39 | num_updates 10199 | best 4.46376
| saved checkpoint checkpoints/checkpoint27.pt (epoch 27 @ 10199 updates) (writing took 3.5 seconds)
"""


def _write(tmp_path: Path, text: str, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _rows(path: Path) -> dict[int, dict]:
    table = fairseq_text.parse([path]).metrics
    return {r["step"]: r for r in table.to_pylist()}


def test_new_format_rows_valid_summary_and_overflow_burst(tmp_path: Path) -> None:
    path = _write(tmp_path, NEW)
    parsed = fairseq_text.parse([path])
    rows = {r["step"]: r for r in parsed.metrics.to_pylist()}
    assert list(rows) == [100, 101, 198, 250, 300]
    first = rows[100]
    assert first["loss"] == 9.1 and first["grad_norm"] == 1.2 and first["lr"] == 1.25e-05
    assert first["loss_scale"] == 128 and first["wps"] == 20123.4 and first["gb_free"] == 10.1 and first["epoch"] == 1
    assert first["time"] == 1601553600.0  # 2020-10-01 12:00:00 UTC
    # Two warnings, no step printed: one row after the last logged update, at the last scale set.
    burst = rows[101]
    assert burst["found_inf"] is True and burst["loss_scale"] == 32.0 and burst["num_overflows"] == 2
    assert burst["time"] == 1601553666.0 and burst["loss"] is None
    # Validation and the end-of-epoch summary share one row at num_updates 250 (no train_inner there).
    at250 = rows[250]
    assert at250["val_loss"] == 8.3 and at250["val_best_loss"] == 8.3 and at250["val_wps"] == 51234.5
    assert at250["epoch_loss"] == 8.6 and at250["epoch_gnorm"] == 1.05 and at250["loss"] is None
    assert not parsed.breaks
    (ckpt,) = parsed.events
    assert ckpt["event"] == "checkpoint" and ckpt["step"] == 250 and ckpt["path"] == "checkpoints/checkpoint_1_250.pt"
    assert ckpt["write_seconds"] == 2.1 and ckpt["time"] == 1601553724.0


def test_old_format_summary_folds_into_last_inner_row(tmp_path: Path) -> None:
    parsed = fairseq_text.parse([_write(tmp_path, OLD)])
    rows = parsed.metrics.to_pylist()
    # The burst between 10100 and 10199 lands on 10101; the summary and valid lines fold into the 10199 row.
    assert [r["step"] for r in rows] == [10100, 10101, 10199]
    last = rows[2]
    assert last["loss"] == 6.301 and last["loss_scale"] == 0.25 and last["clip"] == 100.0  # train_inner values kept
    assert last["epoch_loss"] == 6.32 and last["epoch_clip"] == 50.0
    assert last["val_loss"] == 8.30118 and last["val_best"] == 4.46376 and last["time"] is None
    assert rows[0]["clip"] == 0.0 and rows[0]["oom"] == 0.0
    assert rows[1]["found_inf"] is True and rows[1]["loss_scale"] == 0.25 and rows[1]["num_overflows"] == 1
    assert parsed.events[0]["step"] == 10199 and parsed.events[0]["path"] == "checkpoints/checkpoint27.pt"


def test_summary_only_log_fills_main_columns(tmp_path: Path) -> None:
    """tqdm/none logs print only end-of-epoch lines (after the bar's \\r): they carry the run's loss."""
    text = ("| epoch 001:  99%|#########9| 376/377 [02:11<00:00, 2.9it/s, loss=7.1]\r"
            "| epoch 001 | loss 7.050 | ppl 132.5 | num_updates 377 | lr 0.0005 | gnorm 0.9 | loss_scale 8\n"
            "| epoch 001 | valid on 'valid' subset | valid_loss 6.9 | num_updates 377 | best 6.9\n"
            "| epoch 002:  50%|#####     | 188/377 [01:05<01:05, 2.9it/s, loss=6.8]\n"
            "| epoch 002 | loss 6.700 | ppl 104.0 | num_updates 754 | lr 0.0005 | gnorm 0.8 | loss_scale 16\n")
    rows = fairseq_text.parse([_write(tmp_path, text)]).metrics.to_pylist()
    assert [(r["step"], r["loss"], r["grad_norm"], r["loss_scale"]) for r in rows] == [(377, 7.05, 0.9, 8.0),
                                                                                      (754, 6.7, 0.8, 16.0)]
    assert rows[0]["val_loss"] == 6.9 and rows[0]["ppl"] == 132.5


def test_burst_folds_into_a_line_at_its_step_and_a_resume_breaks(tmp_path: Path) -> None:
    text = ("2021-01-01 00:00:00 | INFO | train_inner | epoch 001:     10 / 100 loss=5, num_updates=10, loss_scale=8\n"
            "2021-01-01 00:00:05 | INFO | fairseq.trainer | NOTE: overflow detected, setting loss scale to: 4.0\n"
            "2021-01-01 00:00:09 | INFO | train_inner | epoch 001:     11 / 100 loss=4.9, num_updates=11, loss_scale=4\n"
            "2021-01-01 01:00:00 | INFO | fairseq.checkpoint_utils | Loaded checkpoint checkpoints/checkpoint_last.pt"
            " (epoch 1 @ 10 updates)\n"
            "2021-01-01 01:00:09 | INFO | train_inner | epoch 001:     11 / 100 loss=4.8, num_updates=11, loss_scale=8\n")
    parsed = fairseq_text.parse([_write(tmp_path, text)])
    rows = parsed.metrics.to_pylist()
    assert [r["step"] for r in rows] == [10, 11, 11]
    assert rows[1]["found_inf"] is True and rows[1]["num_overflows"] == 1 and rows[1]["loss"] == 4.9
    assert rows[1]["loss_scale"] == 4.0 and rows[1]["time"] == 1609459209.0  # the line's own time and scale
    assert parsed.breaks == {2} and parsed.events[0]["event"] == "resume" and parsed.events[0]["step"] == 10


@pytest.mark.parametrize("line, where", [
    ("| epoch 001:    100 / 377 loss=abc, num_updates=100", "'loss=abc'"),
    ("| epoch 001 | loss 6.3 | ppl 30", "num_updates"),
    ("2020-10-01 12:00:00 | INFO | train_inner | epoch 001:    100 / 1000 loss=9.1, num_updates=1.5", "num_updates"),
    ("| epoch 001:    100 / ", "expected a fairseq progress line"),
])
def test_malformed_line_names_file_and_line(tmp_path: Path, line: str, where: str) -> None:
    path = _write(tmp_path, OLD + line + "\n")
    with pytest.raises(LogFormatError, match=rf"train\.log:{OLD.count(chr(10)) + 1}: .*{where}"):
        fairseq_text.parse([path])
    skipped = fairseq_text.parse([path], skip_bad_lines=True)
    assert skipped.num_skipped == 1 and skipped.metrics.num_rows == 3


def test_no_progress_lines_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(LogFormatError, match="no fairseq progress lines"):
        fairseq_text.parse([_write(tmp_path, "| [en] dictionary: 40000 types\n")])


JSON = ('2022-05-01 10:00:00 | INFO | train_inner | {"epoch": 1, "update": 0.1, "loss": "9.5", "gnorm": "1.5", '
        '"loss_scale": "64", "num_updates": "100", "lr": "1e-05", "wps": "1000"}\n')


def test_detection_keeps_json_and_text_apart(tmp_path: Path) -> None:
    assert detect_format(_write(tmp_path, NEW, "new.log")) == "fairseq"
    assert detect_format(_write(tmp_path, OLD, "old.log")) == "fairseq"
    # A --log-format json fp16 run prints the overflow NOTE as text: still a JSON log.
    note = "2022-05-01 10:00:01 | INFO | fairseq.trainer | NOTE: overflow detected, setting loss scale to: 32.0\n"
    json_path = _write(tmp_path, note + JSON, "json.log")
    assert detect_format(json_path) == "metaseq"
    # `import fairseq` still reads --log-format json (through the metaseq parser), as before.
    row = fairseq_text.parse([json_path]).metrics.to_pylist()[0]
    assert row["step"] == 100 and row["loss"] == 9.5 and row["grad_norm"] == 1.5 and row["wps"] == 1000


def test_other_formats_are_not_taken(tmp_path: Path) -> None:
    from tests.collectors.test_importers_new_formats import HF, NANOGPT, NEOX
    assert not fairseq_text.sniff(HF) and not fairseq_text.sniff(NANOGPT) and not fairseq_text.sniff(NEOX)
    megatron = (" iteration      100/  300000 | consumed samples:       102400 | elapsed time per iteration (ms): 1460.5"
                " | learning rate: 1.500E-05 | global batch size:  1024 | lm loss: 7.360790E+00 | loss scale: 4096.0 |"
                " grad norm: 2.162 | number of skipped iterations:   0 | number of nan iterations:   0 |\n")
    deepspeed = ("[2023-04-18 01:46:53,259] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=2, lr=[9.6e-06],"
                 " mom=[(0.9, 0.95)]\n")
    assert detect_format(_write(tmp_path, megatron, "m.log")) == "megatron"
    assert detect_format(_write(tmp_path, deepspeed, "d.log")) == "deepspeed"
    assert not fairseq_text.sniff(megatron + deepspeed)


def test_cli_import_and_check_finds_the_overflow(tmp_path: Path) -> None:
    path = _write(tmp_path, NEW)
    root = tmp_path / "store"
    cli = [sys.executable, "-m", "runwatch.app.cli"]
    done = subprocess.run([*cli, "import", "fairseq", str(path), "--root", str(root), "--run", "fs"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    store = Store(root)
    assert [s["segment"] for s in store.segments("fs").to_pylist()] == [0]
    rows = store.rows("fs").to_pylist()
    assert [r["step"] for r in rows] == [100, 101, 198, 250, 300]
    assert math.isclose(rows[1]["loss_scale"], 32.0) and rows[1]["found_inf"] is True
    checked = subprocess.run([*cli, "check", "--root", str(root), "--run", "fs", "--json"],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode in (0, 1), checked.stderr
    assert json.loads(checked.stdout)["segments"][0]["last_step"] == 300
