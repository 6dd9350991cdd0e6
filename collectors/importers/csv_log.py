"""Generic CSV: a header row naming record columns (``step`` required), one row per step.

``step,time,loss,grad_norm,loss_scale,lr,found_inf,my_metric``. Record
columns must hold numbers (``found_inf``: true/false/1/0); an empty cell is
null, ``nan``/``inf`` are kept as data; any other column of numbers becomes an
extra scalar (name sanitised to ``[a-z0-9_]``). Named ``csv_log`` so it does
not shadow the standard library's ``csv``.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import (
    NUMBER_RE, build_table, merge_same_step, parse_each, sanitize_name, to_float, to_int,
)
from runwatch.data.record import METRIC_COLUMNS

_NUMBER_OR_EMPTY = rf"^\s*(?:{NUMBER_RE})?\s*$"
_BOOL = {"true": True, "false": False, "1": True, "0": False, "1.0": True, "0.0": False, "": None}


def sniff(head: str) -> bool:
    """True when the first line is a comma-separated header with a ``step`` column."""
    first = head.split("\n", 1)[0].strip().lower()
    return "," in first and "step" in [c.strip().strip('"') for c in first.split(",")]


def read_csv_strings(path: Path) -> pa.Table:
    """Every cell as a string, so number errors can name their line."""
    try:
        with open(path, "rb") as f:
            header = f.readline().decode("utf-8", errors="replace")
        names = next(iter(csv.reader([header.rstrip("\r\n").replace("\r", " ")])), [])
        opts = pacsv.ConvertOptions(column_types={n: pa.string() for n in names}, strings_can_be_null=False)
        return pacsv.read_csv(path, convert_options=opts)
    except (pa.ArrowInvalid, csv.Error) as err:
        m = re.search(r"[Rr]ow #(\d+)", str(err))
        raise LogFormatError(path, int(m.group(1)) if m else None, f"expected a well-formed CSV row ({err})") from None


def _found_inf(values: pa.Array, lines: np.ndarray, path: Path) -> pa.Array:
    out = []
    for i, v in enumerate(values.to_pylist()):
        key = (v or "").strip().lower()
        if key not in _BOOL:
            raise LogFormatError(path, int(lines[i]), f"expected true/false/1/0 for 'found_inf', got {v!r}")
        out.append(_BOOL[key])
    return pa.array(out, pa.bool_())


def to_record(table: pa.Table, path: Path, column_for: Callable[[str], str | None], first_line: int,
              drop_text_columns: bool) -> dict[str, pa.Array]:
    """Columns of the record from a table of strings; ``column_for`` maps a header to a column or None."""
    lines = np.arange(table.num_rows) + first_line
    out: dict[str, pa.Array] = {}
    for raw in table.column_names:
        name = column_for(raw)
        if name is None or name in out:
            continue
        values = table[raw].combine_chunks()
        if values.type != pa.string():
            values = pc.cast(values, pa.string())
        if name == "found_inf":
            out[name] = _found_inf(values, lines, path)
        elif name in ("step", "tokens", "samples"):
            out[name] = to_int(values, lines, path, raw)
        elif drop_text_columns and name not in METRIC_COLUMNS and not pc.all(
                pc.fill_null(pc.match_substring_regex(values, _NUMBER_OR_EMPTY), True)).as_py():
            continue  # a text or media column in a history export: not a scalar
        else:
            out[name] = to_float(values, lines, path, raw)
    if "step" not in out:
        raise LogFormatError(path, 1, "expected a header with a 'step' column")
    nulls = pc.is_null(out["step"]).to_numpy(zero_copy_only=False)
    if nulls.any():
        raise LogFormatError(path, int(lines[np.flatnonzero(nulls)[0]]), "expected a step in every row")
    return out


def _column_for(raw: str) -> str | None:
    key = raw.strip()
    return key if key in METRIC_COLUMNS else sanitize_name(key)


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    table = read_csv_strings(path)
    if table.num_rows == 0:
        raise LogFormatError(path, None, f"no data rows found in {path}")
    return merge_same_step(ParsedLog(build_table(to_record(table, path, _column_for, 2, False))))


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    return parse_each(paths, parse_file, skip_bad_lines, break_between=False)
