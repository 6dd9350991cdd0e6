"""A W&B run-history export: CSV or Parquet with ``_step``, ``_runtime``, ``_timestamp`` and metric columns.

``_step`` -> step (the trainer's own step instead where the export has it:
``trainer/global_step``, ``train/global_step``, ``global_step``; W&B's row
counter is then the extra ``wandb_step``), ``_timestamp`` -> time (unix
seconds), ``_runtime`` -> ``runtime`` extra; metric names map like TensorBoard tags (``loss``,
``train/loss`` -> loss, ``train/grad_norm`` -> grad_norm, ``lr``, ``val/loss`` ->
val_loss, ...); other numeric columns become extras; text and media columns are
dropped. Rows are history rows in export order, so a rewound run (step going
backwards) becomes a new segment, and an hour without a row starts one too.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.csv_log import read_csv_strings, to_record
from runwatch.collectors.importers.tensorboard import column_for as tag_column
from runwatch.collectors.importers.textlog import (
    build_table,
    fold_repeated_steps,
    parse_each,
    time_gap_breaks,
)

SPECIAL = {"_step": "step", "_timestamp": "time", "_runtime": "runtime"}
TRAINER_STEPS = ("trainer/global_step", "train/global_step", "global_step")
"""The trainer's own step, which Lightning's ``WandbLogger`` and Hugging Face's ``WandbCallback`` log with every
history row. W&B's ``_step`` counts history rows: every validation or log call adds one, so it runs ahead of the
trainer's step (an HF run logging every 10 updates read as steps 0-32, its fault at update 160 as step 16)."""


def sniff(head: str) -> bool:
    """A CSV header with ``_step``, or a Parquet file (W&B's Parquet history export)."""
    if head.startswith("PAR1"):
        return True
    first = head.split("\n", 1)[0]
    return "_step" in [c.strip().strip('"') for c in first.split(",")]


def _column_for(raw: str) -> str | None:
    if raw in SPECIAL:
        return SPECIAL[raw]
    if raw.startswith("_") or raw in ("step", "time"):
        return None  # W&B bookkeeping (``_wandb``) or a shadow of the special columns
    return tag_column(raw)


def _read(path: Path, skip_bad_lines: bool) -> tuple[pa.Table, np.ndarray, int]:
    """The history as strings, each row's line (its row number in Parquet), rows skipped as malformed."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"PAR1":
        try:
            table = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as err:
            raise LogFormatError(path, None, f"expected a readable Parquet history export ({err})") from None
        keep = [c for c in table.column_names if pa.types.is_integer(table.schema.field(c).type)
                or pa.types.is_floating(table.schema.field(c).type) or pa.types.is_boolean(table.schema.field(c).type)
                or pa.types.is_string(table.schema.field(c).type)]
        table = table.select(keep)
        strings = pa.table({c: pc.cast(pc.cast(table[c], pa.float64()) if pa.types.is_boolean(table[c].type)
                                       else table[c], pa.string()) for c in keep})
        return strings, np.arange(strings.num_rows) + 1, 0
    return read_csv_strings(path, skip_bad_lines)


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    with open(path, "rb") as f:
        head = f.read(4096).decode("utf-8", errors="replace")
    if not sniff(head):  # one line that says what the file is not (a TensorBoard file read as CSV said ":3: 2 columns")
        raise LogFormatError(path, 1, "not a W&B history export (a CSV whose header has '_step', or a Parquet file)")
    table, lines, num_invalid = _read(path, skip_bad_lines)
    if "_step" not in table.column_names:
        raise LogFormatError(path, 1, "expected a W&B history export with a '_step' column")
    if table.num_rows == 0:
        raise LogFormatError(path, None, f"no history rows found in {path}")
    table = _trainer_step(table)
    columns, num_skipped = to_record(table, path, _column_for, lines, True, skip_bad_lines)
    # Export order is the run's order: sort nothing. Rows of one trainer step (a training and a validation log
    # call) are one row, the later value of a column kept, as TensorBoard reads a step logged again.
    metrics = fold_repeated_steps(build_table(columns))
    breaks = time_gap_breaks(metrics["time"].to_numpy(zero_copy_only=False)) if "time" in columns else set()
    return ParsedLog(metrics, breaks=breaks, num_skipped=num_invalid + num_skipped)


def _trainer_step(table: pa.Table) -> pa.Table:
    """``_step`` replaced by the trainer's step where the export has one (``TRAINER_STEPS``), W&B's row counter
    kept as the extra ``wandb_step``. A row without the trainer's step (a call that did not log it) takes the
    step of the row before it (of the first row that has one, before any does)."""
    raw = next((c for c in TRAINER_STEPS if c in table.column_names), None)
    if raw is None:
        return table
    col = table[raw].combine_chunks()
    col = pc.if_else(pc.equal(pc.utf8_trim_whitespace(col), ""), pa.scalar(None, pa.string()), col)
    if col.null_count == len(col):
        return table
    step = pc.fill_null_backward(pc.fill_null_forward(col))
    rest = [c for c in table.column_names if c not in ("_step", raw)]
    return pa.table({"_step": step, "wandb_step": table["_step"], **{c: table[c] for c in rest}})


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    return parse_each(paths, parse_file, skip_bad_lines)
