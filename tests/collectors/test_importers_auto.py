"""`runwatch import auto` on stdouts that interleave tools: every reading's signal lands, on the right steps.

The fixtures (tests/fixtures/synthetic, see SOURCE.md there) have the shape of
real logs; each reproduces a failure of the first-sniffer-wins detection.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from runwatch.collectors.importers import auto, detect_format, import_logs
from runwatch.collectors.importers.base import ParsedLog
from runwatch.data.record import metrics_table
from runwatch.data.store import Store

SYNTHETIC = Path(__file__).resolve().parents[1] / "fixtures" / "synthetic"


def _import_cli(tmp_path: Path, name: str) -> tuple[dict[int, dict], list[dict], dict]:
    """Import a fixture with `runwatch import auto`, then read it back: rows by step, events, run meta."""
    root = tmp_path / "store"
    done = subprocess.run([sys.executable, "-m", "runwatch.app.cli", "import", "auto", str(SYNTHETIC / name),
                           "--root", str(root), "--run", "r"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with Store(root) as store:
        rows = store.rows("r").to_pylist()
        events = store.events("r").to_pylist()
        meta = store.meta("r")
    by_step = {r["step"]: r for r in rows}
    assert len(by_step) == len(rows), "one row per step"
    return by_step, events, meta


def test_llmc_hellaswag_lines_are_a_validation_column(tmp_path: Path) -> None:
    rows, _, meta = _import_cli(tmp_path, "llmc_hellaswag_main.log")
    assert meta["source"] == "import:llmc"
    assert (rows[100]["loss"], rows[100]["val_loss"], rows[100]["val_hellaswag_acc"]) == (3.531, 3.581, 0.25)
    assert rows[300]["val_hellaswag_acc"] == 0.27 and rows[300]["loss"] is None
    assert sum(r["val_hellaswag_acc"] is not None for r in rows.values()) == 4
    assert sum(r["loss"] is not None for r in rows.values()) == 300


def test_megatron_deepspeed_stdout_keeps_the_loss_and_the_overflows(tmp_path: Path) -> None:
    # DeepSpeed's step=0 is in the first 256 KiB, the first iteration line is not: the old auto read DeepSpeed only.
    text = (SYNTHETIC / "megatron_deepspeed_stdout.log").read_text()
    assert text.index("step=0,") < 256 * 1024 < text.index(" iteration ")
    rows, events, meta = _import_cli(tmp_path, "megatron_deepspeed_stdout.log")
    assert meta["source"] == "import:megatron+deepspeed"
    assert [s for s in sorted(rows) if rows[s]["loss"] is not None] == [10, 20, 30, 40, 50, 60]
    assert rows[10]["loss"] == pytest.approx(2.0 + 8.0 * np.exp(-10 / 60) + 0.03)
    # Megatron's own columns: the loss scale it prints and the interval's skips end at step 20.
    assert (rows[10]["loss_scale"], rows[20]["loss_scale"]) == (4096.0, 1024.0)
    assert rows[20]["found_inf"] is True and rows[20]["skipped_iterations"] == 2 and rows[30]["found_inf"] is False
    # DeepSpeed's columns Megatron lacks: each overflow at its own step (timestamps between step=10 and step=20).
    assert (rows[17]["attempted_loss_scale"], rows[18]["attempted_loss_scale"]) == (4096.0, 2048.0)
    assert rows[17]["loss"] is None and rows[20]["skipped_steps"] == 2 and rows[20]["time"] is not None
    checkpoints = [(e["event"], e["step"]) for e in events]
    assert checkpoints == [("checkpoint", 50)]  # Megatron's and DeepSpeed's save line: one event


def test_hf_trainer_deepspeed_stdout_keeps_the_overflows(tmp_path: Path) -> None:
    rows, events, meta = _import_cli(tmp_path, "hf_trainer_deepspeed_stdout.log")
    assert meta["source"] == "import:hf-trainer+deepspeed"
    # The Trainer's dicts at the training steps the bar shows (not 1, 2, 3, ...).
    assert [s for s in sorted(rows) if rows[s]["loss"] is not None] == list(range(10, 201, 10))
    assert rows[100]["val_loss"] == pytest.approx(rows[100]["loss"] + 0.1) and rows[100]["epoch"] == 0.5
    # Overflows print during the update after the bar's count: steps 1-4 and 137-138.
    flagged = {s: r["loss_scale"] for s, r in rows.items() if r["found_inf"]}
    assert flagged == {1: 32768.0, 2: 16384.0, 3: 8192.0, 4: 4096.0, 137: 2048.0, 138: 1024.0}
    assert [(e["event"], e["step"]) for e in events] == [("checkpoint", 100)]
    assert meta["ignored_lines"] == 1  # the end-of-training summary dict


def test_deepspeed_overflows_take_the_tqdm_step(tmp_path: Path) -> None:
    rows, _, meta = _import_cli(tmp_path, "deepspeed_tqdm_overflow.log")
    assert meta["source"] == "import:deepspeed"
    flagged = {s: r["loss_scale"] for s, r in rows.items() if r["found_inf"]}
    assert flagged == {9: 8388608.0, 10: 4194304.0, 11: 2097152.0, 12: 1048576.0, 250: 524288.0}


@pytest.mark.parametrize("name, expected", [
    ("llmc_hellaswag_main.log", "llmc"),
    ("megatron_deepspeed_stdout.log", "megatron+deepspeed"),
    ("hf_trainer_deepspeed_stdout.log", "hf-trainer+deepspeed"),
    ("deepspeed_tqdm_overflow.log", "deepspeed"),
])
def test_detect_format_names_the_joined_reading(name: str, expected: str) -> None:
    assert detect_format(SYNTHETIC / name) == expected


def _parsed(rows: list[dict], positions: list[float] | None, **kw: object) -> ParsedLog:
    return ParsedLog(metrics_table(rows), positions=None if positions is None else np.array(positions, float), **kw)


def test_join_places_rows_by_stream_position_across_a_restart() -> None:
    """A row of the other reading joins the segment of the next primary row printed after it."""
    primary = _parsed([{"step": s, "loss": 1.0} for s in (10, 20, 30, 15, 25)], [1, 2, 3, 10, 12],
                      breaks={3})
    other = _parsed([{"step": 20, "loss_scale": 8.0}, {"step": 20, "loss_scale": 4.0}, {"step": 40, "loss_scale": 2.0}],
                    [1.5, 11, 20])
    joined = auto.join(primary, other)
    got = sorted((r["segment"], r["step"], r["loss"], r["loss_scale"]) for r in joined.metrics.to_pylist())
    assert got == [(0, 10, 1.0, None), (0, 20, 1.0, 8.0), (0, 30, 1.0, None),
                   (1, 15, 1.0, None), (1, 20, None, 4.0), (1, 25, 1.0, None), (1, 40, None, 2.0)]


def test_join_keeps_the_primarys_columns_and_events() -> None:
    primary = _parsed([{"step": 1, "loss": 2.0, "lr": 0.1}], [0], events=[{"event": "checkpoint", "step": 1}])
    other = _parsed([{"step": 1, "lr": 0.5, "loss_scale": 4.0}], [0],
                    events=[{"event": "checkpoint", "step": 1}, {"event": "checkpoint", "step": 2}])
    joined = auto.join(primary, other)
    (row,) = joined.metrics.to_pylist()
    assert (row["lr"], row["loss_scale"]) == (0.1, 4.0)
    assert [(e["event"], e["step"]) for e in joined.events] == [("checkpoint", 1), ("checkpoint", 2)]


def test_join_without_positions_pairs_segments_in_order() -> None:
    primary = _parsed([{"step": s, "loss": 1.0} for s in (1, 2, 1, 2)], None)
    other = _parsed([{"step": s, "grad_norm": float(s)} for s in (2, 1)], None)
    rows = auto.join(primary, other).metrics.to_pylist()
    assert [(r["segment"], r["step"], r["grad_norm"]) for r in rows] == [(0, 1, None), (0, 2, 2.0), (1, 1, 1.0),
                                                                          (1, 2, None)]


def test_ordinal_readings_are_not_joined(tmp_path: Path) -> None:
    """Without a bar, HF dicts are numbered in order: joining DeepSpeed's steps onto them would misplace them."""
    text = ("{'loss': 2.5, 'learning_rate': 1e-05, 'epoch': 0.1}\n"
            "[2023-06-07 08:00:01,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping"
            " step. Attempted loss scale: 65536, reducing to 32768\n"
            "{'loss': 2.4, 'learning_rate': 1e-05, 'epoch': 0.2}\n")
    path = tmp_path / "a.log"
    path.write_text(text)
    name, parsed = auto.read([path])
    assert name == "hf-trainer" and parsed.ordinal_steps and parsed.metrics["step"].to_pylist() == [1, 2]


