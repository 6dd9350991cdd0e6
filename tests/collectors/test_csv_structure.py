"""CSV and W&B exports: rows of the wrong shape name their line without echoing it; --skip-bad-lines works (issue 9.10)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runwatch.collectors.importers import LogFormatError, csv_log, import_logs, wandb
from runwatch.data.store import Store

ESCAPE = "\x1b[2J\x1b[H"  # erase the screen, home the cursor: must never reach a terminal raw


@pytest.mark.parametrize("module, header", [(csv_log, "step,loss"), (wandb, "_step,train/loss")])
def test_a_row_with_the_wrong_number_of_columns_names_its_line(tmp_path: Path, module, header: str) -> None:
    path = tmp_path / "h.csv"
    path.write_text(f"{header}\n1,2.0\n2,2.1\n3,2.2,{ESCAPE}extra\n4,2.3\n")
    with pytest.raises(LogFormatError) as caught:
        module.parse([path])
    message = str(caught.value)
    assert message == f"{path}:4: expected 2 columns (as in the header), got 3"
    assert "\x1b" not in message and "extra" not in message


@pytest.mark.parametrize("module, header", [(csv_log, "step,loss"), (wandb, "_step,train/loss")])
def test_skip_bad_lines_skips_bad_shapes_and_bad_values(tmp_path: Path, module, header: str) -> None:
    path = tmp_path / "h.csv"
    path.write_text(f"{header}\n1,2.0\n2,oops\n3,2.2,9\n\n4,2.3\n5.5,2.4\n6,2.5\n")
    parsed = module.parse([path], skip_bad_lines=True)
    assert parsed.num_skipped == 3  # a bad value, a row of three columns, a fractional step
    assert parsed.metrics["step"].to_pylist() == [1, 4, 6]
    assert parsed.metrics["loss"].to_pylist() == [2.0, 2.3, 2.5]
    with pytest.raises(LogFormatError, match=r"h.csv:4: expected 2 columns"):  # the file's shape is checked first
        module.parse([path])


def test_blank_lines_and_quoted_line_breaks_keep_line_numbers_right(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text('step,loss,note\n1,2.0,"two\nlines"\n\n2,2.1,x\n3,bad,y\n')
    with pytest.raises(LogFormatError, match=r"m.csv:6: expected a number for 'loss'"):
        csv_log.parse([path])


def test_a_bad_value_in_a_wandb_parquet_export_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "history.parquet"
    pq.write_table(pa.table({"_step": ["1", "2", "3"], "train/loss": ["2.0", "n/a", "1.8"]}), path)
    parsed = wandb.parse([path], skip_bad_lines=True)
    assert parsed.num_skipped == 1 and parsed.metrics["step"].to_pylist() == [1, 3]


def test_an_import_with_skipped_rows_lands_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("step,loss,tokens\n1,2.0,10\n2,2.1,1" + "0" * 400 + "\n3,2.2,30\n")
    result = import_logs("csv", [path], tmp_path / "root", "r", skip_bad_lines=True)
    assert (result.num_rows, result.num_skipped) == (2, 1)
    with Store(tmp_path / "root") as store:
        assert store.rows("r")["tokens"].to_pylist() == [10, 30]
