"""Generic CSV: a header row naming record columns (``step`` required), one row per step.

``step,time,loss,grad_norm,loss_scale,lr,found_inf,my_metric``. Record
columns must hold numbers (``found_inf``: true/false/1/0); an empty cell is
null, ``nan``/``inf`` are kept as data; any other column of numbers becomes an
extra scalar (name sanitised to ``[a-z0-9_]``). Named ``csv_log`` so it does
not shadow the standard library's ``csv``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import (
    NUMBER_RE,
    build_table,
    complete_lines,
    empty_to_null,
    merge_same_step,
    parse_each,
    sanitize_name,
    to_float,
    to_int,
)
from runwatch.data.record import METRIC_COLUMNS

_NUMBER_OR_EMPTY = rf"^\s*(?:{NUMBER_RE})?\s*$"
_NUMBER_FULL = f"^{NUMBER_RE}$"
_BOOL = {"true": True, "false": False, "1": True, "0": False, "1.0": True, "0.0": False, "": None}


def sniff(head: str) -> bool:
    """True when the first line is a comma-separated header with a ``step`` column."""
    first = head.split("\n", 1)[0].strip().lower()
    return "," in first and "step" in [c.strip().strip('"') for c in first.split(",")]


def _records(data: bytes) -> tuple[list[str], list[tuple[int, list[str]]], list[tuple[int, int]]]:
    """Header, (line, fields) of each well-formed data record, (line, number of fields) of the others.

    Python's csv module follows quoting as Arrow does and knows each record's
    line; it runs only when Arrow's rows cannot be numbered by counting lines
    (bad rows, blank lines, line breaks inside quoted values).
    """
    header: list[str] = []
    good, bad, start = [], [], 1
    with io.TextIOWrapper(io.BytesIO(data), newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader((line.replace("\0", "") for line in f))
        for record in reader:
            if record and not header:
                header = record
            elif record and len(record) != len(header):
                bad.append((start, len(record)))
            elif record:
                good.append((start, record))
            start = reader.line_num + 1
    return header, good, bad


def read_csv_strings(path: Path, skip_bad_lines: bool = False) -> tuple[pa.Table, np.ndarray, int]:
    """Every cell as a string (so number errors can name their line), each row's file line, rows skipped.

    A row with the wrong number of columns is an error naming its line, or is
    skipped with ``skip_bad_lines``; no error message repeats the row's text.
    """
    data = complete_lines(path.read_bytes(), path)  # a last row cut short is no row (its number may be cut too)
    try:
        end = data.find(b"\n")
        header = (data if end < 0 else data[:end]).decode("utf-8", errors="replace")
        names = next(iter(csv.reader([header.rstrip("\r\n").replace("\r", " ").replace("\0", "")])), [])
        opts = pacsv.ConvertOptions(column_types={n: pa.string() for n in names}, strings_can_be_null=False)
        table = pacsv.read_csv(pa.BufferReader(data), convert_options=opts)
    except (pa.ArrowInvalid, csv.Error) as err:
        return _read_record_by_record(path, data, skip_bad_lines, err)
    if data.count(b"\n") + (not data.endswith(b"\n")) == table.num_rows + 1:
        return table, np.arange(table.num_rows) + 2, 0
    _, good, _ = _records(data)  # blank lines or quoted line breaks: number the rows exactly
    lines = np.array([line for line, _ in good], dtype=np.int64)
    return table, (lines if len(lines) == table.num_rows else np.arange(table.num_rows) + 2), 0


def _read_record_by_record(path: Path, data: bytes, skip_bad_lines: bool,
                           err: Exception) -> tuple[pa.Table, np.ndarray, int]:
    """The slow path after Arrow refused the file (``data``): find the bad rows' lines, skip them or say where."""
    try:
        header, good, bad = _records(data)
    except csv.Error as bad_csv:
        raise LogFormatError(path, None, f"expected a well-formed CSV file ({printable(bad_csv)})") from None
    if not bad:
        raise LogFormatError(path, None, f"expected a well-formed CSV file ({printable(err)})") from None
    if not skip_bad_lines:
        line, width = bad[0]
        raise LogFormatError(path, line, f"expected {len(header)} columns (as in the header), got {width}")
    first = {}
    for i, name in enumerate(header):
        first.setdefault(name, i)  # a repeated header name: its first column, as Arrow would read it
    columns = {name: pa.array([fields[i] for _, fields in good], pa.string()) for name, i in first.items()}
    return pa.table(columns), np.array([line for line, _ in good], dtype=np.int64), len(bad)