def test_the_reading_with_most_signal_is_primary(tmp_path: Path) -> None:
    """Many overflow rows and few dicts: DeepSpeed is primary, the Trainer's loss still lands."""
    bar = "\r  1%|          | {n}/500 [00:0{k}<00:10,  1.00s/it]"
    text = ""
    for n in range(1, 31):
        text += bar.format(n=n - 1, k=n % 10)
        text += (f"[2023-06-07 08:00:{n:02d},000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0"
                 f" Skipping step. Attempted loss scale: {2 ** (31 - n)}, reducing to {2 ** (30 - n)}\n")
    text += bar.format(n=30, k=0) + "\r" + " " * 40 + "\r{'loss': 9.5, 'learning_rate': 1e-05, 'epoch': 0.06}\n"
    text += bar.format(n=30, k=0) + "\n"
    path = tmp_path / "b.log"
    path.write_text(text)
    result = import_logs("auto", [path], tmp_path / "store", "b")
    assert result.format == "deepspeed+hf-trainer"
    with Store(tmp_path / "store") as store:
        rows = {r["step"]: r for r in store.rows("b").to_pylist()}
    assert rows[30]["loss"] == 9.5 and rows[30]["found_inf"] is True and rows[1]["loss_scale"] == 2 ** 29


def test_a_malformed_line_in_any_reading_is_an_error(tmp_path: Path) -> None:
    meg = (" iteration       10/     100 | lm loss: 2.0E+00 | loss scale: 4096.0 | number of skipped iterations:   0 |\n"
           "[2023-06-07 08:00:01,000] [INFO] [x] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: x\n")
    path = tmp_path / "c.log"
    path.write_text(meg)
    with pytest.raises(ValueError, match=r"c\.log:2: expected 'Attempted loss scale"):
        auto.read([path])
    name, parsed = auto.read([path], skip_bad_lines=True)
    assert name == "megatron" and parsed.num_skipped == 1


def test_cli_json_meta_names_the_reading(tmp_path: Path) -> None:
    rows, _, meta = _import_cli(tmp_path, "megatron_deepspeed_stdout.log")
    assert json.loads(json.dumps(meta))["source_files"][0].endswith("megatron_deepspeed_stdout.log")
    assert isinstance(rows[0]["time"], float) and pa.types.is_floating(pa.array([rows[17]["time"]]).type)