def printable(err: object, limit: int = 200) -> str:
    """An error text that came with data from the file: one line, control characters escaped, bounded."""
    text = " ".join(str(err).split("\n"))
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= limit else text[:limit] + "..."


def _found_inf(values: pa.Array, lines: np.ndarray, path: Path) -> pa.Array:
    out = []
    for i, v in enumerate(values.to_pylist()):
        key = (v or "").strip().lower()
        if key not in _BOOL:
            raise LogFormatError(path, int(lines[i]), f"expected true/false/1/0 for 'found_inf', got {printable(v)!r}")
        out.append(_BOOL[key])
    return pa.array(out, pa.bool_())


def _bad_cells(values: pa.Array, name: str) -> np.ndarray:
    """Mask of the cells ``to_record`` would reject for column ``name`` (what --skip-bad-lines drops)."""
    if name == "found_inf":
        keys = pc.utf8_lower(pc.utf8_trim_whitespace(values)).to_pylist()
        return np.array([(k or "") not in _BOOL for k in keys], dtype=bool)
    trimmed = empty_to_null(pc.utf8_trim_whitespace(values))
    try:
        floats = pc.cast(trimmed, pa.float64()).to_numpy(zero_copy_only=False)
        bad = np.zeros(len(values), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        ok = pc.fill_null(pc.match_substring_regex(trimmed, _NUMBER_FULL), True).to_numpy(zero_copy_only=False)
        bad = ~ok
        floats = pc.cast(pc.if_else(pa.array(ok), trimmed, pa.scalar(None, trimmed.type)),
                         pa.float64()).to_numpy(zero_copy_only=False)
    if name in ("step", "tokens", "samples"):
        null = pc.is_null(trimmed).to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):
            bad |= ~null & (np.isnan(floats) | ~np.isfinite(floats) | (floats != np.floor(floats))
                            | (np.abs(floats) > 2**62))
        if name == "step":
            bad |= null
    return bad


def to_record(table: pa.Table, path: Path, column_for: Callable[[str], str | None], lines: np.ndarray,
              drop_text_columns: bool, skip_bad_lines: bool = False) -> tuple[dict[str, pa.Array], int]:
    """Columns of the record from a table of strings, and rows skipped; ``column_for`` maps a header to a column.

    ``lines`` is each row's line in the file. With ``skip_bad_lines`` a row
    with a cell its column cannot hold is dropped and counted instead of
    being an error.
    """
    plan: list[tuple[str, str, pa.Array]] = []
    for raw in table.column_names:
        name = column_for(raw)
        if name is None or name in (n for _, n, _ in plan):
            continue
        values = table[raw].combine_chunks()
        if values.type != pa.string():
            values = pc.cast(values, pa.string())
        if drop_text_columns and name not in METRIC_COLUMNS and not pc.all(
                pc.fill_null(pc.match_substring_regex(values, _NUMBER_OR_EMPTY), True)).as_py():
            continue  # a text or media column in a history export: not a scalar
        plan.append((raw, name, values))
    if "step" not in (n for _, n, _ in plan):
        raise LogFormatError(path, 1, "expected a header with a 'step' column")
    num_skipped = 0
    if skip_bad_lines and table.num_rows:
        bad = np.zeros(table.num_rows, dtype=bool)
        for _, name, values in plan:
            bad |= _bad_cells(values, name)
        if bad.any():
            keep = pa.array(~bad)
            plan = [(raw, name, values.filter(keep)) for raw, name, values in plan]
            lines, num_skipped = lines[~bad], int(bad.sum())
    out: dict[str, pa.Array] = {}
    for raw, name, values in plan:
        if name == "found_inf":
            out[name] = _found_inf(values, lines, path)
        elif name in ("step", "tokens", "samples"):
            out[name] = to_int(values, lines, path, printable(raw))
        else:
            out[name] = to_float(values, lines, path, printable(raw))
    nulls = pc.is_null(out["step"]).to_numpy(zero_copy_only=False)
    if nulls.any():
        raise LogFormatError(path, int(lines[np.flatnonzero(nulls)[0]]), "expected a step in every row")
    return out, num_skipped


def _column_for(raw: str) -> str | None:
    key = raw.strip()
    return key if key in METRIC_COLUMNS else sanitize_name(key)


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    table, lines, num_invalid = read_csv_strings(path, skip_bad_lines)
    if table.num_rows == 0:
        raise LogFormatError(path, None, f"no data rows found in {path}")
    columns, num_skipped = to_record(table, path, _column_for, lines, False, skip_bad_lines)
    return merge_same_step(ParsedLog(build_table(columns), num_skipped=num_invalid + num_skipped))


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    return parse_each(paths, parse_file, skip_bad_lines, break_between=False)
